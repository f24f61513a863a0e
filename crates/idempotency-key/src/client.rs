//! A retrying HTTP client helper for idempotent operations (the first of the three layers).
//!
//! One key per operation, generated once and sent on every attempt, so the server runs the
//! operation at most once however many attempts it takes. Retries on network errors (including
//! a response lost half way), 5xx, 408, 409 (still in progress) and 429, with exponential
//! backoff and jitter (`backon`), waiting at least as long as `Retry-After` says. Other 4xx
//! are final: the request itself must change, and a reused key would only get 422.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use super::key::IdempotencyKey;
use super::layer::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// Errors of the client helper.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Every attempt failed at the network level.
    #[error("request failed after {attempts} attempts: {source}")]
    Network {
        /// The last error.
        #[source]
        source: reqwest::Error,
        /// Attempts made.
        attempts: u32,
    },
    /// The request could not be built (bad URL etc.); not retried.
    #[error("request could not be built: {0}")]
    Build(#[source] reqwest::Error),
    /// The response body was not the expected JSON.
    #[error("response is not the expected JSON: {0}")]
    Decode(#[from] serde_json::Error),
}

/// Retry policy.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: usize,
    /// First backoff delay.
    pub min_delay: Duration,
    /// Longest backoff delay.
    pub max_delay: Duration,
    /// Longest `Retry-After` honoured (a server asking for hours is capped).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 8,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// The final answer of an operation.
#[derive(Debug, Clone)]
pub struct ClientResponse {
    /// Status of the last attempt.
    pub status: StatusCode,
    /// Headers of the last attempt.
    pub headers: HeaderMap,
    /// Body of the last attempt.
    pub body: Bytes,
    /// Attempts made (1 = no retry).
    pub attempts: u32,
    /// The key used on every attempt.
    pub key: IdempotencyKey,
}

impl ClientResponse {
    /// Whether the server answered with a stored result.
    pub fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes() == b"true")
    }

    /// Decodes the body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

/// Retrying client for idempotent operations.
#[derive(Debug, Clone)]
pub struct IdempotentClient {
    http: reqwest::Client,
    policy: RetryPolicy,
}

impl IdempotentClient {
    /// Wraps a reqwest client (set its per-attempt timeout there).
    pub fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            policy: RetryPolicy::default(),
        }
    }

    /// Replaces the retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A fresh key for a new operation (UUID v4).
    pub fn new_key() -> IdempotencyKey {
        IdempotencyKey::generate()
    }

    /// Runs one operation: `make` builds the request for each attempt; the key header is added.
    pub async fn send<F>(
        &self,
        key: &IdempotencyKey,
        make: F,
    ) -> Result<ClientResponse, ClientError>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let mut backoff = ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(self.policy.min_delay)
            .with_max_delay(self.policy.max_delay)
            .with_max_times(self.policy.max_retries)
            .build();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let outcome = self.attempt(key, &make).await;
            let retry_after = match &outcome {
                Ok(resp) if !retryable(resp.status) => None,
                Ok(resp) => Some(retry_after(&resp.headers)),
                Err(e) if e.is_builder() => None,
                Err(_) => Some(None),
            };
            let Some(retry_after) = retry_after else {
                return finish(outcome, key, attempts);
            };
            let Some(delay) = backoff.next() else {
                return finish(outcome, key, attempts);
            };
            let delay = match retry_after {
                Some(ra) => delay.max(ra.min(self.policy.max_retry_after)),
                None => delay,
            };
            match &outcome {
                Ok(r) => {
                    tracing::debug!(status = %r.status, ?delay, attempts, "retrying idempotent request")
                }
                Err(e) => {
                    tracing::debug!(error = %e, ?delay, attempts, "retrying idempotent request")
                }
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// POSTs JSON as one operation with a fresh key, optionally with a bearer token.
    pub async fn post_json<T: serde::Serialize + ?Sized>(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: &T,
    ) -> Result<ClientResponse, ClientError> {
        let key = Self::new_key();
        self.post_json_with_key(url, bearer, body, &key).await
    }

    /// POSTs JSON as one operation with the caller's key (e.g. one passed down from upstream).
    pub async fn post_json_with_key<T: serde::Serialize + ?Sized>(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: &T,
        key: &IdempotencyKey,
    ) -> Result<ClientResponse, ClientError> {
        let body = serde_json::to_vec(body)?;
        self.send(key, |c| {
            let mut rb = c
                .post(url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(b) = bearer {
                rb = rb.bearer_auth(b);
            }
            rb
        })
        .await
    }

    async fn attempt<F>(&self, key: &IdempotencyKey, make: &F) -> Result<Raw, reqwest::Error>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let resp = make(&self.http)
            .header(IDEMPOTENCY_KEY, key.to_header_value())
            .send()
            .await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        // Reading the body is part of the attempt: a response cut off here is a lost response.
        let body = resp.bytes().await?;
        Ok(Raw {
            status,
            headers,
            body,
        })
    }
}

struct Raw {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

fn finish(
    outcome: Result<Raw, reqwest::Error>,
    key: &IdempotencyKey,
    attempts: u32,
) -> Result<ClientResponse, ClientError> {
    match outcome {
        Ok(r) => Ok(ClientResponse {
            status: r.status,
            headers: r.headers,
            body: r.body,
            attempts,
            key: key.clone(),
        }),
        Err(e) if e.is_builder() => Err(ClientError::Build(e)),
        Err(source) => Err(ClientError::Network { source, attempts }),
    }
}

/// Statuses worth retrying with the same key.
pub fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// `Retry-After` as delay-seconds or an HTTP-date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            http::header::RETRY_AFTER,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn which_statuses_retry() {
        for s in [500, 502, 503, 504, 408, 409, 429] {
            assert!(retryable(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [200, 201, 400, 401, 402, 404, 422] {
            assert!(!retryable(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }
}
