//! The file sink: JSON lines appended to a file, one write and one fsync per batch.

use std::path::PathBuf;
use std::time::Instant;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::{deliver_span, record_batch, Receipt, Sink, SinkError};
use crate::store::OutboxRow;

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
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>> {
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
    async fn write_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>> {
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
            Ok(()) => rows.iter().map(|_| Ok(Receipt::default())).collect(),
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
