//! The HTTP sink: a POST per event with `Idempotency-Key`, signed as Standard Webhooks when
//! `outbox.signing_secret` is set; with a client certificate (`tls`) and a bearer token
//! (`oauth`, `oauth.rs`) when the sink's receiver asks for them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::answer::Answer;
use super::oauth::{Bearer, TokenSource};
use super::{timed, Receipt, Sink, SinkError};
use crate::config::{read_sink_tls, shown_url, SinkOAuthSettings, SinkTlsSettings};
use crate::outbox::pace::retry_after;
use crate::signature::secrets::{webhook_signature, SigningSecret};
use crate::store::OutboxRow;
use crate::telemetry::traces;

/// POSTs the raw event with `Idempotency-Key: <key>`; any 2xx is success.
pub struct HttpSink {
    url: String,
    client: reqwest::Client,
    /// How much of each answer's body is kept with the attempt (`outbox.response_excerpt_bytes`).
    excerpt_bytes: usize,
    /// Most requests in flight from one batch.
    concurrency: usize,
    /// Standard Webhooks secrets, each adding a signature to every request (`v1,` for a `whsec_`
    /// secret, `v1a,` for a `whsk_` ed25519 key), so the receiving app can check that a delivery
    /// came from this relay; empty: unsigned.
    signing_secrets: Arc<[SigningSecret]>,
    /// A bearer token on every request, fetched through `client`.
    oauth: Option<TokenSource>,
}

/// How a sink's receiver wants the relay to prove who it is, besides signatures
/// (`[outbox.sinks.NAME.tls]`, `[outbox.sinks.NAME.oauth]`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpAuth<'a> {
    pub tls: Option<&'a SinkTlsSettings>,
    pub oauth: Option<&'a SinkOAuthSettings>,
}

/// A sink's `tls` files could not be used when its lane was built (they were at start-up:
/// moved or changed since).
#[derive(Debug, thiserror::Error)]
#[error("tls.{field}: {reason}")]
pub struct TlsFilesError {
    field: &'static str,
    reason: String,
}

/// The URL as [`shown_url`] shows it: a webhook URL's path or query may be its secret.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &shown_url(&self.url))
            .field("concurrency", &self.concurrency)
            .field("signing_secrets", &self.signing_secrets)
            .field("oauth", &self.oauth)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    pub fn new(
        url: String,
        timeout: Duration,
        excerpt_bytes: usize,
        concurrency: usize,
        signing_secrets: Arc<[SigningSecret]>,
        auth: HttpAuth<'_>,
    ) -> Result<Self, SinkError> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            // See `SinkError::Redirected`.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(concurrency);
        if let Some(tls) = auth.tls {
            let tls = read_sink_tls(tls).map_err(|(field, reason)| {
                SinkError::Destination(Arc::new(TlsFilesError { field, reason }))
            })?;
            builder = tls.apply_to(builder);
        }
        let client = builder
            .build()
            .map_err(|error| SinkError::http(&url, error))?;
        let oauth = auth
            .oauth
            .map(|settings| TokenSource::new(client.clone(), settings));
        Ok(HttpSink {
            url,
            client,
            excerpt_bytes: excerpt_bytes.min(super::DRAINED_BODY_BYTES),
            concurrency,
            signing_secrets,
            oauth,
        })
    }

    /// Sends `row`; with OAuth, once more with a fresh token if the receiver answers 401 to the
    /// cached one (revoked or rotated before its time), within this one attempt.
    async fn deliver(
        &self,
        row: &OutboxRow,
        traceparent: Option<String>,
    ) -> Result<Receipt, SinkError> {
        let Some(oauth) = &self.oauth else {
            let response = self.send(row, traceparent, None).await?;
            return self.judge(response).await;
        };
        let token_error = |source| SinkError::Token {
            url: oauth.shown_url(),
            source,
        };
        let bearer = oauth.bearer().await.map_err(token_error)?;
        let response = self.send(row, traceparent.clone(), Some(&bearer)).await?;
        if response.status() != http::StatusCode::UNAUTHORIZED {
            return self.judge(response).await;
        }
        oauth.rejected(&bearer).await;
        let fresh = oauth.bearer().await.map_err(token_error)?;
        let response = self.send(row, traceparent, Some(&fresh)).await?;
        self.judge(response).await
    }

    async fn send(
        &self,
        row: &OutboxRow,
        traceparent: Option<String>,
        bearer: Option<&Bearer>,
    ) -> Result<reqwest::Response, SinkError> {
        let mut request = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &row.idempotency_key)
            .header("Dedup-Event-Type", &row.event_type);
        if let Some(traceparent) = traceparent {
            request = request.header(traces::TRACEPARENT, traceparent);
        }
        if let Some(bearer) = bearer {
            request = request.header(http::header::AUTHORIZATION, bearer.header.clone());
        }
        if !self.signing_secrets.is_empty() {
            // Standard Webhooks: `webhook-id` is the idempotency key, so every retry of a row
            // carries the same one (the receiver deduplicates on it); the timestamp and the
            // signatures are made anew for each attempt, so a retry days later is not refused
            // as a replay outside the receiver's tolerance.
            let timestamp = chrono::Utc::now().timestamp();
            let signature = webhook_signature(
                &self.signing_secrets,
                &row.idempotency_key,
                timestamp,
                &row.payload,
            );
            request = request
                .header("webhook-id", &row.idempotency_key)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature);
        }
        request
            .body(row.payload.clone())
            .send()
            .await
            .map_err(|error| SinkError::http(&self.url, error))
    }

    /// A receiver's answer as the delivery's result: its status and headers decide; its body
    /// is read once, both kept (up to `excerpt_bytes`) and drained for the connection's reuse.
    async fn judge(&self, response: reqwest::Response) -> Result<Receipt, SinkError> {
        let location = response
            .headers()
            .get(http::header::LOCATION)
            // The receiver's text goes into `last_error`: bounded and printable, and shown
            // as a sink URL is (a redirect to another webhook URL carries its token too).
            .map(|value| {
                let location = String::from_utf8_lossy(value.as_bytes());
                crate::event::printable(&shown_url(&location), 512).into_owned()
            })
            .unwrap_or_default();
        let status = response.status();
        let retry_after = (status == http::StatusCode::TOO_MANY_REQUESTS
            || status == http::StatusCode::SERVICE_UNAVAILABLE)
            .then(|| retry_after(response.headers(), std::time::SystemTime::now()))
            .flatten();
        let answer = Answer::read(response, self.excerpt_bytes).await;
        let status = status.as_u16();
        if (200..300).contains(&status) {
            Ok(Receipt {
                answer: Some(answer),
            })
        } else if (300..400).contains(&status) {
            Err(SinkError::Redirected {
                status,
                location,
                answer: Box::new(answer),
            })
        } else if let Some(retry_after) = retry_after {
            Err(SinkError::Throttled {
                status,
                retry_after,
                answer: Box::new(answer),
            })
        } else {
            Err(SinkError::Status {
                status,
                answer: Box::new(answer),
            })
        }
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>> {
        use futures::stream::{self, StreamExt};
        // Futures collected first: a closure in `map` trips the higher-ranked lifetime check of
        // `async_trait`'s Send bound.
        let deliveries: Vec<_> = rows
            .iter()
            .map(|row| timed("http", row, |traceparent| self.deliver(row, traceparent)))
            .collect();
        stream::iter(deliveries)
            .buffered(self.concurrency)
            .collect()
            .await
    }

    fn row_wise(&self) -> bool {
        true
    }
}
