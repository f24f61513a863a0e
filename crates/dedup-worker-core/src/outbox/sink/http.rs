//! The HTTP sink: a POST per event with `Idempotency-Key`, signed as Standard Webhooks when
//! `outbox.signing_secret` is set.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{timed, Sink, SinkError};
use crate::config::shown_url;
use crate::outbox::pace::retry_after;
use crate::signature::secrets::{webhook_signature, SigningSecret};
use crate::store::OutboxRow;
use crate::telemetry::traces;

/// POSTs the raw event with `Idempotency-Key: <key>`; any 2xx is success.
pub struct HttpSink {
    url: String,
    client: reqwest::Client,
    /// Most requests in flight from one batch.
    concurrency: usize,
    /// Standard Webhooks secrets, each adding a signature to every request (`v1,` for a `whsec_`
    /// secret, `v1a,` for a `whsk_` ed25519 key), so the receiving app can check that a delivery
    /// came from this relay; empty: unsigned.
    signing_secrets: Arc<[SigningSecret]>,
}

/// The URL as [`shown_url`] shows it: a webhook URL's path or query may be its secret.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &shown_url(&self.url))
            .field("concurrency", &self.concurrency)
            .field("signing_secrets", &self.signing_secrets)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    pub fn new(
        url: String,
        timeout: Duration,
        concurrency: usize,
        signing_secrets: Arc<[SigningSecret]>,
    ) -> Result<Self, SinkError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            // See `SinkError::Redirected`.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(concurrency)
            .build()
            .map_err(|error| SinkError::http(&url, error))?;
        Ok(HttpSink {
            url,
            client,
            concurrency,
            signing_secrets,
        })
    }

    async fn deliver(&self, row: &OutboxRow, traceparent: Option<String>) -> Result<(), SinkError> {
        let mut request = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &row.idempotency_key)
            .header("Dedup-Event-Type", &row.event_type);
        if let Some(traceparent) = traceparent {
            request = request.header(traces::TRACEPARENT, traceparent);
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
        let response = request
            .body(row.payload.clone())
            .send()
            .await
            .map_err(|error| SinkError::http(&self.url, error))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else if status.is_redirection() {
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
            Err(SinkError::Redirected {
                status: status.as_u16(),
                location,
            })
        } else if let Some(retry_after) = (status == http::StatusCode::TOO_MANY_REQUESTS
            || status == http::StatusCode::SERVICE_UNAVAILABLE)
            .then(|| retry_after(response.headers(), std::time::SystemTime::now()))
            .flatten()
        {
            Err(SinkError::Throttled {
                status: status.as_u16(),
                retry_after,
            })
        } else {
            Err(SinkError::Status {
                status: status.as_u16(),
            })
        }
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
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
