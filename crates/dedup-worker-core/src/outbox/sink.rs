//! Sinks: where the relay delivers outbox rows. One small trait; a spec string picks the kind.
//!
//! Delivery is at least once (a relay can die after delivering and before marking the row), so
//! every sink passes the row's idempotency key along for the receiver to deduplicate again:
//! `Idempotency-Key` (HTTP), `message_id` (AMQP), the `dedup-message-id` attribute and, on FIFO
//! queues, the deduplication id (SQS).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::config::{shown_url, SinkSpec};
use crate::queue::rabbitmq::{ConfirmPublisher, Declare};
use crate::queue::TransportError;
use crate::signature::secrets::{webhook_signature, SigningSecret};
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
    Status { status: u16 },
    /// Redirects are not followed: a 302/303 would re-send the POST as a GET without the event,
    /// and a 2xx to that GET would mark the row dispatched with the event lost.
    #[error("receiver answered {status} redirecting to {location:?}; redirects are not followed, point the sink at the final URL")]
    Redirected { status: u16, location: String },
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

impl SinkError {
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
fn record_delivery(sink: &'static str, took: Duration, result: &Result<(), SinkError>) {
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
async fn timed<F, Fut>(sink: &'static str, row: &OutboxRow, delivery: F) -> Result<(), SinkError>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: Future<Output = Result<(), SinkError>>,
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
fn record_batch(sink: &'static str, started: Instant, results: &[Result<(), SinkError>]) {
    let took = started.elapsed();
    for result in results {
        record_delivery(sink, took, result);
    }
}

#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Delivers every row; the result at index i is row i's.
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>>;
}

/// Builds the sink for a spec. `signing_secrets` sign every HTTP delivery (none: unsigned).
pub async fn build_sink(
    spec: &SinkSpec,
    http_timeout: Duration,
    concurrency: usize,
    signing_secrets: &Arc<[SigningSecret]>,
) -> Result<Box<dyn Sink>, SinkError> {
    Ok(match spec {
        SinkSpec::Log => Box::new(LogSink),
        SinkSpec::File(path) => Box::new(FileSink::new(path.clone())),
        SinkSpec::Http(url) => Box::new(HttpSink::new(
            url.clone(),
            http_timeout,
            concurrency,
            signing_secrets.clone(),
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

/// Publishes to an exchange through the RabbitMQ transport's [`ConfirmPublisher`] (mandatory,
/// with publisher confirms, every wait bounded); routing key = event type, `message_id` =
/// idempotency key. A message no queue is bound for is a failed delivery (retried, then marked
/// failed), not a silent drop.
pub struct AmqpSink {
    exchange: String,
    /// Declares the exchange on each new connection; reconnects after errors.
    publisher: ConfirmPublisher,
}

impl AmqpSink {
    pub fn new(url: String, exchange: String) -> Self {
        AmqpSink {
            publisher: ConfirmPublisher::new(url, Declare::TopicExchange(exchange.clone())),
            exchange,
        }
    }

    async fn publish(&self, row: &OutboxRow, traceparent: Option<String>) -> Result<(), SinkError> {
        let mut properties = lapin::BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(row.idempotency_key.as_str().into())
            .with_type(row.event_type.as_str().into());
        if let Some(traceparent) = traceparent {
            let mut headers = lapin::types::FieldTable::default();
            headers.insert(
                traces::TRACEPARENT.into(),
                lapin::types::AMQPValue::LongString(traceparent.into()),
            );
            properties = properties.with_headers(headers);
        }
        self.publisher
            .publish(&self.exchange, &row.event_type, &row.payload, properties)
            .await
            .map_err(SinkError::Amqp)
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        if let Err(error) = self.publisher.ready().await {
            return rows
                .iter()
                .map(|_| Err(SinkError::Amqp(error.clone())))
                .collect();
        }
        // All publishes go out before any confirm is awaited: the confirms are pipelined.
        let publishes = rows
            .iter()
            .map(|row| timed("amqp", row, |traceparent| self.publish(row, traceparent)));
        futures::future::join_all(publishes).await
    }
}

/// Sends to an SQS queue through the SQS transport's publish (same attributes, so another
/// dedup-worker can consume the queue and deduplicate again).
pub struct SqsSink {
    queue: crate::queue::SqsQueue,
    /// SendMessage calls in flight.
    concurrency: usize,
}

#[async_trait]
impl Sink for SqsSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        use crate::queue::Transport;
        use futures::stream::{self, StreamExt};
        let sends: Vec<_> = rows
            .iter()
            .map(|row| {
                timed("sqs", row, move |traceparent| async move {
                    let message = crate::queue::OutgoingMessage {
                        source: None,
                        message_id: Some(row.idempotency_key.clone()),
                        message_type: Some(row.event_type.clone()),
                        payload: bytes::Bytes::from(row.payload.clone()),
                        traceparent,
                        stripe_signature: None,
                        sender_headers: crate::event::SenderHeaders::default(),
                    };
                    self.queue.publish(message).await.map_err(SinkError::Sqs)
                })
            })
            .collect();
        stream::iter(sends)
            .buffered(self.concurrency)
            .collect()
            .await
    }
}

/// Logs each event.
#[derive(Debug)]
pub struct LogSink;

#[async_trait]
impl Sink for LogSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        let started = Instant::now();
        let results: Vec<_> = rows
            .iter()
            .map(|row| {
                // In the row's span, which carries the event's key and type.
                deliver_span("log", row).in_scope(|| {
                    tracing::info!(
                        idempotency_key = %row.idempotency_key,
                        bytes = row.payload.len(),
                        "event delivered"
                    )
                });
                Ok(())
            })
            .collect();
        record_batch("log", started, &results);
        results
    }
}

/// Appends one JSON line per event: the event JSON made compact (Stripe pretty-prints), or a
/// JSON string when the payload is not JSON. The whole batch is one write and one fsync.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    /// Serialises writers so lines never interleave.
    lock: Mutex<()>,
}

impl FileSink {
    pub fn new(path: PathBuf) -> Self {
        FileSink {
            path,
            lock: Mutex::new(()),
        }
    }

    fn line(row: &OutboxRow) -> Vec<u8> {
        let mut line = match serde_json::from_slice::<serde_json::Value>(&row.payload) {
            Ok(value) => serde_json::to_vec(&value),
            Err(_) => serde_json::to_vec(&String::from_utf8_lossy(&row.payload)),
        }
        .unwrap_or_default();
        line.push(b'\n');
        line
    }
}

#[async_trait]
impl Sink for FileSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        let started = Instant::now();
        // One span a row, lasting as long as the batch's one write.
        let spans: Vec<tracing::Span> = rows.iter().map(|row| deliver_span("file", row)).collect();
        let results = self.write_batch(rows).await;
        drop(spans);
        record_batch("file", started, &results);
        results
    }
}

impl FileSink {
    async fn write_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        let buffer: Vec<u8> = rows.iter().flat_map(Self::line).collect();
        let _guard = self.lock.lock().await;
        let result: Result<(), std::io::Error> = async {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                tokio::fs::create_dir_all(dir).await?;
            }
            let mut file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .await?;
            file.write_all(&buffer).await?;
            file.sync_data().await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => rows.iter().map(|_| Ok(())).collect(),
            Err(e) => {
                let kind = e.kind();
                let message = e.to_string();
                rows.iter()
                    .map(|_| Err(SinkError::Io(std::io::Error::new(kind, message.clone()))))
                    .collect()
            }
        }
    }
}

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
}
