//! The sink: the HTTP endpoint the relays deliver to (through the sink's fault proxy). It
//! records every delivery in the history as it arrives, before answering 200, so a delivery
//! whose answer is lost on the way back is recorded, and its redelivery too.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

use crate::history::{History, Record};

/// What the drain watches: which keys reached the sink, and how many deliveries.
#[derive(Default)]
pub struct SinkSeen {
    pub keys: Mutex<HashSet<String>>,
    pub deliveries: AtomicU64,
}

struct SinkState {
    history: History,
    seen: Arc<SinkSeen>,
}

/// Serves the sink on 127.0.0.1:0 until the process ends; its address.
pub async fn start(history: History, seen: Arc<SinkSeen>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(SinkState { history, seen });
    let router = Router::new()
        .route("/hook", post(receive))
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

async fn receive(
    State(state): State<Arc<SinkState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let idempotency_key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (key, payload_id) = match serde_json::from_slice::<Delivered>(&body) {
        Ok(event) => {
            // A thin event is the change its snapshot event names: one key for both.
            let key = match (&event.object, &event.snapshot_event, &event.soak_key) {
                (_, _, Some(foreign)) => Some(foreign.clone()),
                (Some(object), Some(snapshot), _) if object == "v2.core.event" => {
                    Some(snapshot.clone())
                }
                _ => event.id.clone(),
            };
            let payload_id = event.id.unwrap_or_default();
            match key {
                Some(key) => (key, payload_id),
                None => (
                    format!("unreadable:{}", String::from_utf8_lossy(&body)),
                    payload_id,
                ),
            }
        }
        // Not what the pipeline was given: recorded under a key no post has, so the checker
        // reports it as unexpected.
        Err(_) => (
            format!("unreadable:{}", String::from_utf8_lossy(&body)),
            String::new(),
        ),
    };
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
