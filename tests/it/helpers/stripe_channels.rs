//! Stripe's other shapes of one change, for the tests: thin events (event notifications) beside
//! their snapshot events, EventBridge envelopes, the official library's reading of them, and a
//! stand-in for `GET /v2/core/events/{id}` served by the test.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::signing::run_python;

/// A snapshot event (`"object": "event"`) of an invoice being paid, as Stripe sends it.
pub fn snapshot_event(id: &str, invoice: &str) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2026-10-28.endive",
        "created": 1_796_119_200,
        "type": "invoice.paid",
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": {"id": invoice, "object": "invoice", "status": "paid", "amount_paid": 1999}}
    })
}

/// The thin event (event notification) of the same change, as an event destination with the
/// thin payload sends it: its own `evt_` id, `created` as RFC 3339, the related object, and for
/// a v1 resource the snapshot event's id (`None`: a v2 resource, which has no snapshot).
pub fn thin_event(id: &str, invoice: &str, snapshot: Option<&str>, context: Option<&str>) -> Value {
    let mut event = json!({
        "id": id,
        "object": "v2.core.event",
        "type": "v1.invoice.paid",
        "livemode": false,
        "created": "2026-12-01T10:00:00.000Z",
        "related_object": {"id": invoice, "type": "invoice", "url": format!("/v1/invoices/{invoice}")},
        "reason": {"type": "request", "request": {"id": "req_1", "idempotency_key": "k_1"}}
    });
    if let Some(snapshot) = snapshot {
        event["snapshot_event"] = json!(snapshot);
    }
    if let Some(context) = context {
        event["context"] = json!(context);
    }
    event
}

/// An Amazon EventBridge envelope of `detail`, as an EventBridge rule on Stripe's partner event
/// source puts it on an SQS queue: EventBridge's own `id` (a UUID, new for every put: EventBridge
/// delivers at least once too), and the Stripe event as `detail`.
pub fn eventbridge_envelope(detail: &Value) -> Value {
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": detail["type"],
        "source": "aws.partner/stripe.com/ed_test_61RXSOqEhkF0bG7dr16RXSOiaWSQ1ZCsRMyX3Lb2MKZ2",
        "account": "123456789012",
        "time": "2026-12-01T10:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1::event-source/aws.partner/stripe.com/ed_test_61RX"],
        "detail": detail
    })
}

/// The dedup key of a Stripe event at the sink: a thin event's `snapshot_event`, else its id.
pub fn change_key(event: &Value) -> String {
    let key = match event["object"].as_str() {
        Some("v2.core.event") => event.get("snapshot_event").unwrap_or(&event["id"]),
        _ => &event["id"],
    };
    key.as_str().expect("a string id").to_owned()
}

/// What the official `stripe` library makes of each `(payload, header)` under `secret`: the
/// class name of the verified event (`V1InvoicePaidEventNotification` for a thin event through
/// `StripeClient.parse_event_notification`, `Event` for a snapshot event through
/// `Webhook.construct_event`), or the error it raised.
pub fn stripe_python_parse(secret: &str, items: &[(Vec<u8>, String)]) -> Vec<String> {
    let script = r#"
import json, sys, stripe
req = json.load(sys.stdin)
client = stripe.StripeClient("sk_test_unused")
out = []
for item in req["items"]:
    payload = bytes(item["payload"]).decode("utf-8")
    try:
        if json.loads(payload).get("object") == "v2.core.event":
            parsed = client.parse_event_notification(payload, item["header"], req["secret"])
        else:
            parsed = stripe.Webhook.construct_event(payload, item["header"], req["secret"])
        out.append(type(parsed).__name__)
    except Exception as e:
        out.append(f"error: {e!r}")
json.dump(out, sys.stdout)
"#;
    let request = json!({
        "secret": secret,
        "items": items.iter().map(|(p, h)| json!({"payload": p, "header": h})).collect::<Vec<_>>(),
    });
    serde_json::from_slice(&run_python(script, &request, "stripe-python parsing")).expect("names")
}

/// The official library fetching a thin event's full event (`EventNotification.fetch_event`)
/// from `api_base`, with `api_key`: what the consumer's own request is compared with.
pub fn stripe_python_fetch(
    api_base: &str,
    api_key: &str,
    secret: &str,
    payload: &[u8],
    header: &str,
) {
    let script = r#"
import json, sys, stripe
req = json.load(sys.stdin)
client = stripe.StripeClient(req["key"], base_addresses={"api": req["base"]}, max_network_retries=0)
notification = client.parse_event_notification(bytes(req["payload"]).decode("utf-8"), req["header"], req["secret"])
event = notification.fetch_event()
json.dump(event.id, sys.stdout)
"#;
    let request = json!({
        "base": api_base, "key": api_key, "secret": secret, "payload": payload, "header": header,
    });
    run_python(script, &request, "stripe-python fetch_event");
}

/// How the stand-in answers one event id: its full event, after failing its first requests.
#[derive(Debug, Clone)]
pub struct FullEvent {
    pub body: Value,
    /// The first this many requests are answered 500.
    pub fail_first: usize,
    /// The first this many requests after the failing ones are never answered (the client's
    /// timeout must end them).
    pub hang_first: usize,
}

impl FullEvent {
    pub fn answering(body: Value) -> Self {
        FullEvent {
            body,
            fail_first: 0,
            hang_first: 0,
        }
    }
}

/// One request the stand-in received.
#[derive(Debug, Clone)]
pub struct FetchRequest {
    pub id: String,
    pub authorization: Option<String>,
    pub stripe_context: Option<String>,
    pub stripe_version: Option<String>,
}

/// A stand-in for Stripe's `GET /v2/core/events/{id}`, as its API reference documents it: the
/// event as JSON, a bearer key, `Stripe-Context` for a connected account's event, 404 with an
/// error object for an id it does not know. It records every request.
pub struct EventsApi {
    pub addr: SocketAddr,
    events: Arc<Mutex<HashMap<String, FullEvent>>>,
    requests: Arc<Mutex<Vec<FetchRequest>>>,
}

struct ApiState {
    key: String,
    events: Arc<Mutex<HashMap<String, FullEvent>>>,
    requests: Arc<Mutex<Vec<FetchRequest>>>,
}

impl EventsApi {
    pub async fn start(key: &str) -> Self {
        let events: Arc<Mutex<HashMap<String, FullEvent>>> = Arc::default();
        let requests: Arc<Mutex<Vec<FetchRequest>>> = Arc::default();
        let state = Arc::new(ApiState {
            key: key.to_owned(),
            events: events.clone(),
            requests: requests.clone(),
        });
        let router = Router::new()
            .route("/v2/core/events/{id}", get(retrieve_event))
            .with_state(state);
        EventsApi {
            addr: super::serve(router).await,
            events,
            requests,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn insert(&self, id: &str, answer: FullEvent) {
        self.events
            .lock()
            .expect("lock")
            .insert(id.to_owned(), answer);
    }

    pub fn requests(&self) -> Vec<FetchRequest> {
        self.requests.lock().expect("lock").clone()
    }

    /// Requests for `id` so far.
    pub fn asked(&self, id: &str) -> usize {
        self.requests().iter().filter(|r| r.id == id).count()
    }
}

async fn retrieve_event(
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let attempt = {
        let mut requests = api.requests.lock().expect("lock");
        requests.push(FetchRequest {
            id: id.clone(),
            authorization: header("authorization"),
            stripe_context: header("stripe-context"),
            stripe_version: header("stripe-version"),
        });
        requests.iter().filter(|r| r.id == id).count()
    };
    if header("authorization") != Some(format!("Bearer {}", api.key)) {
        let error = json!({"error": {"type": "invalid_request_error", "code": "unauthorized"}});
        return (StatusCode::UNAUTHORIZED, Json(error)).into_response();
    }
    let Some(answer) = api.events.lock().expect("lock").get(&id).cloned() else {
        let error = json!({"error": {"type": "invalid_request_error", "code": "resource_missing"}});
        return (StatusCode::NOT_FOUND, Json(error)).into_response();
    };
    if attempt <= answer.fail_first {
        let error = json!({"error": {"type": "api_error", "message": "stand-in failure"}});
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(error)).into_response();
    }
    if attempt <= answer.fail_first + answer.hang_first {
        std::future::pending::<()>().await;
    }
    Json(answer.body).into_response()
}
