//! `dedup-worker backfill` against a stand-in of Stripe's list-events API served by the test
//! (`GET /v1/events` as Stripe documents it: newest first, `limit`, `starting_after`,
//! `created[gte]`, `has_more`, a bearer key): 250 events over 3 pages with a 429 on the way,
//! 50 of them received by webhook before; all 250 reach the sink once, and a second backfill of
//! the same range publishes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::helpers::{file_sink_ids, post_signed, run_cli, serve, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_backfill_test";
const API_KEY: &str = "sk_test_backfill";

/// What the stand-in serves, and how it was asked.
struct StripeStandIn {
    /// Every event, newest first (as Stripe lists them).
    events: Vec<Value>,
    /// Requests for a page after the first; the first of them is answered 429.
    later_pages_asked: AtomicUsize,
    /// Requests answered 429.
    throttled: AtomicUsize,
}

async fn list_events(
    State(api): State<Arc<StripeStandIn>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok())
        != Some(&format!("Bearer {API_KEY}"))
    {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"type": "invalid_request_error"}})),
        )
            .into_response();
    }
    if query.contains_key("starting_after")
        && api.later_pages_asked.fetch_add(1, Ordering::SeqCst) == 0
    {
        api.throttled.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            Json(json!({"error": {"type": "rate_limit_error"}})),
        )
            .into_response();
    }
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(10);
    let since: i64 = query
        .get("created[gte]")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let in_range: Vec<&Value> = api
        .events
        .iter()
        .filter(|e| e["created"].as_i64().unwrap_or(0) >= since)
        .collect();
    let start = match query.get("starting_after") {
        Some(after) => match in_range.iter().position(|e| e["id"] == after.as_str()) {
            Some(i) => i + 1,
            None => return StatusCode::BAD_REQUEST.into_response(),
        },
        None => 0,
    };
    let page: Vec<&Value> = in_range.iter().skip(start).take(limit).copied().collect();
    let has_more = start + page.len() < in_range.len();
    Json(json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}))
        .into_response()
}

/// The summary line a backfill prints last.
fn summary(stdout: &str) -> Value {
    let last = stdout.lines().last().expect("a summary line");
    serde_json::from_str(last).expect("a JSON summary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_publishes_what_webhooks_missed_once_and_a_second_run_nothing() {
    let base = 1_790_000_000_i64;
    let events: Vec<Value> = (0..250)
        .rev()
        .map(|i| {
            json!({
                "id": format!("evt_bf_{i:03}"),
                "object": "event",
                "created": base + i,
                "type": if i % 2 == 0 { "invoice.paid" } else { "customer.updated" },
                "data": {"object": {"id": format!("obj_{i}")}}
            })
        })
        .collect();
    let api = Arc::new(StripeStandIn {
        events: events.clone(),
        later_pages_asked: AtomicUsize::new(0),
        throttled: AtomicUsize::new(0),
    });
    let api_addr = serve(
        Router::new()
            .route("/v1/events", get(list_events))
            .with_state(api.clone()),
    )
    .await;

    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "100".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL_MS", "100".into()),
        ],
        work.path(),
    );
    // 50 of the events arrived by webhook before the outage ended.
    let client = reqwest::Client::new();
    let by_webhook: Vec<&Value> = events
        .iter()
        .filter(|e| e["created"].as_i64().unwrap_or(0) % 5 == 0)
        .collect();
    assert_eq!(by_webhook.len(), 50);
    for event in &by_webhook {
        let body = serde_json::to_vec(event).unwrap();
        let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    bin.wait_for(
        "the 50 webhook events at the sink",
        Duration::from_secs(60),
        || {
            let ids = file_sink_ids(&sink);
            async move { (ids.len() >= 50).then_some(()) }
        },
    )
    .await;

    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_API_BASE", format!("http://{api_addr}")),
        ("STRIPE_API_KEY", API_KEY.to_owned()),
    ];
    let run = |env: Vec<(&'static str, String)>| {
        tokio::task::spawn_blocking(move || {
            run_cli(&env, &["backfill", "--since", &base.to_string()])
        })
    };
    let first = summary(&run(env.clone()).await.unwrap());
    assert_eq!(
        first,
        json!({"listed": 250, "enqueued": 200, "already_processed": 50, "pages": 3}),
    );
    assert_eq!(
        api.throttled.load(Ordering::SeqCst),
        1,
        "one 429 on the way, retried"
    );

    let all: Vec<String> = bin
        .wait_for(
            "all 250 events at the sink",
            Duration::from_secs(60),
            || {
                let ids = file_sink_ids(&sink);
                async move { (ids.len() >= 250).then_some(ids) }
            },
        )
        .await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &all {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(counts.len(), 250, "every event at the sink");
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");

    let second = summary(&run(env).await.unwrap());
    assert_eq!(
        second,
        json!({"listed": 250, "enqueued": 0, "already_processed": 250, "pages": 3}),
        "a second backfill of the same range publishes nothing"
    );
    drop(bin);
}
