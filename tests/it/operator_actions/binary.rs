//! The bulk actions through the real binary and its CLI, on both stores, with an HTTP sink
//! that records each delivery's `Idempotency-Key`. On PostgreSQL the relay polls only once a
//! minute: what it delivers after an action within the test's wait, it was woken for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use axum::http::StatusCode;
use dedup_worker_core::store::Store;
use serde_json::{json, Value};

use crate::helpers::app::{dedup_command, RunningBinary};
use crate::helpers::{post_signed_until_not_503, run_cli, stripe_event, Backend, Receiver, TestDb};

const SECRET: &str = "whsec_operator_actions";
const WAIT: Duration = Duration::from_secs(20);

both_stores!(
    outbox_resend_redelivers_a_dispatched_range_under_the_original_keys,
    outbox_retry_failed_delivers_failed_rows_again_once_the_sink_recovered,
);

/// The binary on `db` (a `backend` one), delivering to `receiver`, with `extra`.
fn start(
    db: &TestDb,
    backend: Backend,
    receiver: &Receiver,
    work: &Path,
    extra: &[(&str, &str)],
) -> RunningBinary {
    // PostgreSQL wakes the relay by NOTIFY; SQLite has only the poll.
    let relay_poll = match backend {
        Backend::Postgres => "60s",
        Backend::Sqlite => "100ms",
    };
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_SINK", receiver.url()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", relay_poll.to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    RunningBinary::start(&env, work)
}

/// What the CLI runs with: the store, and a login name for the record.
fn cli_env(db: &TestDb) -> Vec<(&'static str, String)> {
    vec![("DATABASE_URL", db.url.clone()), ("USER", "tester".into())]
}

/// Runs a bulk command; its one-line JSON summary.
fn summary(db: &TestDb, args: &[&str]) -> Value {
    let out = run_cli(&cli_env(db), args);
    assert_eq!(out.lines().count(), 1, "one summary line: {out}");
    serde_json::from_str(&out).expect("the summary is JSON")
}

async fn post_all(bin: &RunningBinary, events: &[(&str, &str)]) {
    let client = reqwest::Client::new();
    for (id, event_type) in events {
        let body = stripe_event(id, event_type);
        let url = bin.url("/webhooks/stripe");
        let response = post_signed_until_not_503(&client, &url, SECRET, body).await;
        assert_eq!(response.status(), 200, "{}", bin.stderr());
    }
}

/// Waits until the outbox counts are (dispatched, failed) and nothing is pending.
async fn outbox_settles(bin: &RunningBinary, store: &Store, dispatched: i64, failed: i64) {
    let what = format!("{dispatched} rows dispatched and {failed} failed");
    bin.wait_for(&what, WAIT, || async {
        let c = store.outbox().counts().await.ok()?;
        (c.pending == 0 && (c.dispatched, c.failed) == (dispatched, failed)).then_some(())
    })
    .await;
}

/// Each event id delivered, with the `Idempotency-Key` of each of its deliveries in order.
fn deliveries(receiver: &Receiver) -> BTreeMap<String, Vec<String>> {
    let mut by_event: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for received in receiver.snapshot() {
        let body: Value = serde_json::from_slice(&received.body).expect("a JSON event");
        let id = body["id"].as_str().expect("an event id").to_owned();
        let key = received.idempotency_key.expect("an Idempotency-Key");
        by_event.entry(id).or_default().push(key);
    }
    by_event
}

/// The newest recorded action, as JSON (its filter parsed).
async fn last_action(store: &Store) -> Value {
    let actions = dedup_worker_core::operator::recent_actions(store, 1)
        .await
        .unwrap();
    let action = actions.first().expect("an action recorded");
    let filter: Value = serde_json::from_str(&action.filter).expect("the filter is JSON");
    json!({"actor": action.actor, "action": action.action, "filter": filter,
           "count": action.count})
}

/// Three invoices dispatched before a midpoint, then three invoices and two refunds after it.
/// `outbox resend --since MID --type invoice.` counts the three later invoices in its dry run
/// (and changes nothing), then delivers exactly those a second time, each under the key of its
/// first delivery; the rest are delivered once. The re-send is recorded.
async fn outbox_resend_redelivers_a_dispatched_range_under_the_original_keys(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let receiver = Receiver::start().await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(&db, backend, &receiver, work.path(), &[]);
    let before = [
        ("evt_a0", "invoice.paid"),
        ("evt_a1", "invoice.paid"),
        ("evt_a2", "invoice.paid"),
    ];
    post_all(&bin, &before).await;
    outbox_settles(&bin, &store, 3, 0).await;
    // The next whole second (the CLI's times are seconds), and a little after it.
    let mid = chrono::Utc::now().timestamp() + 1;
    let wait_ms = (mid * 1000 + 50 - chrono::Utc::now().timestamp_millis()).max(0);
    tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
    let after = [
        ("evt_b0", "invoice.paid"),
        ("evt_b1", "invoice.payment_failed"),
        ("evt_b2", "invoice.paid"),
        ("evt_b3", "charge.refunded"),
        ("evt_b4", "charge.refunded"),
    ];
    post_all(&bin, &after).await;
    outbox_settles(&bin, &store, 8, 0).await;
    let first = deliveries(&receiver);
    assert!(first.values().all(|keys| keys.len() == 1), "{first:?}");
    assert_eq!(first.len(), 8);

    let mid_arg = mid.to_string();
    let args = [
        "outbox", "resend", "--since", &mid_arg, "--type", "invoice.",
    ];
    let dry = summary(&db, &[&args[..], &["--dry-run"]].concat());
    let filter = json!({"type_prefix": "invoice.", "since_ms": mid * 1000});
    let want = json!({"action": "outbox_resend", "dry_run": true, "count": 3, "filter": filter});
    assert_eq!(dry, want);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(deliveries(&receiver), first, "a dry run delivers nothing");
    assert_eq!(store.outbox().counts().await.unwrap().dispatched, 8);

    let done = summary(&db, &args);
    assert_eq!(
        (done["dry_run"].clone(), done["count"].clone()),
        (json!(false), json!(3))
    );
    bin.wait_for("the re-sent rows delivered again", WAIT, || async {
        (receiver.snapshot().len() == 11).then_some(())
    })
    .await;
    outbox_settles(&bin, &store, 8, 0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = deliveries(&receiver);
    let resent: BTreeSet<&str> = ["evt_b0", "evt_b1", "evt_b2"].into();
    for (id, keys) in &second {
        let times = if resent.contains(id.as_str()) { 2 } else { 1 };
        assert_eq!(
            keys.len(),
            times,
            "{id} delivered {times} times: {second:?}"
        );
        assert!(
            keys.iter().all(|k| *k == first[id][0]),
            "{id} under its first key"
        );
    }
    let action = last_action(&store).await;
    let recorded = json!({"actor": "cli (tester)", "action": "outbox_resend",
                          "filter": filter, "count": 3});
    assert_eq!(action, recorded);
}

/// A sink that answers 500 to each key's first delivery, and one attempt allowed: four rows
/// fail. `outbox retry --failed --type charge.` counts the two refunds (dry run, nothing
/// changes), then delivers them again; a second `outbox retry --failed` the two invoices.
async fn outbox_retry_failed_delivers_failed_rows_again_once_the_sink_recovered(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let receiver = Receiver::answering(|_, attempt| match attempt {
        1 => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::OK,
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(
        &db,
        backend,
        &receiver,
        work.path(),
        &[("DEDUP_OUTBOX__MAX_ATTEMPTS", "1")],
    );
    let events = [
        ("evt_r0", "invoice.paid"),
        ("evt_r1", "charge.refunded"),
        ("evt_r2", "invoice.paid"),
        ("evt_r3", "charge.refunded"),
    ];
    post_all(&bin, &events).await;
    outbox_settles(&bin, &store, 0, 4).await;

    let args = ["outbox", "retry", "--failed", "--type", "charge."];
    let dry = summary(&db, &[&args[..], &["--dry-run"]].concat());
    let filter = json!({"type_prefix": "charge."});
    let want = json!({"action": "outbox_retry", "dry_run": true, "count": 2, "filter": filter});
    assert_eq!(dry, want);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.snapshot().len(), 4, "a dry run delivers nothing");

    assert_eq!(summary(&db, &args)["count"], 2);
    outbox_settles(&bin, &store, 2, 2).await;
    let got = deliveries(&receiver);
    for (id, event_type) in events {
        let times = if event_type == "charge.refunded" {
            2
        } else {
            1
        };
        assert_eq!(got[id], vec![id.to_owned(); times], "{id}: {got:?}");
    }
    let recorded = json!({"actor": "cli (tester)", "action": "outbox_retry",
                          "filter": filter, "count": 2});
    assert_eq!(last_action(&store).await, recorded);

    let rest = summary(&db, &["outbox", "retry", "--failed"]);
    assert_eq!(
        (rest["count"].clone(), rest["filter"].clone()),
        (json!(2), json!({}))
    );
    outbox_settles(&bin, &store, 4, 0).await;
    assert!(deliveries(&receiver).values().all(|keys| keys.len() == 2));
}

/// A bulk command that names nothing is a usage error (status 2), before any connection.
#[test]
fn a_bulk_command_that_selects_nothing_is_refused() {
    for args in [
        &["dlq", "redrive"][..],
        &["dlq", "redrive", "--dry-run"],
        &["dlq", "redrive", "1", "--all"],
        &["outbox", "retry"],
        &["outbox", "retry", "--type", "invoice."],
        &["outbox", "resend", "--type", "invoice."],
    ] {
        let out = dedup_command(&[("DATABASE_URL", "sqlite::memory:".into())])
            .args(args)
            .output()
            .expect("run the cli");
        assert_eq!(out.status.code(), Some(2), "{args:?} is refused");
    }
}
