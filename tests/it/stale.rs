//! The stale-event guard through the real binary: with `[consumer.stale_guard]` on, `updated`
//! events for one object handled in the order 10:00:09, 10:00:05, 10:00:12 reach the sink as
//! the first and the third only; the second is listed by `dedup-worker events stale` with the
//! event that made it stale; an equal version, other objects and other types are untouched.
//! With the guard off (the default) all three arrive.

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

/// Posts each event and waits until the consumer has processed it before the next, so they are
/// handled in this order.
async fn post_in_order(bin: &RunningBinary, db: &TestDb, events: &[(&str, &str, &str, i64)]) {
    let client = reqwest::Client::new();
    let store = db.store().await;
    for (id, event_type, object, created) in events {
        let body = event(id, event_type, object, *created);
        let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        bin.wait_for(&format!("{id} processed"), Duration::from_secs(30), || {
            let (store, id) = (store.clone(), id.to_string());
            async move {
                let processed = store.processed_among("stripe", &[id]).await.ok()?;
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
        ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "50".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL_MS", "50".to_owned()),
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
                let pending = store.outbox_counts().await.ok()?.pending;
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
