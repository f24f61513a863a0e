//! How a handler's errors are classified, on both stores: a database error no retry can cure
//! (a unique violation, a table that does not exist, bad syntax) and a payload that does not
//! parse are dead-lettered after one attempt; what may pass (a row not there yet, a statement
//! timeout on PostgreSQL, an error the handler marks `.retryable()`) is retried until
//! `consumer.max_attempts`; one marked `.retry_after(d)` is redelivered no sooner than `d`
//! later. Every dead letter says what happened underneath. An event whose data the database
//! refuses, delivered twice, is one dead letter.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, HandlerResultExt, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::DbTx;
use serde_json::json;

use crate::helpers::db::pipeline_drained;
use crate::helpers::{
    file_sink_ids, post_signed, stripe_event, test_settings, wait_for, Backend, TestApp, TestDb,
};

/// The secret `test_settings` configures.
const SECRET: &str = "whsec_test_secret";
const MAX_ATTEMPTS: i32 = 3;

/// The delay `evt_later` asks for: far above the backoff's own (20 ms doubling), below
/// `consumer.retry_max` (10 s).
const LATER: Duration = Duration::from_millis(1500);

/// Fails each event the way its id names, through real statements on the batch's connection.
#[derive(Default)]
struct Failing {
    /// When `evt_later` ran, by delivery attempt (a batch with a failure runs its handlers
    /// twice: once together, then each in a savepoint of its own).
    later_runs: Mutex<Vec<(u32, Instant)>>,
}

/// What `evt_bad_payload` is parsed into: its payload has no `amount_paid` at the top level.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Paid {
    amount_paid: i64,
}

#[async_trait]
impl Handler for Failing {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        match event.id.as_str() {
            "evt_unique" => {
                dedup_worker::execute!(
                    tx,
                    "CREATE TABLE IF NOT EXISTS paid (id TEXT PRIMARY KEY)"
                )?;
                dedup_worker::execute!(tx, "INSERT INTO paid (id) VALUES ('in_1')")?;
                dedup_worker::execute!(tx, "INSERT INTO paid (id) VALUES ($1)", "in_1")?;
            }
            "evt_no_table" => {
                dedup_worker::execute!(tx, "INSERT INTO no_such_table (id) VALUES ('x')")?;
            }
            "evt_syntax" => {
                dedup_worker::execute!(tx, "INSRT INTO paid VALUES (1)")?;
            }
            "evt_bad_payload" => {
                event.json::<Paid>()?;
            }
            "evt_row_not_yet" => {
                // The customer this event refers to has not arrived (yet).
                dedup_worker::with_connection!(tx, |conn| {
                    sqlx::query("SELECT 1 WHERE 1 = 0")
                        .fetch_one(&mut **conn)
                        .await
                        .map(drop)
                })?;
            }
            "evt_timeout" => {
                // PostgreSQL only (posted only there), through its own connection.
                let conn = tx
                    .postgres()
                    .expect("evt_timeout is posted on PostgreSQL only");
                sqlx::query("SET LOCAL statement_timeout = '10ms'")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("SELECT pg_sleep(1)")
                    .execute(&mut *conn)
                    .await?;
            }
            "evt_later" => {
                let run = (event.delivery_attempt, Instant::now());
                self.later_runs.lock().unwrap().push(run);
                Err(std::io::Error::other("rate limited")).retry_after(LATER)?;
            }
            "evt_marked" => {
                Err(std::io::Error::other("the payment provider is down")).retryable()?;
            }
            _ => {}
        }
        Ok(vec![OutboxMessage::forward(event)])
    }
}

async fn classified(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let settings = test_settings(
        &db.url,
        &[
            ("outbox.sink", json!(format!("file:{}", sink.display()))),
            ("consumer.retry_base", json!("20ms")),
            ("consumer.retry_max", json!("10000ms")),
            ("consumer.max_attempts", json!(MAX_ATTEMPTS)),
            ("consumer.poll_interval", json!("50ms")),
            ("outbox.poll_interval", json!("50ms")),
        ],
    );
    let handler = Arc::new(Failing::default());
    let app = TestApp::spawn(settings, Service::new().handler(handler.clone())).await;
    let mut fatal = vec![
        "evt_unique",
        "evt_no_table",
        "evt_syntax",
        "evt_bad_payload",
    ];
    let mut retried = vec!["evt_row_not_yet", "evt_marked", "evt_later"];
    if backend == Backend::Postgres {
        retried.push("evt_timeout");
    }
    let mut ids: Vec<&str> = vec!["evt_fine_1", "evt_fine_2"];
    ids.append(&mut fatal.clone());
    ids.append(&mut retried.clone());
    let client = reqwest::Client::new();
    for id in &ids {
        let body = stripe_event(id, "invoice.paid");
        let response = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    let store = app.store.clone();
    let failing = fatal.len() + retried.len();
    let dead = wait_for(
        "every failing event dead-lettered",
        Duration::from_secs(60),
        || {
            let store = store.clone();
            async move {
                let dead = store.dead_letters().list(100).await.unwrap();
                (dead.len() == failing).then_some(dead)
            }
        },
    )
    .await;
    let attempts = |id: &str| {
        let letter = dead.iter().find(|d| d.event_id == id).expect(id);
        (letter.attempts, letter.error.clone())
    };
    fatal.sort_unstable();
    for id in fatal {
        let (n, error) = attempts(id);
        assert_eq!(
            n, 1,
            "{id} is fatal: dead-lettered after one attempt ({error})"
        );
        assert!(error.starts_with("fatal: "), "{id}: {error}");
    }
    for id in retried {
        let (n, error) = attempts(id);
        assert_eq!(n, MAX_ATTEMPTS, "{id} is retryable ({error})");
        let kind = if id == "evt_later" {
            "retry after 1.5s: "
        } else {
            "retryable: "
        };
        assert!(error.starts_with(kind), "{id}: {error}");
    }
    // Each redelivery of `evt_later` came no sooner than it asked.
    let runs = handler.later_runs.lock().unwrap().clone();
    let of = |attempt: u32| {
        runs.iter()
            .filter(move |(a, _)| *a == attempt)
            .map(|(_, t)| *t)
    };
    for attempt in 1..MAX_ATTEMPTS as u32 {
        let last = of(attempt).max().expect("a run of each attempt");
        let next = of(attempt + 1).min().expect("a run of each attempt");
        let gap = next - last;
        assert!(gap >= LATER, "redelivered after {gap:?}, asked {LATER:?}");
    }
    // The cause is kept, in the store's own words.
    let (_, unique) = attempts("evt_unique");
    assert!(
        unique.contains("UNIQUE") || unique.contains("duplicate key"),
        "{unique}"
    );
    assert!(attempts("evt_no_table").1.contains("no_such_table"));
    assert!(attempts("evt_bad_payload").1.contains("amount_paid"));
    assert!(attempts("evt_marked")
        .1
        .contains("payment provider is down"));
    wait_for("the fine events delivered", Duration::from_secs(30), || {
        let sink = sink.clone();
        async move { (file_sink_ids(&sink).len() == 2).then_some(()) }
    })
    .await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_are_classified_on_postgres() {
    classified(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_are_classified_on_sqlite() {
    classified(Backend::Sqlite).await;
}

/// Forwards every event, but gives `evt_refused` an outbox row PostgreSQL cannot hold (a NUL in
/// its type): the database refuses that event's transaction for its data, every time.
struct RefusedData;

#[async_trait]
impl Handler for RefusedData {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let mut message = OutboxMessage::forward(event);
        if event.id == "evt_refused" {
            message.event_type = "bad\u{0}type".into();
        }
        Ok(vec![message])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_refused_for_its_data_twice_is_one_dead_letter() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    // Queued first, consumed after: the two deliveries of `evt_refused` are in the queue
    // together, and neither can be recognised as the other's duplicate (it never commits).
    let settings = test_settings(
        &db.url,
        &[
            ("roles.consumer", json!(false)),
            ("roles.relay", json!(false)),
        ],
    );
    let ingress = TestApp::spawn(settings, Service::new()).await;
    let client = reqwest::Client::new();
    for id in ["evt_refused", "evt_fine", "evt_refused"] {
        let body = stripe_event(id, "invoice.paid");
        let url = ingress.url("/webhooks/stripe");
        let response = post_signed(&client, &url, SECRET, body).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    ingress.stop().await;
    let settings = test_settings(
        &db.url,
        &[
            ("roles.ingress", json!(false)),
            ("outbox.sink", json!(format!("file:{}", sink.display()))),
            // One delivery per batch: each of the two is refused in a transaction of its own
            // (a batch holding both might settle the second as the first's duplicate).
            ("consumer.batch_size", json!(1)),
            ("consumer.poll_interval", json!("50ms")),
            ("outbox.poll_interval", json!("50ms")),
        ],
    );
    let worker = TestApp::spawn(settings, Service::new().handler(RefusedData)).await;
    let store = worker.store.clone();
    wait_for(
        "both deliveries settled and the fine event delivered",
        Duration::from_secs(30),
        || async {
            let drained = pipeline_drained(&store, "dedup.events").await;
            let delivered = file_sink_ids(&sink).len() == 1;
            (drained && delivered).then_some(())
        },
    )
    .await;
    let dead = store.dead_letters().list(10).await.unwrap();
    let ids: Vec<&str> = dead.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_refused"], "one dead letter for both deliveries");
    assert!(
        dead[0].error.contains("refused this event's data"),
        "{}",
        dead[0].error
    );
    worker.stop().await;
}
