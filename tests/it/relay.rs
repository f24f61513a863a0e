//! The outbox relay against an HTTP receiver that fails: deliveries are retried with backoff,
//! every attempt carries the same `Idempotency-Key`, a row that never succeeds is marked failed
//! after `outbox.max_attempts` and listed by `dedup-worker outbox failed`; the CLI's `migrate`
//! and `dlq` commands work on the same database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use dedup_worker::Service;
use serde_json::json;

use crate::helpers::app::cli_json_lines;
use crate::helpers::db::wait_for_outbox;
use crate::helpers::{
    post_signed, run_cli, serve, stripe_event, test_settings, wait_for, Backend, Receiver, TestApp,
    TestDb,
};

const SECRET: &str = "whsec_test_secret";

/// `evt_retry*` fails twice then succeeds; `evt_never*` always fails; others succeed.
fn flaky(key: &str, attempt: usize) -> StatusCode {
    if key.starts_with("evt_never") || (key.starts_with("evt_retry") && attempt <= 2) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

fn cli(db: &TestDb, args: &[&str]) -> String {
    run_cli(&[("DATABASE_URL", db.url.clone())], args)
}

/// [`cli`] for a command that prints JSON lines.
fn cli_rows(db: &TestDb, args: &[&str]) -> Vec<serde_json::Value> {
    cli_json_lines(&[("DATABASE_URL", db.url.clone())], args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_retries_with_the_same_key_then_gives_up_on_postgres() {
    http_sink_retries(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sink_retries_with_the_same_key_then_gives_up_on_sqlite() {
    http_sink_retries(Backend::Sqlite).await;
}

async fn http_sink_retries(backend: Backend) {
    let db = TestDb::new(backend).await;
    // `migrate` on a fresh database, twice (idempotent).
    assert!(cli(&db, &["migrate"]).contains("migrations applied"));
    assert!(cli(&db, &["migrate"]).contains("migrations applied"));
    let receiver = Receiver::answering(flaky).await;
    let url = receiver.url();
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("outbox.sink", json!(url)),
                ("outbox.retry_base", json!("20ms")),
                ("outbox.retry_max", json!("100ms")),
                ("outbox.max_attempts", json!(3)),
                ("outbox.poll_interval", json!("20ms")),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let client = reqwest::Client::new();
    for id in ["evt_ok_1", "evt_retry_1", "evt_never_1"] {
        let body = stripe_event(id, "payout.paid");
        let r = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_for_outbox(
        &app.store,
        "deliveries to settle",
        Duration::from_secs(30),
        |c| c.pending == 0 && c.dispatched == 2 && c.failed == 1,
    )
    .await;
    let mut attempts: HashMap<String, usize> = HashMap::new();
    for key in receiver.keys() {
        *attempts.entry(key).or_default() += 1;
    }
    assert_eq!(attempts["evt_ok_1"], 1);
    assert_eq!(attempts["evt_retry_1"], 3, "two failures, then success");
    assert_eq!(
        attempts["evt_never_1"], 3,
        "max_attempts, then marked failed"
    );
    assert_eq!(
        attempts.len(),
        3,
        "every request carried the event id as Idempotency-Key"
    );

    let rows = cli_rows(&db, &["outbox", "failed"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["event_id"], "evt_never_1");
    assert_eq!(rows[0]["attempts"], 3);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_cli_lists_and_redrives() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    for id in ["evt_d1", "evt_d2"] {
        tx.insert_dead_letter(&dedup_worker_core::store::NewDeadLetter {
            source: "stripe".into(),
            event_id: id.into(),
            event_type: "x.y".into(),
            queue: "dedup.events".into(),
            payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
            error: "fatal: bad".into(),
            attempts: 1,
        })
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let rows = cli_rows(&db, &["dlq", "list"]);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["error"], "fatal: bad");
    let first_id = rows[0]["id"].to_string();
    assert!(cli(&db, &["dlq", "redrive", &first_id]).contains("redriven: 1"));
    assert_eq!(store.queue().depth("dedup.events").await.unwrap(), 1);
    assert!(cli(&db, &["dlq", "redrive", "--all"]).contains("redriven: 1"));
    assert_eq!(store.queue().depth("dedup.events").await.unwrap(), 2);
    assert_eq!(cli(&db, &["dlq", "list"]).trim(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirecting_http_sink_is_a_failed_delivery_and_never_sees_a_get() {
    // A 302 followed would turn the POST into a GET without the event, and a 2xx to that GET
    // would mark the row dispatched: the event lost.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let gets = Arc::new(AtomicUsize::new(0));
    let counted = gets.clone();
    let addr = serve(
        Router::new()
            .route(
                "/hook",
                post(|| async {
                    (
                        StatusCode::FOUND,
                        [(axum::http::header::LOCATION, "/elsewhere")],
                    )
                }),
            )
            .route(
                "/elsewhere",
                axum::routing::any(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { StatusCode::OK }
                }),
            ),
    )
    .await;
    let db = TestDb::new(Backend::Postgres).await;
    let settings = test_settings(
        &db.url,
        &[
            ("outbox.sink", json!(format!("http://{addr}/hook"))),
            ("outbox.max_attempts", json!(2)),
            ("outbox.retry_base", json!("20ms")),
            ("outbox.retry_max", json!("50ms")),
            ("outbox.poll_interval", json!("50ms")),
            ("consumer.poll_interval", json!("50ms")),
        ],
    );
    let app = TestApp::spawn(settings, Service::new()).await;
    let client = reqwest::Client::new();
    let body = stripe_event("evt_redirected", "charge.succeeded");
    let r = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_outbox(
        &app.store,
        "the row to be marked failed",
        Duration::from_secs(30),
        |c| c.failed == 1,
    )
    .await;
    assert_eq!(gets.load(Ordering::SeqCst), 0, "the redirect was followed");
    let pool = app.store.postgres_pool().expect("a PostgreSQL test");
    let last_error: String = sqlx::query_scalar("SELECT last_error FROM outbox")
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(
        last_error.contains("302") && last_error.contains("/elsewhere"),
        "{last_error}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_lease_was_taken_over_marks_nothing_and_says_so_on_postgres() {
    lease_taken_over(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_lease_was_taken_over_marks_nothing_and_says_so_on_sqlite() {
    lease_taken_over(Backend::Sqlite).await;
}

/// Relay A's request hangs and A loses its lease (its heartbeat keeps the lease while A runs, so
/// the test expires it, as a pause longer than the lease would); relay B claims the row and its
/// request hangs too. A's next heartbeat finds the lease lost. A's delivery then fails: before lease-checked marks, A marked the row failed (B's claim had
/// brought attempts to max_attempts), and B's successful delivery could no longer mark it
/// dispatched. Now A's mark changes nothing, A's step reports the lost lease without failing,
/// and B's delivery decides the row.
async fn lease_taken_over(backend: Backend) {
    use dedup_worker_core::config::SinkSpec;
    use dedup_worker_core::outbox::relay::{Relay, RelayOptions};
    use dedup_worker_core::store::{NewOutboxRow, Wakeups};
    use tokio::sync::{mpsc, oneshot};

    /// Each request takes the next answer, announces itself, and waits for the test to answer.
    type Gates = Arc<(
        mpsc::UnboundedSender<()>,
        Mutex<Vec<oneshot::Receiver<StatusCode>>>,
    )>;
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
    let (answer_a, gate_a) = oneshot::channel();
    let (answer_b, gate_b) = oneshot::channel();
    let gates: Gates = Arc::new((arrived_tx, Mutex::new(vec![gate_b, gate_a])));
    let addr = serve(
        Router::new()
            .route(
                "/hook",
                post(|State(gates): State<Gates>| async move {
                    let gate = gates.1.lock().unwrap().pop().expect("two requests at most");
                    gates.0.send(()).unwrap();
                    gate.await.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }),
            )
            .with_state(gates),
    )
    .await;

    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[NewOutboxRow {
        source: "stripe".into(),
        event_id: "evt_slow".into(),
        destination: None,
        idempotency_key: "evt_slow".into(),
        event_type: "charge.succeeded".into(),
        payload: br#"{"id":"evt_slow"}"#.to_vec(),
        traceparent: None,
        ordering_key: None,
    }])
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let relay = |lease: Duration| {
        Arc::new(Relay::new(
            store.clone(),
            Arc::new(Wakeups::default()),
            RelayOptions {
                default_sink: SinkSpec::Http(format!("http://{addr}/hook")),
                batch_size: 10,
                concurrency: 1,
                poll_interval: Duration::from_millis(20),
                lease,
                max_attempts: 2,
                retry_base: Duration::from_millis(10),
                retry_max: Duration::from_millis(10),
                http_timeout: Duration::from_secs(30),
                signing_secrets: Arc::from([]),
                statement_timeout: Duration::from_secs(10),
                ..test_relay_defaults()
            },
        ))
    };
    let (relay_a, relay_b) = (
        relay(Duration::from_millis(300)),
        relay(Duration::from_secs(60)),
    );
    let expire_lease_of_a = {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move {
                match (store.postgres_pool(), store.sqlite_pool()) {
                    (Some(pool), _) => sqlx::query(
                        "UPDATE outbox SET next_attempt_at = now() WHERE status = 'pending'",
                    )
                    .execute(pool)
                    .await
                    .map(drop),
                    // Unix milliseconds: 0 is long past.
                    (_, Some(pool)) => sqlx::query(
                        "UPDATE outbox SET next_attempt_at = 0 WHERE status = 'pending'",
                    )
                    .execute(pool)
                    .await
                    .map(drop),
                    (None, None) => unreachable!("a store is one of the two"),
                }
                .expect("expire the lease");
            }
        }
    };

    let step_a = tokio::spawn(async move { relay_a.try_step().await });
    tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .expect("relay A's request");
    // A pauses past its lease (simulated: its lease is expired under it) and B claims the row;
    // should A's heartbeat extend the lease between the two, B tries again.
    let step_b = tokio::spawn(async move {
        loop {
            expire_lease_of_a().await;
            let outcome = relay_b.try_step().await?;
            if outcome.claimed > 0 {
                return Ok(outcome);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .expect("relay B's request");

    answer_a.send(StatusCode::SERVICE_UNAVAILABLE).unwrap();
    let a = step_a
        .await
        .unwrap()
        .expect("a lost lease is not a failed step");
    assert_eq!(
        (a.claimed, a.dispatched, a.failed_attempts, a.lease_lost),
        (1, 0, 1, 1)
    );
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.dispatched, counts.failed),
        (1, 0, 0),
        "relay A's failure must not decide a row relay B is delivering"
    );

    answer_b.send(StatusCode::OK).unwrap();
    let b: Result<_, dedup_worker_core::store::StoreError> = step_b.await.unwrap();
    let b = b.unwrap();
    assert_eq!((b.claimed, b.dispatched, b.lease_lost), (1, 1, 0));
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.dispatched, counts.failed),
        (0, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_slower_than_the_lease_keeps_its_lease_on_postgres() {
    slow_delivery_keeps_its_lease(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_slower_than_the_lease_keeps_its_lease_on_sqlite() {
    slow_delivery_keeps_its_lease(Backend::Sqlite).await;
}

/// Relay A delivers into a sink that takes four leases to answer; its heartbeat extends the
/// lease meanwhile, so relay B, polling all along, never claims the row: one delivery, marked
/// by A, no lease lost. (Without the heartbeat B takes the row over after one lease and
/// delivers it a second time.)
async fn slow_delivery_keeps_its_lease(backend: Backend) {
    use dedup_worker_core::config::SinkSpec;
    use dedup_worker_core::outbox::relay::{Relay, RelayOptions};
    use dedup_worker_core::store::{NewOutboxRow, Wakeups};

    const LEASE: Duration = Duration::from_millis(600);
    let receiver = Receiver::start().await;
    receiver.delay_answers(LEASE * 4);
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[NewOutboxRow {
        source: "stripe".into(),
        event_id: "evt_slow_sink".into(),
        destination: None,
        idempotency_key: "evt_slow_sink".into(),
        event_type: "charge.succeeded".into(),
        payload: br#"{"id":"evt_slow_sink"}"#.to_vec(),
        traceparent: None,
        ordering_key: None,
    }])
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let relay = || {
        Relay::new(
            store.clone(),
            Arc::new(Wakeups::default()),
            RelayOptions {
                default_sink: SinkSpec::Http(receiver.url()),
                batch_size: 10,
                concurrency: 1,
                poll_interval: Duration::from_millis(20),
                lease: LEASE,
                max_attempts: 3,
                retry_base: Duration::from_millis(10),
                retry_max: Duration::from_millis(10),
                http_timeout: Duration::from_secs(30),
                signing_secrets: Arc::from([]),
                statement_timeout: Duration::from_secs(10),
                ..test_relay_defaults()
            },
        )
    };
    let (relay_a, relay_b) = (relay(), relay());
    let a = relay_a.try_step();
    let b = async {
        // B starts once A holds the row (its request reached the sink), so that A, not
        // whichever relay polls first, is the one whose lease is under test.
        wait_for(
            "A's delivery to reach the sink",
            Duration::from_secs(10),
            || {
                let seen = receiver.snapshot().len();
                async move { (seen > 0).then_some(()) }
            },
        )
        .await;
        let mut claimed = 0;
        // Until A's delivery is answered (and a little longer): B keeps trying to claim.
        let until = tokio::time::Instant::now() + LEASE * 5;
        while tokio::time::Instant::now() < until {
            claimed += relay_b.try_step().await.unwrap().claimed;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        claimed
    };
    let (a, b_claimed) = tokio::join!(a, b);
    let a = a.unwrap();
    assert_eq!(
        (a.claimed, a.dispatched, a.lease_lost, b_claimed),
        (1, 1, 0, 0),
        "A kept its lease while the sink took {:?}; B claimed nothing",
        LEASE * 4
    );
    assert_eq!(receiver.snapshot().len(), 1, "delivered once");
}

/// Issue 9: under load, a receiver whose listen backlog overflowed (Python's `http.server`
/// listens with a backlog of 5) took the relay's requests in only after `outbox.http_timeout`,
/// so the attempt counted as failed and the row was delivered twice. What `last_error` and the
/// relay's log said was only "error sending request for url (…)": the cause (here, the timeout)
/// was dropped with reqwest's error sources. A receiver that takes the connection and never
/// answers stands in for the stalled one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_timed_out_says_so_in_last_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("outbox.sink", json!(format!("http://{addr}/hook"))),
                ("outbox.http_timeout", json!("300ms")),
                ("outbox.max_attempts", json!(1)),
                ("outbox.poll_interval", json!("20ms")),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let body = stripe_event("evt_stalled_1", "payout.paid");
    let r = post_signed(
        &reqwest::Client::new(),
        &app.url("/webhooks/stripe"),
        SECRET,
        body,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_outbox(
        &app.store,
        "the row to be marked failed",
        Duration::from_secs(30),
        |c| c.failed == 1,
    )
    .await;
    let pool = app.store.postgres_pool().expect("a PostgreSQL store");
    let last_error: String =
        sqlx::query_scalar("SELECT last_error FROM outbox WHERE event_id = 'evt_stalled_1'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(
        last_error.contains(&format!("http://{addr}/hook")) && last_error.contains("timed out"),
        "last_error names the URL and the cause: {last_error}"
    );
    app.stop().await;
}

/// The Idempotency-Key of each delivery the receiver saw, with the event id in its body.
fn keys_and_ids(receiver: &Receiver) -> Vec<(Option<String>, String)> {
    receiver
        .snapshot()
        .into_iter()
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON event");
            let id = body["id"].as_str().expect("event id").to_owned();
            (r.idempotency_key, id)
        })
        .collect()
}

/// Every event reached the receiver, each delivery under its event's key, and each event has
/// one outbox row, marked dispatched. How many deliveries each event took, by id.
async fn every_event_dispatched_once(
    pool: &sqlx::PgPool,
    receiver: &Receiver,
    ids: &[String],
) -> HashMap<String, usize> {
    let mut deliveries: HashMap<String, usize> = HashMap::new();
    for (key, id) in keys_and_ids(receiver) {
        assert_eq!(
            key.as_deref(),
            Some(id.as_str()),
            "a delivery's Idempotency-Key"
        );
        *deliveries.entry(id).or_default() += 1;
    }
    let mut delivered: Vec<&String> = deliveries.keys().collect();
    delivered.sort();
    assert_eq!(
        delivered,
        ids.iter().collect::<Vec<_>>(),
        "every event arrived"
    );
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, status FROM outbox ORDER BY event_id")
            .fetch_all(pool)
            .await
            .unwrap();
    let dispatched: Vec<(String, String)> = ids
        .iter()
        .map(|id| (id.clone(), "dispatched".to_owned()))
        .collect();
    assert_eq!(rows, dispatched, "one row per event, marked dispatched");
    deliveries
}

/// Accepts `ids` at the ingress (each a 200: durable), in sorted order.
async fn accept_events(app: &TestApp, prefix: &str, n: usize) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut ids: Vec<String> = (0..n).map(|i| format!("{prefix}_{i:03}")).collect();
    ids.sort();
    for id in &ids {
        let body = stripe_event(id, "payout.paid");
        let r = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    ids
}

/// Issue 9: the HTTP sink behind a fault proxy that first black-holes it (connections taken,
/// never answered), then refuses it (connections reset as soon as taken). Each delivery fails
/// when `outbox.http_timeout` runs out, then on the reset, and `last_error` names that cause;
/// rows stay pending and are retried with backoff; once the proxy passes, every event reaches
/// the receiver under its key and its row is marked dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_then_refusing_sink_fails_deliveries_with_their_cause_then_gets_every_event()
{
    use crate::helpers::fault_proxy::{FaultProxy, Mode};
    let receiver = Receiver::start().await;
    let proxy = FaultProxy::start(&receiver.addr.to_string()).await;
    proxy.set(Mode::BlackHole).await;
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                (
                    "outbox.sink",
                    json!(format!("http://127.0.0.1:{}/hook", proxy.port)),
                ),
                ("outbox.http_timeout", json!("300ms")),
                ("outbox.retry_base", json!("50ms")),
                ("outbox.retry_max", json!("200ms")),
                // Never given up on: the outage, not the attempt limit, is under test.
                ("outbox.max_attempts", json!(10_000)),
                // Each attempt's cause is under test, not the circuit breaker (which would open
                // after 20 failures and send a probe at a time).
                ("outbox.breaker.failures", json!(0)),
                ("outbox.breaker.window", json!(0)),
                ("outbox.poll_interval", json!("20ms")),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let pool = app.store.postgres_pool().expect("a PostgreSQL test");
    let ids = accept_events(&app, "evt_unreachable", 10).await;
    // Rows retried (at least twice), still pending, whose last attempt failed with `cause`.
    let failing_with = |cause: &'static [&'static str]| {
        let pool = pool.clone();
        move || {
            let pool = pool.clone();
            async move {
                let rows: Vec<(i32, String, Option<String>)> =
                    sqlx::query_as("SELECT attempts, status, last_error FROM outbox")
                        .fetch_all(&pool)
                        .await
                        .ok()?;
                let failing = rows.iter().filter(|(attempts, status, error)| {
                    *attempts >= 2
                        && status == "pending"
                        && error
                            .as_deref()
                            .is_some_and(|e| cause.iter().any(|c| e.contains(c)))
                });
                (failing.count() == 10).then_some(())
            }
        }
    };
    wait_for(
        "every delivery to time out, twice",
        Duration::from_secs(20),
        failing_with(&["timed out"]),
    )
    .await;
    assert!(
        receiver.snapshot().is_empty(),
        "nothing passed the black hole"
    );

    proxy.set(Mode::Refuse).await;
    // The proxy takes the connection and resets it: the client sees the reset (or the
    // connection closed under its request), never a timeout.
    wait_for(
        "every delivery to be refused",
        Duration::from_secs(20),
        failing_with(&["reset", "closed"]),
    )
    .await;
    assert!(receiver.snapshot().is_empty(), "nothing passed the refusal");

    proxy.set(Mode::Pass).await;
    wait_for_outbox(
        &app.store,
        "every row dispatched",
        Duration::from_secs(20),
        |c| c.dispatched == 10 && c.pending == 0 && c.failed == 0,
    )
    .await;
    every_event_dispatched_once(pool, &receiver, &ids).await;
    app.stop().await;
}

/// Issue 9: every connection to the HTTP sink cut three times while the receiver holds
/// requests (it took them, and answers only a second later): each cut delivery is delivered
/// again under the same Idempotency-Key, and no event is lost or left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_sink_connections_lose_no_event_and_a_redelivery_keeps_its_idempotency_key() {
    use crate::helpers::fault_proxy::FaultProxy;
    let receiver = Receiver::start().await;
    receiver.delay_answers(Duration::from_secs(1));
    let proxy = FaultProxy::start(&receiver.addr.to_string()).await;
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                (
                    "outbox.sink",
                    json!(format!("http://127.0.0.1:{}/hook", proxy.port)),
                ),
                ("outbox.retry_base", json!("50ms")),
                ("outbox.retry_max", json!("200ms")),
                ("outbox.max_attempts", json!(10_000)),
                // The cuts, not the circuit breaker, are under test: open after 20 failures,
                // it would send a probe at a time, 5 s and more apart.
                ("outbox.breaker.failures", json!(0)),
                ("outbox.breaker.window", json!(0)),
                ("outbox.poll_interval", json!("20ms")),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let pool = app.store.postgres_pool().expect("a PostgreSQL test");
    let ids = accept_events(&app, "evt_cut", 40).await;
    let mut seen = 0;
    for cut in 1..=3 {
        // Cut while requests the receiver has taken wait for their answer.
        seen = wait_for(
            &format!("deliveries before cut {cut}"),
            Duration::from_secs(20),
            || {
                let now = receiver.snapshot().len();
                async move { (now > seen).then_some(now) }
            },
        )
        .await;
        proxy.cut_all().await;
    }
    receiver.delay_answers(Duration::ZERO);
    wait_for_outbox(
        &app.store,
        "every row dispatched",
        Duration::from_secs(20),
        |c| c.dispatched == 40 && c.pending == 0 && c.failed == 0,
    )
    .await;
    let deliveries = every_event_dispatched_once(pool, &receiver, &ids).await;
    assert!(
        deliveries.values().any(|&n| n >= 2),
        "a cut delivery was delivered again (under the same key, checked above)"
    );
    app.stop().await;
}

/// A relay's options where a test does not care: `[outbox]`'s defaults, no named sinks.
fn test_relay_defaults() -> dedup_worker_core::outbox::relay::RelayOptions {
    use dedup_worker_core::config::{BreakerSettings, SinkSpec};
    dedup_worker_core::outbox::relay::RelayOptions {
        default_sink: SinkSpec::Log,
        batch_size: 256,
        concurrency: 32,
        poll_interval: Duration::from_millis(500),
        lease: Duration::from_secs(10),
        max_attempts: 12,
        retry_base: Duration::from_millis(500),
        retry_max: Duration::from_secs(600),
        http_timeout: Duration::from_secs(10),
        signing_secrets: Arc::from([]),
        statement_timeout: Duration::from_secs(10),
        max_retry_after: Duration::from_secs(300),
        default_rate: None,
        breaker: BreakerSettings {
            failures: 20,
            failure_ratio: 0.5,
            window: 100,
            min_requests: 20,
            probe_after: Duration::from_secs(5),
            probe_max: Duration::from_secs(300),
        },
        sinks: Default::default(),
        response_excerpt_bytes: 4096,
        record_attempts: true,
    }
}
