//! Sinks: where the relay delivers outbox rows. One small trait; a spec string picks the kind.
//!
//! Delivery is at least once (a relay can die after delivering and before marking the row), so
//! every sink passes the row's idempotency key along for the receiver to deduplicate again.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::store::OutboxRow;

/// A parsed `outbox.sink` / `DEDUP_SINK` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    /// Log each event (tracing, level info).
    Log,
    /// Append each event as one JSON line.
    File(PathBuf),
    /// POST each event to the URL.
    Http(String),
}

impl SinkSpec {
    pub fn parse(spec: &str) -> Result<Self, String> {
        if spec == "log" {
            Ok(SinkSpec::Log)
        } else if let Some(path) = spec.strip_prefix("file:") {
            if path.is_empty() {
                return Err("file: needs a path, e.g. file:/var/lib/dedup/events.jsonl".into());
            }
            Ok(SinkSpec::File(PathBuf::from(path)))
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            reqwest::Url::parse(spec).map_err(|e| format!("invalid URL {spec:?}: {e}"))?;
            Ok(SinkSpec::Http(spec.to_owned()))
        } else {
            Err(format!(
                "unsupported sink {spec:?}: expected log, file:PATH or an http(s):// URL \
                 (amqp and SQS sinks are not in this build)"
            ))
        }
    }
}

/// A delivery failed; the relay retries the row with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("HTTP request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("receiver answered {status}")]
    Status { status: u16 },
    #[error("unusable destination: {0}")]
    Destination(String),
    #[error("file write failed: {0}")]
    Io(#[from] std::io::Error),
}

#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Delivers every row; the result at index i is row i's.
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>>;
}

/// Builds the sink for a spec.
pub fn build_sink(
    spec: &SinkSpec,
    http_timeout: Duration,
    concurrency: usize,
) -> Result<Box<dyn Sink>, SinkError> {
    Ok(match spec {
        SinkSpec::Log => Box::new(LogSink),
        SinkSpec::File(path) => Box::new(FileSink::new(path.clone())),
        SinkSpec::Http(url) => Box::new(HttpSink::new(url.clone(), http_timeout, concurrency)?),
    })
}

/// Logs each event.
#[derive(Debug)]
pub struct LogSink;

#[async_trait]
impl Sink for LogSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<(), SinkError>> {
        rows.iter()
            .map(|row| {
                tracing::info!(
                    event_id = %row.event_id,
                    event_type = %row.event_type,
                    idempotency_key = %row.idempotency_key,
                    bytes = row.payload.len(),
                    "event delivered"
                );
                Ok(())
            })
            .collect()
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
#[derive(Debug)]
pub struct HttpSink {
    url: String,
    client: reqwest::Client,
    /// Most requests in flight from one batch.
    concurrency: usize,
}

impl HttpSink {
    pub fn new(url: String, timeout: Duration, concurrency: usize) -> Result<Self, SinkError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(concurrency)
            .build()?;
        Ok(HttpSink {
            url,
            client,
            concurrency,
        })
    }

    async fn deliver(&self, row: &OutboxRow) -> Result<(), SinkError> {
        let response = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &row.idempotency_key)
            .header("Dedup-Event-Type", &row.event_type)
            .body(row.payload.clone())
            .send()
            .await?;
        let status = response.status();
        if status.is_success() {
            Ok(())
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
        let deliveries: Vec<_> = rows.iter().map(|row| self.deliver(row)).collect();
        stream::iter(deliveries)
            .buffered(self.concurrency)
            .collect()
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(SinkSpec::parse("log"), Ok(SinkSpec::Log));
        assert_eq!(
            SinkSpec::parse("file:/tmp/x.jsonl"),
            Ok(SinkSpec::File("/tmp/x.jsonl".into()))
        );
        assert_eq!(
            SinkSpec::parse("http://127.0.0.1:9/hook"),
            Ok(SinkSpec::Http("http://127.0.0.1:9/hook".into()))
        );
        assert!(SinkSpec::parse("file:").is_err());
        assert!(SinkSpec::parse("ftp://x")
            .unwrap_err()
            .contains("unsupported sink"));
    }
}
