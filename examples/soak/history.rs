//! The history: every operation the driver invoked and how it completed, every delivery the
//! sink received, every fault and phase, one JSON object a line in `history.jsonl`, in the
//! order the driver saw them. The checker reads it back; a person reads it for the keys the
//! checker names. Times are milliseconds since the run started.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::cluster::Lane;
use crate::plan::Shape;

/// How a post completed, as Jepsen classifies operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// 2xx: the ingress says the event is durable.
    Ok,
    /// Certainly not taken: the connection was refused, or a 4xx.
    Fail,
    /// Unknown: a 5xx, a timeout or a dropped connection; it may have been enqueued.
    Info,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Record {
    /// A post sent (attempt 1, 2, … of one planned post).
    Invoke {
        t: u64,
        key: String,
        post: usize,
        copy: u32,
        shape: Shape,
        ingress: usize,
        attempt: u32,
        /// Sent at the same moment as another channel of the same change.
        #[serde(skip_serializing_if = "std::ops::Not::not", default)]
        at_once: bool,
    },
    /// Its answer.
    Complete {
        t: u64,
        key: String,
        post: usize,
        attempt: u32,
        outcome: Outcome,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        status: Option<u16>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<String>,
    },
    /// An attempt of the direct producer's to put a message on a queue itself (a change's second
    /// channel, a foreign message), and how it ended: `ok` once the queue confirmed it, `info`
    /// if the attempt failed (it may have landed; the producer tries again).
    Publish {
        t: u64,
        /// The key the checker counts it under.
        key: String,
        /// A [`crate::workload::DirectKind`]'s name.
        kind: String,
        lane: Lane,
        copy: u32,
        attempt: u32,
        outcome: Outcome,
        /// The id the consumer keys it by, where it is not `key` (a thin event under its own
        /// id): an alias of `key` for the checker.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        keyed_as: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<String>,
    },
    /// A delivery at the sink: the dedup key read from its body, its `Idempotency-Key`, and
    /// the body's own id (a thin event's differs from the key).
    Sink {
        t: u64,
        key: String,
        idempotency_key: Option<String>,
        payload_id: String,
    },
    /// A delivery at the ordered sink (`outbox.sinks.ordered`): the change read from its body
    /// (as for [`Record::Sink`]), its `Idempotency-Key`, the ordering key in its body (none for
    /// a thin event or a foreign message: delivered unordered), and the answer it got.
    OrderedSink {
        t: u64,
        key: String,
        idempotency_key: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        ordering_key: Option<String>,
        status: u16,
    },
    /// A fault's start or end, or something that happened to a process.
    Fault {
        t: u64,
        phase: String,
        kind: String,
        detail: String,
    },
    /// The run's phases: `run`, `drain`, `stop`.
    Phase { t: u64, name: String },
    /// One attempt of an API call behind the Idempotency-Key layer ([`crate::api`]) and its
    /// answer: `status` none for a timeout or a lost connection.
    Api {
        t_sent: u64,
        t: u64,
        tenant: String,
        /// The `Idempotency-Key`.
        key: String,
        /// Index into the plan's API calls.
        call: usize,
        /// 0 the first send, 1 its twin sent at once, 2… its replays.
        stream: u32,
        attempt: u32,
        /// Index into [`crate::cluster::LAYOUT`].
        process: usize,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        status: Option<u16>,
        /// `Idempotent-Replayed: true`.
        #[serde(skip_serializing_if = "std::ops::Not::not", default)]
        replayed: bool,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        body: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<String>,
    },
}

impl Record {
    /// The event key a record is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Record::Invoke { key, .. }
            | Record::Complete { key, .. }
            | Record::Publish { key, .. }
            | Record::Sink { key, .. }
            | Record::OrderedSink { key, .. }
            | Record::Api { key, .. } => Some(key),
            Record::Fault { .. } | Record::Phase { .. } => None,
        }
    }
}

/// Appends records to the history from any task; cheap to clone.
#[derive(Clone)]
pub struct History {
    started: Instant,
    /// The one sender of the writer's channel, shared, so [`HistoryWriter::finish`] can close
    /// it while tasks (the sink's server) still hold handles; records after that are dropped.
    lines: Arc<Mutex<Option<mpsc::UnboundedSender<Record>>>>,
}

/// The task writing the file.
pub struct HistoryWriter {
    lines: Arc<Mutex<Option<mpsc::UnboundedSender<Record>>>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl History {
    pub fn create(path: &Path, started: Instant) -> std::io::Result<(History, HistoryWriter)> {
        let mut file = BufWriter::new(std::fs::File::create(path)?);
        let (lines, mut pending) = mpsc::unbounded_channel::<Record>();
        let writer = tokio::task::spawn_blocking(move || {
            while let Some(record) = pending.blocking_recv() {
                serde_json::to_writer(&mut file, &record)?;
                file.write_all(b"\n")?;
            }
            file.flush()
        });
        let lines = Arc::new(Mutex::new(Some(lines)));
        let history = History {
            started,
            lines: lines.clone(),
        };
        Ok((
            history,
            HistoryWriter {
                lines,
                task: writer,
            },
        ))
    }

    /// Milliseconds since the run started.
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn record(&self, record: Record) {
        // A send fails only after the writer stopped on an I/O error, which `finish` reports.
        if let Some(lines) = &*self.lines.lock().expect("history lock") {
            let _ = lines.send(record);
        }
    }

    pub fn fault(&self, phase: &str, kind: &str, detail: impl Into<String>) {
        self.record(Record::Fault {
            t: self.now(),
            phase: phase.to_owned(),
            kind: kind.to_owned(),
            detail: detail.into(),
        });
    }

    pub fn phase(&self, name: &str) {
        self.record(Record::Phase {
            t: self.now(),
            name: name.to_owned(),
        });
    }
}

impl HistoryWriter {
    /// Closes the history (later records are dropped) and waits until it is written.
    pub async fn finish(self) -> std::io::Result<()> {
        self.lines.lock().expect("history lock").take();
        self.task.await.map_err(std::io::Error::other)?
    }
}

/// Reads a history file back.
pub fn read(path: &Path) -> std::io::Result<Vec<Record>> {
    let file = BufReader::new(std::fs::File::open(path)?);
    let mut records = Vec::new();
    for (n, line) in file.lines().enumerate() {
        let line = line?;
        let record = serde_json::from_str(&line).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} line {}: {e}", path.display(), n + 1),
            )
        })?;
        records.push(record);
    }
    Ok(records)
}
