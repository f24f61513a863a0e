//! Sinks: where the relay delivers outbox rows. One small trait; a spec string picks the kind.
//!
//! Delivery is at least once (a relay can die after delivering and before marking the row), so
//! every sink passes the row's idempotency key along for the receiver to deduplicate again:
//! `Idempotency-Key` (HTTP), `message_id` (AMQP), the `dedup-message-id` attribute and, on FIFO
//! queues, the deduplication id (SQS).

mod amqp;
mod answer;
mod file;
mod http;
mod log;
mod oauth;
mod sqs;

pub use amqp::AmqpSink;
pub use answer::{redact, Answer, DRAINED_BODY_BYTES, REDACTED};
pub use file::FileSink;
pub use http::{HttpAuth, HttpSink, TlsFilesError};
pub use log::LogSink;
pub use oauth::TokenError;
pub use sqs::SqsSink;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::config::{shown_url, SinkSpec};
use crate::queue::TransportError;
use crate::signature::secrets::SigningSecret;
use crate::store::OutboxRow;
use crate::telemetry::traces;
use tracing::Instrument;

/// A delivery failed; the relay retries the row with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Shown with its causes (`last_error`, logs): reqwest's own text names only the URL, not
    /// whether the connect was refused, the connection closed or the timeout ran out. The URL
    /// as [`shown_url`] shows it, the error without it (`reqwest::Error::without_url`): a webhook URL's
    /// path or query may be its secret.
    #[error("HTTP request to {url} failed: {}", error_chain(.source))]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("receiver answered {status}")]
    Status {
        status: u16,
        /// What it answered (kept with the attempt).
        answer: Box<Answer>,
    },
    /// No OAuth token for the delivery: the sink's token endpoint (shown as [`shown_url`]
    /// shows URLs) failed or refused. A failed delivery like any other (the breaker counts
    /// it): the receiver cannot be reached without one. Shared by the deliveries that waited on
    /// the same fetch.
    #[error("OAuth token endpoint {url}: {source}")]
    Token {
        url: String,
        #[source]
        source: Arc<TokenError>,
    },
    /// A 429 or 503 with a `Retry-After` we could read: the receiver is alive and said when to
    /// come back. The lane waits that long (bounded by `outbox.max_retry_after`) and the row
    /// spends no attempt.
    #[error("receiver answered {status} asking to retry after {}s", .retry_after.as_secs())]
    Throttled {
        status: u16,
        retry_after: Duration,
        /// What it answered (kept with the attempt).
        answer: Box<Answer>,
    },
    /// Not sent: its lane stopped sending this batch (the receiver asked for time, or the
    /// circuit opened) before its turn. It spends no attempt.
    #[error("not sent: the lane stopped sending this batch")]
    NotSent,
    /// Redirects are not followed: a 302/303 would re-send the POST as a GET without the event,
    /// and a 2xx to that GET would mark the row dispatched with the event lost.
    #[error("receiver answered {status} redirecting to {location:?}; redirects are not followed, point the sink at the final URL")]
    Redirected {
        status: u16,
        location: String,
        /// What it answered (kept with the attempt).
        answer: Box<Answer>,
    },
    #[error("AMQP delivery failed: {0}")]
    Amqp(#[source] TransportError),
    #[error("SQS delivery failed: {0}")]
    Sqs(#[source] TransportError),
    /// The row names a destination that cannot be parsed or built; shared by all its rows.
    #[error("unusable destination: {0}")]
    Destination(#[source] Arc<dyn std::error::Error + Send + Sync>),
    #[error("file write failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A delivery the sink accepted: the receiver's answer when it gave one (HTTP); `None` for
/// the log, file, AMQP and SQS sinks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    /// What the receiver answered.
    pub answer: Option<Answer>,
}

impl SinkError {
    /// The receiver's answer, when the failure is one (a status it answered).
    pub fn answer(&self) -> Option<&Answer> {
        match self {
            SinkError::Status { answer, .. }
            | SinkError::Throttled { answer, .. }
            | SinkError::Redirected { answer, .. } => Some(answer),
            _ => None,
        }
    }

    /// A request to `url` failed: the URL as [`shown_url`] shows it, reqwest's error without
    /// it (`reqwest::Error::without_url`), its causes kept.
    fn http(url: &str, error: reqwest::Error) -> Self {
        SinkError::Http {
            url: shown_url(url),
            source: error.without_url(),
        }
    }
}

/// An error and its sources, `: `-separated.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // hyper and reqwest sometimes repeat their source's text in their own.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Records one row's delivery in `dedup_relay_delivery_seconds{sink, outcome}`.
fn record_delivery(sink: &'static str, took: Duration, result: &Result<Receipt, SinkError>) {
    let outcome = if result.is_ok() {
        "delivered"
    } else {
        "failed"
    };
    metrics::histogram!("dedup_relay_delivery_seconds", "sink" => sink, "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// One row's delivery, timed from its first poll (when a bounded stream of deliveries starts
/// it, not when the batch was handed over) to its answer.
async fn timed<F, Fut>(
    sink: &'static str,
    row: &OutboxRow,
    delivery: F,
) -> Result<Receipt, SinkError>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: Future<Output = Result<Receipt, SinkError>>,
{
    let span = deliver_span(sink, row);
    let traceparent = traces::traceparent_of(&span);
    let started = Instant::now();
    let result = delivery(traceparent).instrument(span).await;
    record_delivery(sink, started.elapsed(), &result);
    result
}

/// The span of one row's delivery: a child of the span of the handler that wrote the row (its
/// `traceparent`), so one trace runs from the webhook to the sink; the sink hands its own
/// `traceparent` on (an HTTP header, an AMQP header, an SQS attribute). Lines logged in it carry
/// the event's key and type.
fn deliver_span(sink: &'static str, row: &OutboxRow) -> tracing::Span {
    let span = tracing::info_span!(
        "deliver",
        otel.kind = "producer",
        sink,
        outbox_id = row.id,
        source = %row.source,
        event_id = %row.event_id,
        event_type = %row.event_type,
    );
    traces::continue_trace(&span, row.traceparent.as_deref());
    span
}

/// A sink that delivers a whole batch at once (one write and fsync): each row took as long as
/// the batch did.
fn record_batch(sink: &'static str, started: Instant, results: &[Result<Receipt, SinkError>]) {
    let took = started.elapsed();
    for result in results {
        record_delivery(sink, took, result);
    }
}

#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Delivers every row; the result at index i is row i's.
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>>;

    /// Whether each row is its own request (HTTP, SQS): the lane then hands rows over one at a
    /// time, its own `concurrency` at once, each admitted by its rate and stopped when the
    /// receiver asks for time or the circuit opens. Otherwise (log, file, AMQP) the batch goes
    /// as one (one write and fsync, pipelined publishes), admitted once.
    fn row_wise(&self) -> bool {
        false
    }
}

/// Builds the sink for a spec. `signing_secrets` sign every HTTP delivery (none: unsigned);
/// `auth` is an HTTP sink's client certificate and OAuth client (others have none);
/// `excerpt_bytes` how much of an HTTP receiver's answer is kept (`outbox.response_excerpt_bytes`).
pub async fn build_sink(
    spec: &SinkSpec,
    http_timeout: Duration,
    excerpt_bytes: usize,
    concurrency: usize,
    signing_secrets: &Arc<[SigningSecret]>,
    auth: HttpAuth<'_>,
) -> Result<Box<dyn Sink>, SinkError> {
    Ok(match spec {
        SinkSpec::Log => Box::new(LogSink),
        SinkSpec::File(path) => Box::new(FileSink::new(path.clone())),
        SinkSpec::Http(url) => Box::new(HttpSink::new(
            url.clone(),
            http_timeout,
            excerpt_bytes,
            concurrency,
            signing_secrets.clone(),
            auth,
        )?),
        SinkSpec::Amqp { url, exchange } => Box::new(AmqpSink::new(url.clone(), exchange.clone())),
        SinkSpec::Sqs(url) => Box::new(SqsSink {
            // Each SendMessage attempt gets the sink's request timeout, as an HTTP POST does.
            queue: crate::queue::SqsQueue::from_env(
                url.clone(),
                Duration::from_secs(30),
                http_timeout,
            )
            .await,
            concurrency,
        }),
    })
}
