//! What the sinks received: an HTTP sink target that records every delivery ([`Receiver`]), the
//! event ids in a file sink, and the check that every acknowledged event reached the sink once.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use tokio::sync::Semaphore;

use super::{serve, RunningBinary};

/// One delivery seen by the [`Receiver`].
#[derive(Debug, Clone)]
pub struct Received {
    pub idempotency_key: Option<String>,
    /// Every header, names lower-case (signatures are checked from them).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// How a [`Receiver`] answers a delivery, from its `Idempotency-Key` (empty if it has none) and
/// how many deliveries with that key arrived so far, this one included.
pub type Answer = fn(&str, usize) -> StatusCode;

/// An HTTP sink target that records every POST to `/hook` on arrival, then answers (after
/// [`Receiver::delay_answers`], if set: a sink that hangs; once [`Receiver::release`]d, if
/// [`Receiver::gated`]): 200, or what its [`Answer`] says.
pub struct Receiver {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Milliseconds each answer waits.
    answer_delay_ms: Arc<AtomicU64>,
    /// A gated receiver's answers wait for a permit (which they give back).
    gate: Option<Arc<Semaphore>>,
}

struct ReceiverState {
    received: Arc<Mutex<Vec<Received>>>,
    answer_delay_ms: Arc<AtomicU64>,
    gate: Option<Arc<Semaphore>>,
    answer: Answer,
}

impl Receiver {
    /// A receiver that answers 200.
    pub async fn start() -> Self {
        Self::start_with(|_, _| StatusCode::OK, None).await
    }

    /// A receiver that answers as `answer` says.
    pub async fn answering(answer: Answer) -> Self {
        Self::start_with(answer, None).await
    }

    /// A receiver that records each delivery at once and answers 200 only after
    /// [`Receiver::release`].
    pub async fn gated() -> Self {
        Self::start_with(|_, _| StatusCode::OK, Some(Arc::new(Semaphore::new(0)))).await
    }

    async fn start_with(answer: Answer, gate: Option<Arc<Semaphore>>) -> Self {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let answer_delay_ms = Arc::new(AtomicU64::new(0));
        let state = Arc::new(ReceiverState {
            received: received.clone(),
            answer_delay_ms: answer_delay_ms.clone(),
            gate: gate.clone(),
            answer,
        });
        let addr = serve(Router::new().route("/hook", post(record)).with_state(state)).await;
        Receiver {
            addr,
            received,
            answer_delay_ms,
            gate,
        }
    }

    /// Requests arriving from now on are recorded, then answered only after `delay`.
    pub fn delay_answers(&self, delay: Duration) {
        self.answer_delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// A [`Receiver::gated`] receiver answers from now on: waiting requests at once.
    pub fn release(&self) {
        let gate = self.gate.as_ref().expect("a gated receiver");
        gate.add_permits(1_000);
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn snapshot(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// The `Idempotency-Key` of every delivery, in order of arrival (empty where none).
    pub fn keys(&self) -> Vec<String> {
        self.snapshot()
            .into_iter()
            .map(|r| r.idempotency_key.unwrap_or_default())
            .collect()
    }
}

async fn record(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let attempt = {
        let mut seen = state.received.lock().expect("lock");
        seen.push(Received {
            idempotency_key: key.clone(),
            headers: headers
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_owned(), value)
                })
                .collect(),
            body,
        });
        seen.iter().filter(|r| r.idempotency_key == key).count()
    };
    let delay = state.answer_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(gate) = &state.gate {
        let _permit = gate.acquire().await.expect("the gate is never closed");
    }
    (state.answer)(key.as_deref().unwrap_or_default(), attempt)
}

/// Event ids in a JSON-lines sink file, one per line (empty if the file does not exist yet).
/// A last line without its newline is being written by the relay as the file is read, and is
/// left for the next read.
pub fn file_sink_ids(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("each sink line is JSON");
            v["id"].as_str().expect("id").to_owned()
        })
        .collect()
}

/// What the file sink may hold besides the acknowledged events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Others {
    /// Nothing: every event posted was acknowledged in the end.
    None,
    /// Events whose acknowledgement the sender never saw (a request that timed out).
    Allowed,
}

/// Waits up to `timeout` until every event of `acked` is at the file sink `sink` and `drained`
/// says nothing is left in flight (a timeout shows what the binary logged), then checks that
/// each event reached the sink once, and that only `others` did besides `acked`.
pub async fn assert_acknowledged_at_the_sink_once<D, Fut>(
    bin: &RunningBinary,
    sink: &Path,
    acked: &HashSet<String>,
    others: Others,
    timeout: Duration,
    drained: D,
) where
    D: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    // Progress, for a failure message: stuck, slow, or dead-lettered by the broker.
    let reported = AtomicUsize::new(usize::MAX);
    bin.wait_for(
        &format!(
            "the {} acknowledged events to reach the sink within {timeout:?}",
            acked.len()
        ),
        timeout,
        || {
            let at_sink: HashSet<String> = file_sink_ids(sink).into_iter().collect();
            let arrived = acked.intersection(&at_sink).count();
            if reported.swap(arrived, Ordering::SeqCst) != arrived {
                eprintln!(
                    "{arrived} of {} acknowledged events at the sink",
                    acked.len()
                );
            }
            let drained = drained();
            async move { (arrived == acked.len() && drained.await).then_some(()) }
        },
    )
    .await;
    let delivered = file_sink_ids(sink);
    let unique: HashSet<String> = delivered.iter().cloned().collect();
    if others == Others::None {
        assert_eq!(
            &unique, acked,
            "the sink holds exactly the acknowledged events"
        );
    }
    assert_eq!(
        delivered.len(),
        unique.len(),
        "each event reached the sink once"
    );
}
