//! `dedup-worker backfill` against a stand-in of Stripe's list-events API served by the test
//! (`GET /v1/events` as Stripe documents it: newest first, `limit`, `starting_after`,
//! `created[gte]`, `has_more`, a bearer key): 250 events over 3 pages with a 429 on the way,
//! 50 of them received by webhook before; all 250 reach the sink once, and a second backfill of
//! the same range publishes nothing. And (issue 26) a page past the page limit, one that never
//! ends and one that trickles stop the backfill with an error naming the limit (or the timeout)
//! after the pages before it, with nothing of that page published.

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
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
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

/// What the stand-in answers for a page after the first.
#[derive(Clone, Copy)]
enum LaterPage {
    /// A well-formed page of 100 events, each too large for the consumer: past the page limit,
    /// with its length announced.
    Oversized,
    /// 16 KiB every 10 ms, without end.
    Endless,
    /// 10 bytes every 200 ms, without end: stays far below the size limit.
    Trickling,
}

/// A stand-in whose first page is 100 ordinary events (more to come), and whose later page is
/// `later`. No key check, no filters: the pages are what is under test.
async fn stand_in(later: LaterPage) -> std::net::SocketAddr {
    async fn list(
        State(later): State<LaterPage>,
        Query(query): Query<HashMap<String, String>>,
    ) -> Response {
        if !query.contains_key("starting_after") {
            let page: Vec<Value> = (0..100)
                .map(|i| {
                    json!({"id": format!("evt_page1_{i:03}"), "object": "event",
                                "created": 1_790_000_000 + i, "type": "invoice.paid",
                                "data": {"object": {"id": format!("in_{i}")}}})
                })
                .collect();
            return Json(json!({"object": "list", "has_more": true, "data": page})).into_response();
        }
        let chunks = |size: usize, every: Duration| {
            futures::stream::unfold((), move |()| async move {
                tokio::time::sleep(every).await;
                Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; size])),
                    (),
                ))
            })
        };
        match later {
            LaterPage::Oversized => {
                let padding = "x".repeat(3_000);
                let page: Vec<Value> = (0..100)
                    .map(|i| {
                        json!({"id": format!("evt_page2_{i:03}"), "object": "event",
                                    "created": 1_790_000_000 - i, "type": "invoice.paid",
                                    "data": {"object": {"id": format!("in_{i}"), "memo": padding}}})
                    })
                    .collect();
                Json(json!({"object": "list", "has_more": false, "data": page})).into_response()
            }
            LaterPage::Endless => {
                axum::body::Body::from_stream(chunks(16 * 1024, Duration::from_millis(10)))
                    .into_response()
            }
            LaterPage::Trickling => {
                axum::body::Body::from_stream(chunks(10, Duration::from_millis(200)))
                    .into_response()
            }
        }
    }
    serve(
        Router::new()
            .route("/v1/events", get(list))
            .with_state(later),
    )
    .await
}

/// Runs a backfill against a stand-in answering `later` for its second page, with events of at
/// most 2,000 bytes (a page limit of 100 × 2,000 + 64 KiB = 265,536 bytes): the command fails
/// with `wanted` in its error, after reporting the first page, and the queue holds exactly that
/// page's 100 events: nothing of the bad page was published.
async fn backfill_stops(later: LaterPage, wanted: &str) {
    let api = stand_in(later).await;
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_API_BASE", format!("http://{api}")),
        ("STRIPE_API_KEY", API_KEY.to_owned()),
        ("DEDUP_CONSUMER__MAX_MESSAGE_BYTES", "2000".to_owned()),
    ];
    let out = tokio::task::spawn_blocking(move || {
        crate::helpers::dedup_command(&env)
            .args(["backfill", "--since", "1700000000"])
            .output()
            .expect("run backfill")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the backfill succeeded: {stderr}");
    assert!(
        stderr.contains("backfill: page 1, listed 100, enqueued 100, already processed 0"),
        "{stderr}"
    );
    assert!(stderr.contains(wanted), "{wanted:?} missing from: {stderr}");
    assert!(out.stdout.is_empty(), "no summary line after a failure");
    assert_eq!(store.queue().depth("dedup.events").await.unwrap(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_larger_than_the_limit_stops_the_backfill_naming_the_limit() {
    backfill_stops(
        LaterPage::Oversized,
        "a page of Stripe's events is larger than 265536 bytes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_never_ends_stops_the_backfill_at_the_limit() {
    backfill_stops(
        LaterPage::Endless,
        "a page of Stripe's events is larger than 265536 bytes",
    )
    .await;
}

/// Bounded by the request's timeout (`backfill::REQUEST_TIMEOUT`, 30 s): this test takes that
/// long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_trickles_stops_the_backfill_at_the_request_timeout() {
    backfill_stops(LaterPage::Trickling, "timed out").await;
}
