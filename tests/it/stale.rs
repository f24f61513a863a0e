//! The stale-event guard through the real binary: with `[consumer.stale_guard]` on, `updated`
//! events for one object handled in the order 10:00:09, 10:00:05, 10:00:12 reach the sink as
//! the first and the third only; the second is listed by `dedup-worker events stale` with the
//! event that made it stale; an equal version, other objects and other types are untouched.
//! With the guard off (the default) all three arrive. Thin events (event notifications, whose
//! `created` is RFC 3339 and whose object is their `related_object`) are guarded among their
//! snapshot siblings, in either order.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{cli_json_lines, file_sink_ids, post_signed, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_stale_test";
/// 10:00:00 on some day, as Stripe's `created`.
const TEN: i64 = 1_796_119_200;

fn event(id: &str, event_type: &str, object: &str, created: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "created": created,
        "type": event_type,
        "data": {"object": {"id": object, "object": "subscription", "status": "active"}}
    }))
    .expect("serialize")
}

const UPDATED: &str = "customer.subscription.updated";

/// The thin event (event notification) of the change `snapshot` names, as Stripe sends it: its
/// own id (`<snapshot>_thin`), `created` as RFC 3339 with milliseconds, its object as
/// `related_object`, and no `data`.
fn thin_event(snapshot: &str, event_type: &str, object: &str, created: i64) -> Vec<u8> {
    let time = chrono::DateTime::from_timestamp(created, 0)
        .expect("a time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    serde_json::to_vec(&json!({
        "id": format!("{snapshot}_thin"),
        "object": "v2.core.event",
        "type": format!("v1.{event_type}"),
        "created": time,
        "snapshot_event": snapshot,
        "related_object": {"id": object, "type": "subscription", "url": format!("/v1/subscriptions/{object}")}
    }))
    .expect("serialize")
}

/// Posts each event and waits until the consumer has processed it before the next, so they are
/// handled in this order.
async fn post_in_order(bin: &RunningBinary, db: &TestDb, events: &[(&str, &str, &str, i64)]) {
    let bodies: Vec<_> = events
        .iter()
        .map(|(id, event_type, object, created)| {
            (id.to_string(), event(id, event_type, object, *created))
        })
        .collect();
    post_bodies_in_order(bin, db, bodies).await;
}

/// Posts each `(dedup key, body)` and waits until the consumer has processed its key before
/// the next.
async fn post_bodies_in_order(bin: &RunningBinary, db: &TestDb, bodies: Vec<(String, Vec<u8>)>) {
    let client = reqwest::Client::new();
    let store = db.store().await;
    for (id, body) in bodies {
        let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        bin.wait_for(&format!("{id} processed"), Duration::from_secs(30), || {
            let (store, id) = (store.clone(), id.clone());
            async move {
                let processed = store.dedup().processed_among("stripe", &[id]).await.ok()?;
                (!processed.is_empty()).then_some(())
            }
        })
        .await;
    }
}

fn start(
    db: &TestDb,
    sink: &std::path::Path,
    work: &std::path::Path,
    guard: bool,
) -> RunningBinary {
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
    ];
    if guard {
        env.push(("DEDUP_CONSUMER__STALE_GUARD__ENABLED", "true".to_owned()));
    }
    RunningBinary::start(&env, work)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_guard_an_older_update_of_an_object_is_held_back_and_listed_on_sqlite() {
    guard_holds_back_the_older_update(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_guard_an_older_update_of_an_object_is_held_back_and_listed_on_postgres() {
    guard_holds_back_the_older_update(Backend::Postgres).await;
}

async fn guard_holds_back_the_older_update(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = start(&db, &sink, work.path(), true);
    post_in_order(
        &bin,
        &db,
        &[
            ("evt_0909", UPDATED, "sub_1", TEN + 9),
            ("evt_0905", UPDATED, "sub_1", TEN + 5),
            ("evt_0912", UPDATED, "sub_1", TEN + 12),
            // The same version again (another event at the same second): not stale.
            ("evt_0912_same_second", UPDATED, "sub_1", TEN + 12),
            // Another object: its own history.
            ("evt_other_object", UPDATED, "sub_2", TEN + 1),
            // Another type: not guarded.
            ("evt_created", "customer.subscription.created", "sub_1", TEN),
        ],
    )
    .await;
    let expected = [
        "evt_0909",
        "evt_0912",
        "evt_0912_same_second",
        "evt_other_object",
        "evt_created",
    ];
    // Every event is processed; once the outbox has nothing pending, the sink has all it gets.
    let store = db.store().await;
    let mut at_sink: Vec<String> = bin
        .wait_for("the outbox delivered", Duration::from_secs(30), || {
            let (store, sink) = (store.clone(), sink.clone());
            async move {
                let pending = store.outbox().counts().await.ok()?.pending;
                let ids = file_sink_ids(&sink);
                (pending == 0 && ids.len() >= 5).then_some(ids)
            }
        })
        .await;
    at_sink.sort();
    let mut expected_sorted: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    expected_sorted.sort();
    assert_eq!(
        at_sink, expected_sorted,
        "the 10:00:05 update is not forwarded"
    );

    let stale = cli_json_lines(&[("DATABASE_URL", db.url.clone())], &["events", "stale"]);
    assert_eq!(
        stale,
        vec![json!({
            "source": "stripe", "event_id": "evt_0905", "event_type": UPDATED,
            "object_id": "sub_1", "version": TEN + 5,
            "newer_event_id": "evt_0909", "newer_version": TEN + 9,
        })]
    );
    let metrics = reqwest::get(bin.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("dedup_stale_events_total{source=\"stripe\"} 1"),
        "{metrics}"
    );
    drop(bin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_every_update_arrives() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = start(&db, &sink, work.path(), false);
    post_in_order(
        &bin,
        &db,
        &[
            ("evt_0909", UPDATED, "sub_1", TEN + 9),
            ("evt_0905", UPDATED, "sub_1", TEN + 5),
            ("evt_0912", UPDATED, "sub_1", TEN + 12),
        ],
    )
    .await;
    let mut at_sink: Vec<String> = bin
        .wait_for("all three at the sink", Duration::from_secs(30), || {
            let ids = file_sink_ids(&sink);
            async move { (ids.len() >= 3).then_some(ids) }
        })
        .await;
    at_sink.sort();
    assert_eq!(at_sink, ["evt_0905", "evt_0909", "evt_0912"]);
    assert!(cli_json_lines(&[("DATABASE_URL", db.url.clone())], &["events", "stale"]).is_empty());
    drop(bin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_and_snapshot_events_out_of_order_are_guarded_together_on_sqlite() {
    thin_and_snapshot_events_are_guarded_together(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_and_snapshot_events_out_of_order_are_guarded_together_on_postgres() {
    thin_and_snapshot_events_are_guarded_together(Backend::Postgres).await;
}

/// One subscription's changes of 10:00:09 (a snapshot event), 10:00:05 (a thin event: stale),
/// 10:00:12 (a thin event), 10:00:10 (a snapshot event: stale against the thin one), and another
/// change at 10:00:12 (a snapshot event: an equal version, not stale).
async fn thin_and_snapshot_events_are_guarded_together(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = start(&db, &sink, work.path(), true);
    let snapshot = |id: &str, at: i64| (id.to_owned(), event(id, UPDATED, "sub_1", TEN + at));
    let thin = |id: &str, at: i64| (id.to_owned(), thin_event(id, UPDATED, "sub_1", TEN + at));
    post_bodies_in_order(
        &bin,
        &db,
        vec![
            snapshot("evt_0909", 9),
            thin("evt_0905", 5),
            thin("evt_0912", 12),
            snapshot("evt_0910", 10),
            snapshot("evt_0912_same_second", 12),
        ],
    )
    .await;
    let store = db.store().await;
    let mut at_sink: Vec<String> = bin
        .wait_for("the outbox delivered", Duration::from_secs(30), || {
            let (store, sink) = (store.clone(), sink.clone());
            async move {
                let pending = store.outbox().counts().await.ok()?.pending;
                let ids = file_sink_ids(&sink);
                (pending == 0 && ids.len() >= 3).then_some(ids)
            }
        })
        .await;
    at_sink.sort();
    assert_eq!(
        at_sink,
        ["evt_0909", "evt_0912_same_second", "evt_0912_thin"],
        "the 10:00:05 thin event and the 10:00:10 snapshot event are not forwarded"
    );
    let mut stale = cli_json_lines(&[("DATABASE_URL", db.url.clone())], &["events", "stale"]);
    stale.sort_by_key(|held| held["event_id"].as_str().map(str::to_owned));
    let thin_type = format!("v1.{UPDATED}");
    assert_eq!(
        stale,
        vec![
            json!({
                "source": "stripe", "event_id": "evt_0905", "event_type": thin_type,
                "object_id": "sub_1", "version": TEN + 5,
                "newer_event_id": "evt_0909", "newer_version": TEN + 9,
            }),
            json!({
                "source": "stripe", "event_id": "evt_0910", "event_type": UPDATED,
                "object_id": "sub_1", "version": TEN + 10,
                "newer_event_id": "evt_0912", "newer_version": TEN + 12,
            }),
        ]
    );
    drop(bin);
}
