//! The example service `examples/paid_invoices` (issue 16), run as its own binary exactly as a
//! user would run theirs, on PostgreSQL and SQLite: it serves, restarts twice without a
//! migration error, and its stock commands (`migrate`, `dlq list`, `outbox failed`) work.
//! Signed `invoice.paid` events, one sent twice (across a restart), one of another type and one
//! malformed, leave exactly one `paid_invoices` row per invoice, one delivery each at the sink,
//! and the malformed one a dead letter after its first attempt (fatal), not the eighth.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::app::{example_binary, program_command};
use crate::helpers::{counter_value, file_sink_ids, post_signed, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_paid_invoices";
const WAIT: Duration = Duration::from_secs(30);

fn invoice_paid(event: &str, invoice: &str, amount_paid: Value) -> Vec<u8> {
    serde_json::to_vec_pretty(&json!({
        "id": event,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000,
        "type": "invoice.paid",
        "livemode": false,
        "data": {"object": {
            "id": invoice, "object": "invoice", "amount_paid": amount_paid, "currency": "eur"
        }}
    }))
    .expect("serialize")
}

fn env(db: &TestDb, work: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        (
            "DEDUP_SINK",
            format!("file:{}", work.join("sink.jsonl").display()),
        ),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
    ]
}

/// One of the example's commands against `db`; its stdout (the command must succeed).
fn example_cli(db: &TestDb, work: &Path, args: &[&str]) -> String {
    let out = program_command(&example_binary("paid_invoices"), &env(db, work))
        .args(args)
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "paid_invoices {args:?}: {stderr}");
    assert!(
        !stderr.contains("migration"),
        "paid_invoices {args:?}: {stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("the command prints JSON lines"))
        .collect()
}

async fn post(bin: &RunningBinary, body: Vec<u8>) {
    let client = reqwest::Client::new();
    let response = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
        .await
        .expect("post");
    assert_eq!(response.status(), 200, "the webhook is accepted");
}

/// SIGTERM, a clean exit, and nothing said about migrations.
async fn stop(mut bin: RunningBinary, run: u32) {
    bin.terminate();
    let status = bin.wait_exit(WAIT).await;
    let stderr = bin.stderr();
    assert!(status.success(), "run {run} exited with {status}: {stderr}");
    assert!(!stderr.contains("migration"), "run {run}: {stderr}");
}

/// The rows of `paid_invoices`, read through the application's own pool.
async fn paid_invoices(db: &TestDb) -> Vec<(String, String, i64)> {
    const SQL: &str =
        "SELECT invoice_id, event_id, amount_paid FROM paid_invoices ORDER BY invoice_id";
    let store = db.store().await;
    let rows = match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(SQL).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(SQL).fetch_all(pool).await,
        _ => unreachable!(),
    };
    store.close().await;
    rows.expect("read paid_invoices")
}

async fn the_example_serves_restarts_and_its_commands_work(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().expect("tempdir");
    let program = example_binary("paid_invoices");
    let sink = work.path().join("sink.jsonl");

    // Run 1: a fresh database; the library's and the service's migrations on start.
    let bin = RunningBinary::start_program(&program, &env(&db, work.path()), work.path());
    post(&bin, invoice_paid("evt_1", "in_1", json!(2000))).await;
    post(&bin, invoice_paid("evt_2", "in_2", json!(3500))).await;
    post(
        &bin,
        crate::helpers::stripe_event("evt_3", "customer.created"),
    )
    .await;
    post(&bin, invoice_paid("evt_4", "in_4", json!("lots"))).await;
    let dead = bin
        .wait_for("the malformed event's dead letter", WAIT, || async {
            let lines = json_lines(&example_cli(&db, work.path(), &["dlq", "list"]));
            (!lines.is_empty()).then_some(lines)
        })
        .await;
    bin.wait_for("both invoices at the sink", WAIT, || async {
        (file_sink_ids(&sink).len() >= 2).then_some(())
    })
    .await;
    let metrics = reqwest::get(bin.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    stop(bin, 1).await;

    // Run 2: a restart; the same invoice.paid again (Stripe retrying) is a duplicate.
    let bin = RunningBinary::start_program(&program, &env(&db, work.path()), work.path());
    post(&bin, invoice_paid("evt_1", "in_1", json!(2000))).await;
    bin.wait_for("the duplicate handled", WAIT, || async {
        let out = example_cli(&db, work.path(), &["events", "show", "evt_1", "--json"]);
        let report: Value = serde_json::from_str(&out).expect("report");
        (report["duplicates"]["count"].as_i64() >= Some(1)).then_some(())
    })
    .await;
    stop(bin, 2).await;

    // Run 3: another restart, nothing pending to migrate.
    let bin = RunningBinary::start_program(&program, &env(&db, work.path()), work.path());
    stop(bin, 3).await;

    // The stock commands of the service's own binary.
    let migrated = example_cli(&db, work.path(), &["migrate"]);
    assert_eq!(migrated.lines().count(), 1, "{migrated}");
    assert_eq!(
        json_lines(&example_cli(&db, work.path(), &["outbox", "failed"])),
        Vec::<Value>::new()
    );

    assert_eq!(
        paid_invoices(&db).await,
        vec![
            ("in_1".to_owned(), "evt_1".to_owned(), 2000),
            ("in_2".to_owned(), "evt_2".to_owned(), 3500),
        ]
    );
    let mut delivered = file_sink_ids(&sink);
    delivered.sort();
    assert_eq!(delivered, vec!["in_1", "in_2"], "one delivery each");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["event_id"], "evt_4", "{dead:?}");
    assert_eq!(
        dead[0]["attempts"], 1,
        "fatal: one attempt, not eight: {dead:?}"
    );
    assert_eq!(counter_value(&metrics, "dedup_events_retried_total"), 0);
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_serves_restarts_and_its_commands_work_on_postgres() {
    the_example_serves_restarts_and_its_commands_work(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_serves_restarts_and_its_commands_work_on_sqlite() {
    the_example_serves_restarts_and_its_commands_work(Backend::Sqlite).await;
}
