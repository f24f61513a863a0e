//! An HTTP proxy in front of the SQS endpoint that counts each operation's calls and how many
//! of them were in flight at once, and can hold back the short polls (`ReceiveMessage` with
//! `WaitTimeSeconds` 0) before forwarding them.
//!
//! The SDK speaks SQS's JSON protocol (the operation in `X-Amz-Target`); a query-protocol form
//! body with `Action=…` counts too. The emulator checks no signatures, so forwarding to another
//! host is fine. Put [`crate::helpers::fault_proxy::FaultProxy`] behind it to slow every call:
//! the in-flight counts then show which calls overlap.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

    /// From now on, each `ReceiveMessage` that does not wait (a short poll) is held `delay`
    /// before it is forwarded; long polls and every other call pass at once.
    pub fn delay_short_polls(&self, delay: Duration) {
        *self.state.short_poll_delay.lock().unwrap() = delay;
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
    let _in_flight = InFlight::start(&state, operation);
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
        Err(error) => return (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    };
    let status = response.status();
    let mut headers = response.headers().clone();
    for hop in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ] {
        headers.remove(hop);
    }
    match response.bytes().await {
        Ok(body) => (status, headers, body).into_response(),
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    }
}
