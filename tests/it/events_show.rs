//! `dedup-worker events show ID [--source S] [--json]` through the real binary, on SQLite and
//! PostgreSQL: each outcome, for events driven into it through the running service (signed
//! webhooks, a handler that fails, the stale guard, an HTTP sink that answers 500), read back
//! by the CLI as the report for people and as JSON (parsed, fields checked):
//!
//! * handled: received (the transport's time), handled on delivery 1, its outbox row dispatched
//!   with the delivery time;
//! * deduplicated: posted three times, one handling, two later deliveries counted with the last
//!   one's time;
//! * dead-lettered: a handler failing on every attempt (a trigger refuses its ledger row):
//!   error, attempts, queue; then `dlq redrive` and the fixed handler: handled, and the redrive
//!   listed with the dead letter it was;
//! * stale: held back by the guard, with the newer event; no outbox row;
//! * a failed outbox row: an HTTP sink answering 500, `outbox.max_attempts = 2`: status failed,
//!   2 attempts, the last error;
//! * queued: ingress alone, the event waits in the database queue;
//! * not seen: exit status 3 and "not seen" (an id never sent, and a sent id under another
//!   source).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use dedup_worker_core::store::Store;
use serde_json::{json, Value};

use crate::helpers::app::dedup_command;
use crate::helpers::db::execute;
use crate::helpers::{post_signed, stripe_event, Backend, Receiver, RunningBinary, TestDb};

const SECRET: &str = "whsec_events_show";
const WAIT: Duration = Duration::from_secs(30);
/// 10:00:00 on some day, as Stripe's `created`.
const TEN: i64 = 1_796_119_200;

/// The binary on `db` with a file sink in `work` (or `sink`), quick polls, and `extra`.
fn start(db: &TestDb, work: &Path, sink: Option<String>, extra: &[(&str, &str)]) -> RunningBinary {
    let sink = sink.unwrap_or_else(|| format!("file:{}", work.join("sink.jsonl").display()));
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_SINK", sink),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    RunningBinary::start(&env, work)
}

async fn post(bin: &RunningBinary, body: Vec<u8>) {
    let client = reqwest::Client::new();
    let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
        .await
        .expect("post");
    assert_eq!(r.status(), 200, "the webhook is accepted");
}

/// `dedup-worker events show ARGS…` against `db`: its output (the exit status is the caller's
/// to check).
fn events_show(db: &TestDb, args: &[&str]) -> Output {
    dedup_command(&[("DATABASE_URL", db.url.clone())])
        .args(["events", "show"])
        .args(args)
        .output()
        .expect("run events show")
}

/// The human report for `id` (exit status 0).
fn text(db: &TestDb, id: &str) -> String {
    let out = events_show(db, &[id]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The JSON report for `id` (exit status 0), parsed.
fn report(db: &TestDb, id: &str) -> Value {
    let out = events_show(db, &[id, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    serde_json::from_str(&stdout).expect("the report is JSON")
}

fn at(value: &Value) -> DateTime<Utc> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("a time, got {value}"));
    assert!(text.ends_with('Z'), "UTC: {text}");
    DateTime::parse_from_rfc3339(text)
        .expect("RFC 3339")
        .with_timezone(&Utc)
}

/// Waits until `check` holds for the store's view of the event.
async fn until<F, Fut>(bin: &RunningBinary, what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    bin.wait_for(what, WAIT, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await;
}

async fn processed(store: &Store, id: &str) -> bool {
    store
        .dedup()
        .processed_record("stripe", id)
        .await
        .ok()
        .flatten()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_event_with_its_dispatched_outbox_row_on_sqlite() {
    handled(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_event_with_its_dispatched_outbox_row_on_postgres() {
    handled(Backend::Postgres).await;
}

async fn handled(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(&db, work.path(), None, &[]);
    let store = db.store().await;
    post(&bin, stripe_event("evt_show_handled", "invoice.paid")).await;
    until(&bin, "the outbox row dispatched", || async {
        store
            .outbox()
            .counts()
            .await
            .is_ok_and(|c| c.dispatched == 1)
    })
    .await;

    let r = report(&db, "evt_show_handled");
    assert_eq!(r["outcome"], "handled");
    assert_eq!(r["found"], true);
    assert_eq!(r["source"], "stripe");
    assert_eq!(r["event_type"], "invoice.paid");
    let handled_at = at(&r["processed"]["at"]);
    let received_at = at(&r["processed"]["received_at"]);
    assert!(received_at <= handled_at, "{r}");
    assert_eq!(r["processed"]["delivery_attempt"], 1);
    assert_eq!(
        r["duplicates"],
        json!({"count": 0, "first_at": null, "last_at": null})
    );
    let outbox = r["outbox"].as_array().expect("outbox rows");
    assert_eq!(outbox.len(), 1, "{r}");
    assert_eq!(outbox[0]["status"], "dispatched");
    assert_eq!(outbox[0]["attempts"], 1);
    assert_eq!(outbox[0]["destination"], Value::Null, "the default sink");
    assert_eq!(outbox[0]["last_error"], Value::Null);
    assert_eq!(at(&outbox[0]["created_at"]), handled_at);
    assert!(at(&outbox[0]["dispatched_at"]) >= handled_at, "{r}");
    assert_eq!(r["queued"], json!([]), "the database queue was looked in");
    assert_eq!(r["dead_letters"], json!([]));
    assert_eq!(r["stale"], json!([]));

    let t = text(&db, "evt_show_handled");
    assert!(
        t.starts_with("stripe evt_show_handled: handled and delivered\n"),
        "{t}"
    );
    assert_eq!(r["story"], "delivered", "{r}");
    for part in [
        "invoice.paid",
        &format!(
            "received        {}",
            r["processed"]["received_at"].as_str().unwrap()
        ),
        &format!(
            "handled         {}, on delivery 1",
            r["processed"]["at"].as_str().unwrap()
        ),
        "duplicates      none recognised",
        &format!(
            "to default sink: dispatched at {} after 1 attempt",
            outbox[0]["dispatched_at"].as_str().unwrap()
        ),
    ] {
        assert!(t.contains(part), "{part:?} in:\n{t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_posted_three_times_is_handled_once_with_two_duplicates_on_sqlite() {
    deduplicated(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_posted_three_times_is_handled_once_with_two_duplicates_on_postgres() {
    deduplicated(Backend::Postgres).await;
}

async fn deduplicated(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(&db, work.path(), None, &[]);
    let store = db.store().await;
    let body = stripe_event("evt_show_twice", "invoice.paid");
    post(&bin, body.clone()).await;
    until(&bin, "the first delivery processed", || {
        processed(&store, "evt_show_twice")
    })
    .await;
    post(&bin, body.clone()).await;
    post(&bin, body).await;
    until(&bin, "two duplicates recorded", || async {
        let dups = store
            .dedup()
            .duplicates_of("stripe", "evt_show_twice", 100)
            .await;
        dups.is_ok_and(|d| d.count == 2)
    })
    .await;

    let r = report(&db, "evt_show_twice");
    assert_eq!(r["outcome"], "handled");
    assert_eq!(r["duplicates"]["count"], 2, "{r}");
    let handled_at = at(&r["processed"]["at"]);
    let (first, last) = (
        at(&r["duplicates"]["first_at"]),
        at(&r["duplicates"]["last_at"]),
    );
    assert!(handled_at <= first && first <= last, "{r}");
    assert_eq!(
        r["outbox"].as_array().map(Vec::len),
        Some(1),
        "handled once: {r}"
    );

    let t = text(&db, "evt_show_twice");
    let line = format!(
        "duplicates      2 later deliveries recognised as duplicates, the first at {}, the last at {}",
        r["duplicates"]["first_at"].as_str().unwrap(),
        r["duplicates"]["last_at"].as_str().unwrap()
    );
    assert!(t.contains(&line), "{line:?} in:\n{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_event_then_its_redrive_on_sqlite() {
    dead_lettered(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_event_then_its_redrive_on_postgres() {
    dead_lettered(Backend::Postgres).await;
}

/// The ledger handler's insert of `evt_show_poison` fails while the trigger is there. On
/// PostgreSQL the trigger raises an exception (P0001): retryable, so it fails on every delivery
/// and is dead-lettered after `consumer.max_attempts` (2). On SQLite `RAISE(ABORT)` is a
/// constraint failure: fatal, dead-lettered after its one attempt.
async fn dead_lettered(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(
        &db,
        work.path(),
        None,
        &[
            ("DEDUP_CONSUMER__HANDLER", "ledger"),
            ("DEDUP_CONSUMER__MAX_ATTEMPTS", "2"),
            ("DEDUP_CONSUMER__RETRY_BASE", "50ms"),
            ("DEDUP_CONSUMER__RETRY_MAX", "100ms"),
        ],
    );
    let store = db.store().await;
    match backend {
        Backend::Postgres => {
            execute(
                &store,
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'poison event refused'; END $$",
            )
            .await;
            execute(
                &store,
                "CREATE TRIGGER poison BEFORE INSERT ON event_ledger FOR EACH ROW
                 WHEN (NEW.event_id = 'evt_show_poison') EXECUTE FUNCTION refuse_poison()",
            )
            .await;
        }
        Backend::Sqlite => {
            execute(
                &store,
                "CREATE TRIGGER poison BEFORE INSERT ON event_ledger
                 WHEN NEW.event_id = 'evt_show_poison'
                 BEGIN SELECT RAISE(ABORT, 'poison event refused'); END",
            )
            .await;
        }
    }
    post(&bin, stripe_event("evt_show_poison", "charge.failed")).await;
    until(&bin, "the dead letter", || async {
        let dead = store
            .reads()
            .dead_letters_of("stripe", "evt_show_poison", 10)
            .await;
        dead.is_ok_and(|d| !d.is_empty())
    })
    .await;

    let r = report(&db, "evt_show_poison");
    assert_eq!(r["outcome"], "dead_lettered", "{r}");
    assert_eq!(r["event_type"], "charge.failed");
    assert_eq!(r["processed"], Value::Null, "never seen before success");
    let dead = r["dead_letters"].as_array().expect("dead letters");
    assert_eq!(dead.len(), 1, "{r}");
    let attempts = if backend == Backend::Postgres { 2 } else { 1 };
    assert_eq!(dead[0]["attempts"], attempts, "{r}");
    assert_eq!(dead[0]["queue"], "dedup.events");
    let error = dead[0]["error"].as_str().unwrap();
    assert!(error.contains("poison event refused"), "{error}");
    at(&dead[0]["at"]);
    assert_eq!(r["outbox"], json!([]));
    assert_eq!(r["queued"], json!([]), "acked once dead-lettered");
    let dead_id = dead[0]["id"].as_i64().unwrap();
    let t = text(&db, "evt_show_poison");
    assert!(
        t.starts_with("stripe evt_show_poison: dead letter, not processed\n"),
        "{t}"
    );
    let line = format!(
        "{:<15} {} on dedup.events after {}: ",
        format!("dead letter #{dead_id}"),
        dead[0]["at"].as_str().unwrap(),
        if attempts == 1 {
            "1 attempt"
        } else {
            "2 attempts"
        }
    );
    assert!(t.contains(&line), "{line:?} in:\n{t}");
    assert!(
        t.contains(&format!("`dedup-worker dlq redrive {dead_id}` replays it")),
        "{t}"
    );

    // Fixed, and redriven: handled, with the redrive listed.
    let drop_trigger = match backend {
        Backend::Postgres => "DROP TRIGGER poison ON event_ledger",
        Backend::Sqlite => "DROP TRIGGER poison",
    };
    execute(&store, drop_trigger).await;
    let redrive = dedup_command(&[("DATABASE_URL", db.url.clone())])
        .args(["dlq", "redrive", "--all"])
        .output()
        .expect("run dlq redrive");
    assert!(String::from_utf8_lossy(&redrive.stdout).contains("redriven: 1"));
    until(&bin, "the redriven event handled", || {
        processed(&store, "evt_show_poison")
    })
    .await;
    let r = report(&db, "evt_show_poison");
    assert_eq!(r["outcome"], "handled", "{r}");
    assert_eq!(r["dead_letters"], json!([]), "deleted by the redrive");
    let redrives = r["redrives"].as_array().expect("redrives");
    assert_eq!(redrives.len(), 1, "{r}");
    assert_eq!(redrives[0]["dead_letter_id"], dead_id);
    assert_eq!(redrives[0]["attempts"], attempts);
    assert_eq!(redrives[0]["queue"], "dedup.events");
    assert_eq!(redrives[0]["redriven_to"], "dedup.events");
    assert_eq!(redrives[0]["error"], error);
    let redriven_at = at(&redrives[0]["redriven_at"]);
    assert!(at(&redrives[0]["dead_lettered_at"]) <= redriven_at);
    // Published (the message's enqueue time), then the dead letter deleted and recorded.
    assert!(at(&r["processed"]["received_at"]) <= redriven_at, "{r}");
    // A fresh message (1), unless a step that received it failed and gave it back (SQLite's
    // one writer, busy with the redrive's own commit, can refuse a batch).
    let attempt = r["processed"]["delivery_attempt"].as_i64();
    assert!(attempt.is_some_and(|n| n >= 1), "{r}");
    let t = text(&db, "evt_show_poison");
    let line = format!("redriven        dead letter #{dead_id} (dead-lettered ");
    assert!(t.contains(&line), "{line:?} in:\n{t}");
    assert!(t.contains(" published to dedup.events at "), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_event_with_the_newer_one_on_sqlite() {
    stale(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_event_with_the_newer_one_on_postgres() {
    stale(Backend::Postgres).await;
}

fn update(id: &str, created: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "object": "event", "created": created,
        "type": "customer.subscription.updated",
        "data": {"object": {"id": "sub_show", "object": "subscription"}}
    }))
    .expect("serialize")
}

async fn stale(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(
        &db,
        work.path(),
        None,
        &[("DEDUP_CONSUMER__STALE_GUARD__ENABLED", "true")],
    );
    let store = db.store().await;
    for (id, created) in [("evt_show_0909", TEN + 9), ("evt_show_0905", TEN + 5)] {
        post(&bin, update(id, created)).await;
        until(&bin, &format!("{id} processed"), || processed(&store, id)).await;
    }

    let r = report(&db, "evt_show_0905");
    assert_eq!(r["outcome"], "stale", "{r}");
    let stale = r["stale"].as_array().expect("stale records");
    assert_eq!(stale.len(), 1, "{r}");
    assert_eq!(stale[0]["object_id"], "sub_show");
    assert_eq!(stale[0]["version"], TEN + 5);
    assert_eq!(stale[0]["newer_event_id"], "evt_show_0909");
    assert_eq!(stale[0]["newer_version"], TEN + 9);
    at(&stale[0]["at"]);
    assert_eq!(r["outbox"], json!([]), "not forwarded");
    let t = text(&db, "evt_show_0905");
    assert!(
        t.starts_with(
            "stripe evt_show_0905: held back as stale (recorded by the stale-event guard"
        ),
        "{t}"
    );
    let line = format!(
        "stale           version {} of sub_show was held back: evt_show_0909 had version {}",
        TEN + 5,
        TEN + 9
    );
    assert!(t.contains(&line), "{line:?} in:\n{t}");
    assert_eq!(report(&db, "evt_show_0909")["outcome"], "handled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_the_sink_refuses_is_failed_with_its_last_error_on_sqlite() {
    failed_outbox_row(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_the_sink_refuses_is_failed_with_its_last_error_on_postgres() {
    failed_outbox_row(Backend::Postgres).await;
}

async fn failed_outbox_row(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let receiver = Receiver::answering(|_, _| StatusCode::INTERNAL_SERVER_ERROR).await;
    let bin = start(
        &db,
        work.path(),
        Some(receiver.url()),
        &[
            ("DEDUP_OUTBOX__MAX_ATTEMPTS", "2"),
            ("DEDUP_OUTBOX__RETRY_BASE", "20ms"),
            ("DEDUP_OUTBOX__RETRY_MAX", "50ms"),
        ],
    );
    let store = db.store().await;
    post(&bin, stripe_event("evt_show_refused", "payout.paid")).await;
    until(&bin, "the outbox row failed", || async {
        store.outbox().counts().await.is_ok_and(|c| c.failed == 1)
    })
    .await;

    let r = report(&db, "evt_show_refused");
    assert_eq!(r["outcome"], "handled", "handled; its delivery failed: {r}");
    let outbox = r["outbox"].as_array().expect("outbox rows");
    assert_eq!(outbox.len(), 1, "{r}");
    assert_eq!(outbox[0]["status"], "failed");
    assert_eq!(outbox[0]["attempts"], 2);
    assert_eq!(outbox[0]["dispatched_at"], Value::Null);
    let error = outbox[0]["last_error"].as_str().expect("the last error");
    assert!(error.contains("500"), "{error}");
    assert_eq!(receiver.keys(), ["evt_show_refused", "evt_show_refused"]);
    let t = text(&db, "evt_show_refused");
    let line = format!(
        "to default sink: failed after 2 attempts, not retried (`dedup-worker outbox failed` \
         lists it); last error: {error}"
    );
    assert!(t.contains(&line), "{line:?} in:\n{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_waiting_in_the_database_queue_on_sqlite() {
    queued(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_waiting_in_the_database_queue_on_postgres() {
    queued(Backend::Postgres).await;
}

async fn queued(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(
        &db,
        work.path(),
        None,
        &[("DEDUP_ROLES__CONSUMER", "false")],
    );
    post(&bin, stripe_event("evt_show_waiting", "invoice.paid")).await;

    let r = report(&db, "evt_show_waiting");
    assert_eq!(r["outcome"], "queued", "{r}");
    assert_eq!(r["processed"], Value::Null);
    let queued = r["queued"].as_array().expect("queued messages");
    assert_eq!(queued.len(), 1, "{r}");
    assert_eq!(queued[0]["queue"], "dedup.events");
    assert_eq!(queued[0]["attempts"], 0);
    let enqueued = at(&queued[0]["enqueued_at"]);
    assert!(enqueued <= Utc::now());
    let t = text(&db, "evt_show_waiting");
    assert!(
        t.starts_with("stripe evt_show_waiting: waiting in the queue (the database queue)"),
        "{t}"
    );
    let line = format!(
        "on dedup.events since {}, 0 deliveries so far",
        queued[0]["enqueued_at"].as_str().unwrap()
    );
    assert!(t.contains(&line), "{line:?} in:\n{t}");
    drop(bin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_never_sent_is_not_seen_with_exit_status_3_on_sqlite() {
    not_seen(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_never_sent_is_not_seen_with_exit_status_3_on_postgres() {
    not_seen(Backend::Postgres).await;
}

async fn not_seen(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(&db, work.path(), None, &[]);
    let store = db.store().await;
    post(&bin, stripe_event("evt_show_sent", "invoice.paid")).await;
    until(&bin, "the sent event processed", || {
        processed(&store, "evt_show_sent")
    })
    .await;

    for args in [
        &["evt_show_never_sent"][..],
        // The id was sent, as a Stripe event: under another source it is another event.
        &["evt_show_sent", "--source", "standard"][..],
    ] {
        let out = events_show(&db, args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stdout}");
        let source = args.get(2).copied().unwrap_or("stripe");
        assert!(
            stdout.starts_with(&format!("{source} {}: not seen\n", args[0])),
            "{stdout}"
        );
        assert!(stdout.contains("nothing recorded"), "{stdout}");

        let mut json_args = args.to_vec();
        json_args.push("--json");
        let out = events_show(&db, &json_args);
        assert_eq!(out.status.code(), Some(3));
        let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(r["outcome"], "not_seen");
        assert_eq!(r["found"], false);
        assert_eq!(r["source"], source);
        assert_eq!(r["event_id"], args[0]);
        assert_eq!(r["processed"], Value::Null);
    }
    assert_eq!(report(&db, "evt_show_sent")["outcome"], "handled");
    // An id no event can have is an error (1), not "not seen".
    let out = events_show(&db, &[&"x".repeat(300)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the event id"));
}
