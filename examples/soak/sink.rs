//! The sink: the HTTP endpoint the relays deliver to (through the sink's fault proxy). It
//! records every delivery in the history as it arrives, before answering, so a delivery whose
//! answer is lost on the way back is recorded, and its redelivery too.
//!
//! Two paths, one receiver (and one proxy, so the sink's faults hit both lanes): `/hook`, the
//! `default` sink, answers 200; [`ORDERED_PATH`], the ordered sink (`outbox.sinks.ordered`),
//! also records each delivery's ordering key and answers 500 to about one delivery in ten
//! ([`ORDERED_FAIL_PERCENT`]), so a key's head is retried while the key's later rows wait.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

use crate::history::{History, Record};

/// The ordered sink's path at the receiver.
pub const ORDERED_PATH: &str = "/ordered";
/// The share of the ordered sink's deliveries answered 500 (by a hash of the delivery's
/// `Idempotency-Key` and how many times it arrived before).
pub const ORDERED_FAIL_PERCENT: u64 = 10;

/// What the drain watches: which keys reached each sink (the ordered one: answered 2xx), and
/// how many deliveries.
#[derive(Default)]
pub struct SinkSeen {
    pub keys: Mutex<HashSet<String>>,
    pub deliveries: AtomicU64,
    pub ordered_keys: Mutex<HashSet<String>>,
    pub ordered_deliveries: AtomicU64,
}

struct SinkState {
    history: History,
    seen: Arc<SinkSeen>,
    /// Per `Idempotency-Key`, how many times it arrived at the ordered sink.
    ordered_arrivals: Mutex<HashMap<String, u64>>,
}

/// Serves the sink on 127.0.0.1:0 until the process ends; its address.
pub async fn start(history: History, seen: Arc<SinkSeen>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(SinkState {
        history,
        seen,
        ordered_arrivals: Mutex::default(),
    });
    let router = Router::new()
        .route("/hook", post(receive))
        .route(ORDERED_PATH, post(receive_ordered))
        .with_state(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// The parts of a delivered Stripe event that name its change.
#[derive(serde::Deserialize)]
struct Delivered {
    #[serde(default)]
    id: Option<String>,
    /// A foreign message's key (the soak's foreign producer writes it into each body).
    #[serde(default)]
    soak_key: Option<String>,
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    snapshot_event: Option<String>,
}

/// The change a delivered body is about (the key the checker counts it under), and the body's
/// own id (a thin event's differs from the key).
fn change_of(body: &[u8]) -> (String, String) {
    let unreadable = || format!("unreadable:{}", String::from_utf8_lossy(body));
    match serde_json::from_slice::<Delivered>(body) {
        Ok(event) => {
            // A thin event is the change its snapshot event names: one key for both.
            let key = match (&event.object, &event.snapshot_event, &event.soak_key) {
                (_, _, Some(foreign)) => Some(foreign.clone()),
                (Some(object), Some(snapshot), _) if object == "v2.core.event" => {
                    Some(snapshot.clone())
                }
                _ => event.id.clone(),
            };
            (key.unwrap_or_else(unreadable), event.id.unwrap_or_default())
        }
        // Not what the pipeline was given: recorded under a key no post has, so the checker
        // reports it as unexpected.
        Err(_) => (unreadable(), String::new()),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn receive(
    State(state): State<Arc<SinkState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let idempotency_key = idempotency_key(&headers);
    let (key, payload_id) = change_of(&body);
    state.seen.deliveries.fetch_add(1, Ordering::SeqCst);
    state
        .seen
        .keys
        .lock()
        .expect("sink lock")
        .insert(key.clone());
    state.history.record(Record::Sink {
        t: state.history.now(),
        key,
        idempotency_key,
        payload_id,
    });
    StatusCode::OK
}

/// The ordered sink: recorded with its ordering key and the answer it gets, before answering.
async fn receive_ordered(
    State(state): State<Arc<SinkState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let idempotency_key = idempotency_key(&headers);
    let (key, _) = change_of(&body);
    let ordering_key = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| match v.pointer(crate::settings::ORDERING_KEY)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
    let arrived_before = {
        let mut arrivals = state.ordered_arrivals.lock().expect("sink lock");
        let count = arrivals
            .entry(idempotency_key.clone().unwrap_or_default())
            .or_default();
        *count += 1;
        *count - 1
    };
    let unlucky = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&idempotency_key, arrived_before).hash(&mut hasher);
        hasher.finish() % 100 < ORDERED_FAIL_PERCENT
    };
    let status = if unlucky {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    state.seen.ordered_deliveries.fetch_add(1, Ordering::SeqCst);
    if !unlucky {
        state
            .seen
            .ordered_keys
            .lock()
            .expect("sink lock")
            .insert(key.clone());
    }
    state.history.record(Record::OrderedSink {
        t: state.history.now(),
        key,
        idempotency_key,
        ordering_key,
        status: status.as_u16(),
    });
    status
}
