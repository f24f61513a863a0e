//! Stripe's HTTP API, as the pipeline calls it: `GET /v1/events` (the backfill) and
//! `GET /v2/core/events/{id}` (a thin event's full event, for the consumer).
//!
//! Every request is bounded by the client's timeout and every answer by a size limit. A 429 is
//! tried again after its `Retry-After` (at most [`RetryPolicy::max_wait`]), a 5xx or a request
//! that failed (refused, reset, timed out) after an exponential backoff with jitter, up to
//! [`RetryPolicy::attempts`] tries; any other answer is returned to the caller at once.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::StatusCode;

use crate::config::Secret;
use crate::retry::backoff_delay;

/// How often and how long one call is tried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included (at least 1).
    pub attempts: u32,
    /// The first backoff; it doubles per try.
    pub base: Duration,
    /// The longest wait between two tries, whatever `Retry-After` asks.
    pub max_wait: Duration,
}

/// Stripe's API with one key; cheap to clone (the HTTP client is shared).
#[derive(Clone)]
pub struct StripeApi {
    client: reqwest::Client,
    /// `stripe.api_base`, without a trailing slash.
    base: String,
    /// `stripe.api_key`, sent as a bearer token.
    key: Secret,
    /// `stripe.api_version`, sent as `Stripe-Version` (the v2 API requires one).
    version: String,
}

/// A call that did not get a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Stripe answered with an error status (after the tries a 429 or 5xx gets).
    #[error("Stripe answered {status} ({attempts} attempts)")]
    Status { status: StatusCode, attempts: u32 },
    /// The request failed every time (refused, reset, timed out).
    #[error("the request to Stripe failed ({attempts} attempts): {source}")]
    Request {
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was larger than the caller accepts.
    #[error("Stripe's answer is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// An id that is not made of what Stripe's ids are made of (never sent).
    #[error("the event id is not a Stripe id (letters, digits, `_`, `-`)")]
    InvalidId,
    /// A `context` that cannot be an HTTP header value (never sent).
    #[error("the event's context is not a Stripe account context (visible ASCII)")]
    InvalidContext,
    /// The answer's body could not be read (the connection broke, a timeout while reading).
    #[error("Stripe's answer could not be read: {0}")]
    Read(#[source] reqwest::Error),
}

impl StripeApi {
    /// A client whose every request (connect, send, read) ends within `timeout`.
    pub fn new(
        base: &str,
        key: Secret,
        version: &str,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        Ok(StripeApi {
            client: reqwest::Client::builder().timeout(timeout).build()?,
            base: base.trim_end_matches('/').to_owned(),
            key,
            version: version.to_owned(),
        })
    }

    /// `GET {base}{path}` with `query` and `headers`, tried as the module docs say; the first
    /// answer that is neither a 429 nor a 5xx (success or not), or the last error.
    pub async fn get(
        &self,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, &str)],
        policy: RetryPolicy,
    ) -> Result<reqwest::Response, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self
                .client
                .get(&url)
                .bearer_auth(self.key.expose())
                .header("Stripe-Version", &self.version)
                .query(query);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let (error, retry_after) = match request.send().await {
                Ok(response)
                    if response.status() == StatusCode::TOO_MANY_REQUESTS
                        || response.status().is_server_error() =>
                {
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let status = response.status();
                    (
                        ApiError::Status {
                            status,
                            attempts: attempt,
                        },
                        retry_after,
                    )
                }
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    return Err(ApiError::Status {
                        status: response.status(),
                        attempts: attempt,
                    })
                }
                Err(source) => (
                    ApiError::Request {
                        attempts: attempt,
                        source,
                    },
                    None,
                ),
            };
            if attempt >= policy.attempts.max(1) {
                return Err(error);
            }
            let wait = retry_after
                .unwrap_or_else(|| backoff_delay(policy.base, policy.max_wait, attempt))
                .min(policy.max_wait);
            tracing::warn!(%error, path, ?wait, attempt, "Stripe API call: trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// [`StripeApi::get`], then the answer's body, refused past `max_bytes` (before reading
    /// any of it when its length is announced, else as soon as it grows past the limit: a body
    /// that never ends is cut off there, one that trickles by the client's timeout).
    pub async fn get_limited(
        &self,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, &str)],
        policy: RetryPolicy,
        max_bytes: usize,
    ) -> Result<Bytes, ApiError> {
        let response = self.get(path, query, headers, policy).await?;
        read_limited(response, max_bytes).await
    }

    /// A thin event's full event, `GET /v2/core/events/{id}`, as Stripe sent it (at most
    /// `max_bytes`). `context` is the thin event's `context`, sent as `Stripe-Context` so the
    /// event of a connected account is found.
    pub async fn fetch_v2_event(
        &self,
        id: &str,
        context: Option<&str>,
        max_bytes: usize,
        policy: RetryPolicy,
    ) -> Result<Bytes, ApiError> {
        if !is_plain_id(id) {
            return Err(ApiError::InvalidId);
        }
        let path = format!("/v2/core/events/{id}");
        let mut headers = Vec::with_capacity(1);
        if let Some(context) = context.filter(|c| !c.is_empty()) {
            // `acct_…` or a path of them (`acct_1/acct_2`): a value with a line break or a
            // control character would fail the request on every try, or split the header.
            if !context.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ApiError::InvalidContext);
            }
            headers.push(("Stripe-Context", context));
        }
        self.get_limited(&path, &[], &headers, policy, max_bytes)
            .await
    }
}

/// The body of `response`, refused past `limit` bytes (before reading it all when the length
/// is announced).
async fn read_limited(mut response: reqwest::Response, limit: usize) -> Result<Bytes, ApiError> {
    if response
        .content_length()
        .is_some_and(|len| len > limit as u64)
    {
        return Err(ApiError::TooLarge { limit });
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(ApiError::Read)? {
        if body.len() + chunk.len() > limit {
            return Err(ApiError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Whether `id` is made only of what Stripe's ids are made of (`evt_test_65R9…`): letters,
/// digits, `_` and `-`. Anything else could leave its path segment (`..`, `/`, `?`, `#`, or
/// their percent-encodings, which URL parsers normalise), so it is never sent.
fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_sent() {
        assert!(is_plain_id(
            "evt_test_65R9Ijk8Z4DKIq1FN3e16RYsK3YaSQJ3RUmbFsqs0Ig"
        ));
        for odd in [
            "", "..", "%2e%2e", "evt/../x", "evt?x=1", "evt#", "évt", "evt 1",
        ] {
            assert!(!is_plain_id(odd), "{odd}");
        }
    }
}
