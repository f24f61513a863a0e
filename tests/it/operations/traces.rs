//! Traces through the real binary, exported over OTLP/HTTP (JSON) to a collector stand-in run by
//! the test: one event's spans (receive, enqueue, handle, deliver) share one trace id, on the
//! database queue and on RabbitMQ; a sender's `traceparent` is continued; the HTTP sink's
//! request carries the trace on; a `traceparent` that is not one is dropped (a new trace). The
//! binary runs with `RUST_LOG=warn` (the harness's default): quiet logs keep their traces.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

use crate::helpers::{
    serve, sqs_turn, stripe_event, Backend, Receiver, RunningBinary, SqsLoad, TestDb, TestQueue,
    Transport,
};

const SECRET: &str = "whsec_traces_test";

/// One exported span: what the test reads of OTLP's JSON encoding.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// Its `event_id` attribute (the span fields become attributes), if any.
    event_id: Option<String>,
}

/// An OTLP/HTTP collector stand-in: `POST /v1/traces` with the JSON encoding, every span kept.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

async fn export(
    State(spans): State<Arc<Mutex<Vec<Span>>>>,
    body: axum::body::Bytes,
) -> &'static str {
    let request: Value = serde_json::from_slice(&body).expect("OTLP JSON");
    let mut kept = spans.lock().unwrap();
    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                let event_id = span["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find_map(|a| {
                        (a["key"] == "event_id")
                            .then(|| a["value"]["stringValue"].as_str().map(str::to_owned))
                            .flatten()
                    });
                kept.push(Span {
                    name: text("name"),
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent_span_id: text("parentSpanId"),
                    event_id,
                });
            }
        }
    }
    "{}"
}

impl Collector {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let router = Router::new()
            .route("/v1/traces", post(export))
            .with_state(spans.clone());
        let addr = serve(router).await;
        Collector {
            url: format!("http://{addr}"),
            spans,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// The pipeline's spans of one event: `receive` and `handle` and `deliver` carry its id;
/// `enqueue` is the child of its `receive`.
fn spans_of(spans: &[Span], event_id: &str) -> Vec<Span> {
    let own: Vec<&Span> = spans
        .iter()
        .filter(|s| s.event_id.as_deref() == Some(event_id))
        .collect();
    let mut found: Vec<Span> = own.iter().map(|s| (*s).clone()).collect();
    for receive in own.iter().filter(|s| s.name == "receive") {
        found.extend(
            spans
                .iter()
                .filter(|s| s.name == "enqueue" && s.parent_span_id == receive.span_id)
                .cloned(),
        );
    }
    found
}

const STAGES: [&str; 4] = ["receive", "enqueue", "handle", "deliver"];

async fn one_trace_per_event(transport: Transport) {
    let collector = Collector::start().await;
    let sink = Receiver::start().await;
    let db = TestDb::new(Backend::Sqlite).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("DEDUP_TRANSPORT", queue.kind().to_owned()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("DEDUP_SINK", sink.url()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    // A sender's trace, continued; none (a new trace); and one that is not a traceparent
    // (dropped, so a new trace too, never stored or forwarded as sent).
    let sender = "4bf92f3577b34da6a3ce929d0e0e4736";
    // Events whose first post was answered 503 (a publish slower than its timeout on a loaded
    // machine) and posted again, as a sender would: the first attempt may have landed too, its
    // receive span in a trace of its own.
    let mut retried = Vec::new();
    for (id, traceparent) in [
        (
            "evt_trace_sent",
            Some(format!("00-{sender}-00f067aa0ba902b7-01")),
        ),
        ("evt_trace_new", None),
        ("evt_trace_odd", Some("00-zz-zz-01".to_owned())),
    ] {
        let body = stripe_event(id, "invoice.paid");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let header = dedup_worker_core::signature::stripe::signature_header(
                SECRET,
                crate::helpers::now(),
                &body,
            );
            let mut request = client
                .post(&url)
                .header("Stripe-Signature", header)
                .body(body.clone());
            if let Some(traceparent) = &traceparent {
                request = request.header("traceparent", traceparent);
            }
            let status = request.send().await.unwrap().status();
            if status != 503 || std::time::Instant::now() > deadline {
                assert_eq!(status, 200, "{id}");
                break;
            }
            retried.push(id);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let spans = bin
        .wait_for(
            "each event's four spans at the collector",
            Duration::from_secs(60),
            || {
                let spans = collector.spans();
                async move {
                    let done = ["evt_trace_sent", "evt_trace_new", "evt_trace_odd"]
                        .iter()
                        .all(|id| {
                            let names: Vec<String> =
                                spans_of(&spans, id).into_iter().map(|s| s.name).collect();
                            STAGES.iter().all(|stage| names.iter().any(|n| n == stage))
                        });
                    done.then_some(spans)
                }
            },
        )
        .await;
    let mut traces = Vec::new();
    for id in ["evt_trace_sent", "evt_trace_new", "evt_trace_odd"] {
        let mut of_event = spans_of(&spans, id);
        if retried.contains(&id) {
            // Only the trace the event was handled in: an attempt answered 503 that landed
            // anyway is a duplicate, received in a trace of its own and never handled.
            let handled = of_event.iter().find(|s| s.name == "handle").unwrap();
            let trace_id = handled.trace_id.clone();
            of_event.retain(|s| s.trace_id == trace_id);
        }
        let trace_id = &of_event[0].trace_id;
        assert!(
            of_event.iter().all(|s| &s.trace_id == trace_id),
            "{id}: one trace: {of_event:#?}"
        );
        // Each stage's parent is the stage before it.
        let stage = |name: &str| of_event.iter().find(|s| s.name == name).unwrap().clone();
        for pair in STAGES.windows(2) {
            assert_eq!(
                stage(pair[1]).parent_span_id,
                stage(pair[0]).span_id,
                "{id}: {} under {}",
                pair[1],
                pair[0]
            );
        }
        traces.push((id, trace_id.clone(), stage("deliver").span_id));
    }
    assert_eq!(traces[0].1, sender, "the sender's trace is continued");
    assert_ne!(traces[1].1, sender);
    assert_ne!(traces[2].1, sender);
    assert_ne!(traces[1].1, traces[2].1, "a trace per event");
    // The sink's requests carry the trace on: the deliver span as their parent.
    let received = sink.snapshot();
    for (id, trace_id, deliver_span) in &traces {
        let request = received
            .iter()
            .find(|r| r.idempotency_key.as_deref() == Some(*id))
            .expect("delivered");
        let traceparent = request
            .headers
            .iter()
            .find(|(k, _)| k == "traceparent")
            .map(|(_, v)| v.clone());
        assert_eq!(
            traceparent,
            Some(format!("00-{trace_id}-{deliver_span}-01")),
            "{id}"
        );
    }
    drop(bin);
    queue.cleanup().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_webhook_to_sink_on_the_database_queue() {
    one_trace_per_event(Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_webhook_to_sink_on_rabbitmq() {
    one_trace_per_event(Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_webhook_to_sink_on_sqs() {
    let _emulator = sqs_turn(SqsLoad::Light).await;
    one_trace_per_event(Transport::Sqs).await;
}
