//! An HTTP proxy in front of the SQS endpoint that counts each operation's calls and how many
//! of them were in flight at once, and can hold back the short polls (`ReceiveMessage` with
//! `WaitTimeSeconds` 0) before forwarding them.
//!
//! The SDK speaks SQS's JSON protocol (the operation in `X-Amz-Target`); a query-protocol form
//! body with `Action=…` counts too. The emulator checks no signatures, so forwarding to another
//! host is fine. It also reads which messages each `ReceiveMessage` handed out and each
//! `DeleteMessageBatch` deleted, and counts redeliveries: a message handed out again, not yet
//! deleted, by a call that started after an earlier call that handed it out had ended. A lease
//! that lapses makes one (so does a give-back). The emulator's races do not: its overlapping
//! receives may hand one message to both, and a receive may hand out a message a delete removes
//! meanwhile.
//!
//! Put [`crate::helpers::fault_proxy::FaultProxy`] behind it to slow every call:
//! the in-flight counts then show which calls overlap.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;

use super::serve;

/// One operation's calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Calls {
    /// Calls forwarded so far.
    pub total: usize,
    /// The most that were in flight at once.
    pub max_in_flight: usize,
    /// Calls not answered with a success (the emulator's error, or none: the proxy's 502).
    pub failed: usize,
    in_flight: usize,
}

pub struct SqsCalls {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

struct ProxyState {
    client: reqwest::Client,
    upstream: String,
    calls: Mutex<HashMap<String, Calls>>,
    /// What was handed out and deleted.
    messages: Mutex<Messages>,
    redeliveries: AtomicUsize,
    /// How long a short poll waits before it is forwarded.
    short_poll_delay: Mutex<Duration>,
}

impl SqsCalls {
    /// A proxy forwarding to the SQS endpoint `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Self {
        let state = Arc::new(ProxyState {
            client: reqwest::Client::new(),
            upstream: upstream.trim_end_matches('/').to_owned(),
            calls: Mutex::new(HashMap::new()),
            messages: Mutex::new(Messages::default()),
            redeliveries: AtomicUsize::new(0),
            short_poll_delay: Mutex::new(Duration::ZERO),
        });
        let addr = serve(Router::new().fallback(forward).with_state(state.clone())).await;
        SqsCalls { addr, state }
    }

    /// The endpoint to give the SDK (`AWS_ENDPOINT_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `operation`'s calls so far (`ReceiveMessage`, `DeleteMessageBatch`, …).
    pub fn calls(&self, operation: &str) -> Calls {
        let calls = self.state.calls.lock().unwrap();
        calls.get(operation).copied().unwrap_or_default()
    }

    /// Messages handed out again after an earlier call that handed them out had ended.
    pub fn redeliveries(&self) -> usize {
        self.state.redeliveries.load(Ordering::SeqCst)
    }

    /// From now on, each `ReceiveMessage` that does not wait (a short poll) is held `delay`
    /// before it is forwarded; long polls and every other call pass at once.
    pub fn delay_short_polls(&self, delay: Duration) {
        *self.state.short_poll_delay.lock().unwrap() = delay;
    }
}

/// The messages seen going by.
#[derive(Default)]
struct Messages {
    /// Each message handed out: when each call that handed it out started and ended.
    handed_out: HashMap<String, Vec<(Instant, Instant)>>,
    /// The message of each receipt handle handed out.
    by_receipt: HashMap<String, String>,
    /// When the first delete of each message deleted started.
    deleted: HashMap<String, Instant>,
}

impl ProxyState {
    /// Records the messages of a `ReceiveMessage` answer `body`, from a call `started` then.
    fn handed_out(&self, body: &[u8], started: Instant) {
        let ended = Instant::now();
        let answer: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let mut messages = self.messages.lock().unwrap();
        for message in answer["Messages"].as_array().into_iter().flatten() {
            let (Some(id), Some(receipt)) = (
                message["MessageId"].as_str(),
                message["ReceiptHandle"].as_str(),
            ) else {
                continue;
            };
            let deleted_meanwhile = messages.deleted.get(id).is_some_and(|at| *at < ended);
            let calls = messages.handed_out.entry(id.to_owned()).or_default();
            if !deleted_meanwhile && calls.iter().any(|(_, end)| *end < started) {
                self.redeliveries.fetch_add(1, Ordering::SeqCst);
            }
            calls.push((started, ended));
            messages
                .by_receipt
                .insert(receipt.to_owned(), id.to_owned());
        }
    }

    /// Records the messages a `DeleteMessageBatch` request `body` deletes, from `started`.
    fn deleting(&self, body: &[u8], started: Instant) {
        let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let mut messages = self.messages.lock().unwrap();
        for entry in request["Entries"].as_array().into_iter().flatten() {
            let Some(receipt) = entry["ReceiptHandle"].as_str() else {
                continue;
            };
            if let Some(id) = messages.by_receipt.get(receipt).cloned() {
                messages.deleted.entry(id).or_insert(started);
            }
        }
    }
}

/// The operation a request calls, and whether it is a short poll.
fn operation(headers: &HeaderMap, body: &[u8]) -> (String, bool) {
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        let name = target.rsplit('.').next().unwrap_or(target).to_owned();
        let wait = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|b| b["WaitTimeSeconds"].as_i64())
            .unwrap_or(0);
        let short = name == "ReceiveMessage" && wait == 0;
        return (name, short);
    }
    let form = String::from_utf8_lossy(body);
    let field = |key: &str| {
        form.split('&')
            .find_map(|pair| pair.strip_prefix(key))
            .map(str::to_owned)
    };
    let name = field("Action=").unwrap_or_else(|| "unknown".to_owned());
    let waits = matches!(field("WaitTimeSeconds=").as_deref(), Some(w) if w != "0");
    let short = name == "ReceiveMessage" && !waits;
    (name, short)
}

/// Counts a call as in flight for as long as it lives.
struct InFlight<'a> {
    state: &'a ProxyState,
    operation: String,
}

impl<'a> InFlight<'a> {
    fn start(state: &'a ProxyState, operation: String) -> Self {
        let mut calls = state.calls.lock().unwrap();
        let entry = calls.entry(operation.clone()).or_default();
        entry.total += 1;
        entry.in_flight += 1;
        entry.max_in_flight = entry.max_in_flight.max(entry.in_flight);
        InFlight { state, operation }
    }

    fn failed(&self) {
        let mut calls = self.state.calls.lock().unwrap();
        if let Some(entry) = calls.get_mut(&self.operation) {
            entry.failed += 1;
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut calls = self.state.calls.lock().unwrap();
        if let Some(entry) = calls.get_mut(&self.operation) {
            entry.in_flight -= 1;
        }
    }
}

async fn forward(
    State(state): State<Arc<ProxyState>>,
    method: Method,
    uri: Uri,
    mut headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (operation, short_poll) = operation(&headers, &body);
    let receive = operation == "ReceiveMessage";
    if operation == "DeleteMessageBatch" {
        state.deleting(&body, Instant::now());
    }
    let in_flight = InFlight::start(&state, operation);
    let started = Instant::now();
    if short_poll {
        let delay = *state.short_poll_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    let upstream = state
        .client
        .request(method, format!("{}{path}", state.upstream))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let response = match upstream {
        Ok(response) => response,
        Err(error) => {
            in_flight.failed();
            return (StatusCode::BAD_GATEWAY, error.to_string()).into_response();
        }
    };
    let status = response.status();
    if !status.is_success() {
        in_flight.failed();
    }
    let mut headers = response.headers().clone();
    for hop in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ] {
        headers.remove(hop);
    }
    match response.bytes().await {
        Ok(body) => {
            if receive && status.is_success() {
                state.handed_out(&body, started);
            }
            (status, headers, body).into_response()
        }
        Err(error) => {
            in_flight.failed();
            (StatusCode::BAD_GATEWAY, error.to_string()).into_response()
        }
    }
}
