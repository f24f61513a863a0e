//! The duplicating SQS receive: an HTTP proxy between the SQS lane's fault proxy and the
//! emulator. It passes every call through unchanged; while the nemesis's `sqs_duplicate` fault
//! is on, it makes one in N of the messages each `ReceiveMessage` hands out visible again at once
//! (`ChangeMessageVisibility` to 0 with the receipt it just handed out), as when a lease runs out
//! while its batch is still being handled: another receive gets the message too, with its own
//! receipt, and the first receiver's later heartbeat and delete carry a stale receipt. The
//! proxy counts the messages it made visible and, seen in a later `ReceiveMessage` answer, the
//! ones received twice: the summary's proof that the fault happened.
//!
//! It reads the AWS JSON protocol (`X-Amz-Target: AmazonSQS.ReceiveMessage`), which the SDK
//! the service uses speaks; other calls are not looked at.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::infra::CALL_TIMEOUT;

pub struct SqsDuplicator {
    pub addr: SocketAddr,
    state: Arc<DupState>,
}

struct DupState {
    /// `http://host:port` of the emulator.
    upstream: String,
    client: reqwest::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    /// 0: off; N: every Nth message handed out is made visible again.
    one_in: AtomicU32,
    handed_out: AtomicU64,
    /// Message ids made visible again and not yet seen in another answer.
    reset: Mutex<HashSet<String>>,
    made_visible: AtomicU64,
    received_twice: AtomicU64,
}

/// What the proxy did, for the summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct DupCounts {
    pub made_visible: u64,
    pub received_twice: u64,
}

impl SqsDuplicator {
    /// Serves on 127.0.0.1:0, forwarding to `upstream` (`http://host:port`).
    pub async fn start(
        upstream: String,
        sqs: aws_sdk_sqs::Client,
        queue_url: String,
    ) -> std::io::Result<SqsDuplicator> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(DupState {
            upstream,
            client: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT * 6)
                .build()
                .map_err(std::io::Error::other)?,
            sqs,
            queue_url,
            one_in: AtomicU32::new(0),
            handed_out: AtomicU64::new(0),
            reset: Mutex::default(),
            made_visible: AtomicU64::new(0),
            received_twice: AtomicU64::new(0),
        });
        let router = Router::new().fallback(forward).with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(SqsDuplicator { addr, state })
    }

    /// Duplicates one in `one_in` messages from now on (0: none).
    pub fn set(&self, one_in: u32) {
        self.state.one_in.store(one_in, Ordering::SeqCst);
    }

    pub fn counts(&self) -> DupCounts {
        DupCounts {
            made_visible: self.state.made_visible.load(Ordering::SeqCst),
            received_twice: self.state.received_twice.load(Ordering::SeqCst),
        }
    }
}

/// Hop-by-hop and framing headers: set again by each side.
fn passed(name: &str) -> bool {
    !matches!(
        name,
        "host" | "content-length" | "connection" | "transfer-encoding" | "keep-alive"
    )
}

async fn forward(
    State(state): State<Arc<DupState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let receive = headers
        .get("x-amz-target")
        .is_some_and(|t| t.as_bytes() == b"AmazonSQS.ReceiveMessage");
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = state
        .client
        .request(method, format!("{}{path}", state.upstream));
    for (name, value) in &headers {
        if passed(name.as_str()) {
            request = request.header(name, value);
        }
    }
    let answer = match request.body(body).send().await {
        Ok(answer) => answer,
        Err(error) => return (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    };
    let status = answer.status();
    let mut reply = HeaderMap::new();
    for (name, value) in answer.headers() {
        if passed(name.as_str()) {
            reply.insert(name, value.clone());
        }
    }
    let Ok(bytes) = answer.bytes().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    if receive && status.is_success() {
        state.look_at_receive(&bytes).await;
    }
    (status, reply, bytes).into_response()
}

impl DupState {
    async fn look_at_receive(&self, answer: &[u8]) {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Received {
            #[serde(default)]
            messages: Vec<Message>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Message {
            message_id: String,
            receipt_handle: String,
        }
        let Ok(received) = serde_json::from_slice::<Received>(answer) else {
            return;
        };
        for message in received.messages {
            if self
                .reset
                .lock()
                .expect("reset")
                .remove(&message.message_id)
            {
                self.received_twice.fetch_add(1, Ordering::SeqCst);
            }
            let one_in = u64::from(self.one_in.load(Ordering::SeqCst));
            let nth = self.handed_out.fetch_add(1, Ordering::SeqCst);
            if one_in == 0 || !nth.is_multiple_of(one_in) {
                continue;
            }
            let visible = self
                .sqs
                .change_message_visibility()
                .queue_url(&self.queue_url)
                .receipt_handle(&message.receipt_handle)
                .visibility_timeout(0)
                .send();
            if let Ok(Ok(_)) = tokio::time::timeout(CALL_TIMEOUT, visible).await {
                self.made_visible.fetch_add(1, Ordering::SeqCst);
                self.reset.lock().expect("reset").insert(message.message_id);
            }
        }
    }
}
