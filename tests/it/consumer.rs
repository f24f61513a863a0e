//! Handler failures, on both stores: a poison event (an error or a panic) is dead-lettered
//! without blocking its batch
//! and leaves no partial effect; a flaky one is retried with backoff and then handled once;
//! retries exhausted → dead letter; dead letters can be redriven. A step slower than its lease
//! keeps its batch: the consumer's heartbeat extends the lease while the step runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, LedgerHandler, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::DbTx;
use serde_json::json;

// The test kit a handler crate's own tests use, as they would use it; the suite's own helpers
// for the rest.
use dedup_worker::testing::{
    post_signed, stripe_event, test_settings, Backend, TestApp, TestDb, TEST_SECRET as SECRET,
};

use crate::helpers::{file_sink_ids, ledger_counts, pipeline_drained, wait_for, Transport};

/// Writes the ledger row first (so a rollback is observable), then fails for chosen ids.
struct Picky {
    /// Highest delivery attempt seen per event id.
    attempts: Mutex<HashMap<String, u32>>,
    /// Event ids that fail retryably this many times before succeeding.
    flaky_until: u32,
    /// When false, `evt_poison*` heals (for the redrive part).
    poison_active: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Handler for Picky {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let messages = LedgerHandler.handle(event, tx).await?;
        {
            let mut attempts = self.attempts.lock().unwrap();
            let n = attempts.entry(event.id.clone()).or_default();
            *n = (*n).max(event.delivery_attempt);
        }
        if event.id.starts_with("evt_poison")
            && self.poison_active.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(HandlerError::Fatal("poison".into()));
        }
        if event.id.starts_with("evt_flaky") && event.delivery_attempt <= self.flaky_until {
            return Err(HandlerError::Retryable(
                format!("delivery {} failed", event.delivery_attempt).into(),
            ));
        }
        if event.id.starts_with("evt_panic") {
            panic!("handler bug");
        }
        if event.id.starts_with("evt_doomed") {
            return Err(HandlerError::Retryable("never works".into()));
        }
        Ok(messages)
    }
}

async fn post(client: &reqwest::Client, app: &TestApp, id: &str) {
    let body = stripe_event(id, "customer.created");
    let r = post_signed(client, &app.url("/webhooks/stripe"), SECRET, body)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failures_on_postgres() {
    handler_failures(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failures_on_sqlite() {
    handler_failures(Backend::Sqlite).await;
}

async fn handler_failures(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let handler = Arc::new(Picky {
        attempts: Mutex::default(),
        flaky_until: 2,
        poison_active: true.into(),
    });
    let settings = test_settings(
        &db.url,
        &[
            ("outbox.sink", json!(format!("file:{}", sink.display()))),
            ("consumer.retry_base", json!("20ms")),
            ("consumer.retry_max", json!("100ms")),
            ("consumer.max_attempts", json!(4)),
            ("consumer.poll_interval", json!("50ms")),
            ("outbox.poll_interval", json!("50ms")),
        ],
    );
    let app = TestApp::spawn(settings.clone(), Service::new().handler(handler.clone())).await;
    let client = reqwest::Client::new();
    // One batch's worth, with the troublemakers in the middle.
    let mut ids: Vec<String> = (0..20).map(|i| format!("evt_ok_{i}")).collect();
    ids.insert(5, "evt_poison_1".into());
    ids.insert(10, "evt_flaky_1".into());
    ids.insert(15, "evt_doomed_1".into());
    ids.insert(18, "evt_panic_1".into());
    for id in &ids {
        post(&client, &app, id).await;
    }

    let store = Arc::new(app.store.clone());
    wait_for(
        "good and flaky events delivered, bad ones dead-lettered",
        Duration::from_secs(30),
        || {
            let (store, sink) = (store.clone(), sink.clone());
            async move {
                let delivered = file_sink_ids(&sink).len();
                let dead = store.dead_letters().list(10).await.unwrap().len();
                (delivered == 21 && dead == 3 && pipeline_drained(&store, "dedup.events").await)
                    .then_some(())
            }
        },
    )
    .await;

    let delivered = file_sink_ids(&sink);
    assert!(delivered.contains(&"evt_flaky_1".to_owned()));
    assert!(!delivered
        .iter()
        .any(|id| id.starts_with("evt_poison") || id.starts_with("evt_doomed")));
    let ledger = ledger_counts(&store).await;
    assert_eq!(
        ledger.get("evt_flaky_1"),
        Some(&1),
        "the retried event took effect once"
    );
    assert_eq!(
        ledger.get("evt_poison_1"),
        None,
        "a failed handler leaves no partial effect"
    );
    assert_eq!(ledger.get("evt_doomed_1"), None);
    assert!(ledger.values().all(|n| *n == 1));
    assert_eq!(handler.attempts.lock().unwrap()["evt_flaky_1"], 3);
    assert_eq!(
        handler.attempts.lock().unwrap()["evt_doomed_1"],
        4,
        "max_attempts deliveries"
    );

    let dead = store.dead_letters().list(10).await.unwrap();
    let poison = dead
        .iter()
        .find(|d| d.event_id == "evt_poison_1")
        .expect("poison dead-lettered");
    assert!(poison.error.contains("poison"));
    assert_eq!(poison.attempts, 1, "fatal errors are not retried");
    let doomed = dead
        .iter()
        .find(|d| d.event_id == "evt_doomed_1")
        .expect("doomed dead-lettered");
    assert_eq!(doomed.attempts, 4);
    let panicked = dead
        .iter()
        .find(|d| d.event_id == "evt_panic_1")
        .expect("a panic is dead-lettered");
    assert!(
        panicked.error.contains("handler panicked: handler bug"),
        "{}",
        panicked.error
    );

    // The poison is fixed; redrive it, and it is handled once.
    handler
        .poison_active
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let transport = dedup_worker_core::startup::build_transport(
        &settings,
        &store,
        Arc::new(dedup_worker_core::store::Wakeups::default()),
    )
    .await;
    let redriven = dedup_worker_core::dlq::redrive(&store, transport.as_ref(), &[poison.id], None)
        .await
        .unwrap();
    assert_eq!(redriven, 1);
    wait_for(
        "the redriven event to be delivered",
        Duration::from_secs(30),
        || {
            let sink = sink.clone();
            async move {
                file_sink_ids(&sink)
                    .contains(&"evt_poison_1".to_owned())
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(ledger_counts(&store).await.get("evt_poison_1"), Some(&1));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_accepted_work_on_restart() {
    // Accept events with the consumer off, stop, then start a consumer-only app: all arrive.
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let sink_value = json!(format!("file:{}", sink.display()));
    let ingress = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("roles.consumer", json!(false)),
                ("roles.relay", json!(false)),
            ],
        ),
        Service::new(),
    )
    .await;
    let client = reqwest::Client::new();
    for i in 0..30 {
        post(&client, &ingress, &format!("evt_later_{i}")).await;
    }
    ingress.stop().await;
    let worker = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("roles.ingress", json!(false)),
                ("outbox.sink", sink_value),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    wait_for(
        "the consumer to deliver everything",
        Duration::from_secs(30),
        || {
            let sink = sink.clone();
            async move { (file_sink_ids(&sink).len() == 30).then_some(()) }
        },
    )
    .await;
    // Without the ingress role the webhook route does not exist.
    let r = client
        .post(worker.url("/webhooks/stripe"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    worker.stop().await;
}

/// Two processes with three consumer workers each on one RabbitMQ queue, 800 events each
/// published four times in a shuffled order, in small batches: overlapping batches insert
/// their dedup rows in one global order, so PostgreSQL reports no deadlock; and if one step
/// still failed (a deadlock, a blip), its batch is given back at once rather than left
/// unacked on a live channel. The queue drains, and each event's handler effect exists once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_overlapping_duplicate_batches_drain_without_stalling() {
    use crate::helpers::{RunningBinary, TestQueue};
    use dedup_worker_core::queue::{OutgoingMessage, Transport as _};
    use futures::StreamExt;

    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq).await;
    let work = tempfile::tempdir().unwrap();
    let env = |role_ingress: &str| {
        vec![
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("DEDUP_TRANSPORT", "rabbitmq".to_owned()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("DEDUP_SINK", "log".to_owned()),
            ("DEDUP_ROLES__INGRESS", role_ingress.to_owned()),
            ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
            ("DEDUP_CONSUMER__WORKERS", "3".to_owned()),
            ("DEDUP_CONSUMER__BATCH_SIZE", "48".to_owned()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ]
    };
    // The first process declares the queue; the messages go in before anyone consumes.
    let first = RunningBinary::start(&env("true"), work.path());
    let publisher = queue.rabbit();
    // A fixed shuffle (an LCG): copies of one id land in different batches of both processes.
    let mut order: Vec<usize> = (0..3_200).map(|i| i % 800).collect();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..order.len()).rev() {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        order.swap(i, (seed >> 33) as usize % (i + 1));
    }
    futures::stream::iter(order)
        .map(|n| {
            let publisher = &publisher;
            async move {
                let id = format!("evt_contended_{n}");
                publisher
                    .publish(OutgoingMessage {
                        source: Some("stripe".into()),
                        message_id: Some(id.clone()),
                        message_type: Some("charge.succeeded".into()),
                        payload: stripe_event(&id, "charge.succeeded").into(),
                        traceparent: None,
                        stripe_signature: None,
                        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
                    })
                    .await
                    .expect("publish");
            }
        })
        .buffer_unordered(64)
        .collect::<()>()
        .await;
    publisher.close().await;
    let second = RunningBinary::start(&env("false"), work.path());

    let store = Arc::new(db.store().await);
    first
        .wait_for(
            "both processes to drain the queue",
            Duration::from_secs(90),
            || {
                let (store, queue) = (store.clone(), &queue);
                async move {
                    let ledger = ledger_counts(&store).await;
                    (ledger.len() == 800 && queue.drained(&store).await).then_some(())
                }
            },
        )
        .await;
    let ledger = ledger_counts(&store).await;
    assert!(ledger.values().all(|&n| n == 1), "a handler effect twice");
    let logged = format!("{}{}", first.stderr(), second.stderr());
    assert!(
        !logged.contains("deadlock detected"),
        "PostgreSQL reported a deadlock:\n{logged}"
    );
    drop((first, second));
    queue.cleanup().await;
}

/// Issue 9: a consumer step slower than its lease keeps its batch, because the consumer
/// extends the batch's leases (the database queue row's, SQS visibility) while the step runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_slower_than_its_lease_keeps_its_batch_on_the_database_queue() {
    a_step_slower_than_its_lease_keeps_its_batch(Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_slower_than_its_lease_keeps_its_batch_on_sqs() {
    let _emulator = crate::helpers::sqs_turn(crate::helpers::SqsLoad::Light).await;
    a_step_slower_than_its_lease_keeps_its_batch(Transport::Sqs).await;
}

/// The binary with two consumer workers and a 2 s lease. The test holds, in a transaction of its
/// own, the dedup row of one event, so the step that received it waits server-side on its
/// `INSERT … ON CONFLICT DO NOTHING` for three leases, as a slow batch would, with no hook in
/// the product. Meanwhile the other worker keeps consuming other events, yet never receives the
/// held one: had its lease lapsed, that worker would take it and wait on the same row, a second
/// backend blocked by the test. Once released, the event is handled once and nothing was
/// received twice.
async fn a_step_slower_than_its_lease_keeps_its_batch(transport: Transport) {
    use crate::helpers::{counter_value, HeldDedupRow, RunningBinary, TestQueue};

    const LEASE: Duration = Duration::from_secs(2);
    const HELD: &str = "evt_held_past_its_lease";
    let db = TestDb::new(Backend::Postgres).await;
    let store = Arc::new(db.store().await);
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_TRANSPORT", queue.kind().to_owned()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        ("DEDUP_CONSUMER__WORKERS", "2".to_owned()),
        ("DEDUP_CONSUMER__LEASE", format!("{}s", LEASE.as_secs())),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".to_owned()),
    ];
    let bin = RunningBinary::start(&env, work.path());
    let client = reqwest::Client::new();
    let post = |id: String| {
        let (client, url) = (client.clone(), bin.url("/webhooks/stripe"));
        async move {
            let body = stripe_event(&id, "charge.succeeded");
            let response = post_signed(&client, &url, SECRET, body).await.unwrap();
            assert_eq!(response.status(), 200, "{id}");
        }
    };

    let held = HeldDedupRow::hold(&db.url, "stripe", HELD).await;
    post(HELD.to_owned()).await;
    bin.wait_for(
        "a consumer step to wait on the held dedup row",
        Duration::from_secs(30),
        || async { (held.waiting().await == 1).then_some(()) },
    )
    .await;
    let free: Vec<String> = (0..5).map(|i| format!("evt_free_{i}")).collect();
    let held_since = std::time::Instant::now();
    let mut posted = 0;
    while held_since.elapsed() < LEASE * 3 {
        if let Some(id) = free.get(posted) {
            post(id.clone()).await;
            posted += 1;
        }
        assert_eq!(
            held.waiting().await,
            1,
            "{:?} into the held step, another consumer received its batch: the batch's lease \
             was not extended while the step ran; the binary logged:\n{}",
            held_since.elapsed(),
            bin.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The other worker was consuming all along (so it would have taken the held batch).
    bin.wait_for(
        "the other worker to handle the other events during the hold",
        Duration::from_secs(10),
        || {
            let delivered = file_sink_ids(&sink);
            let done = free.iter().all(|id| delivered.contains(id));
            async move { done.then_some(()) }
        },
    )
    .await;
    assert!(!file_sink_ids(&sink).contains(&HELD.to_owned()));
    held.release().await;

    bin.wait_for(
        "every event at the sink and the queue drained",
        Duration::from_secs(30),
        || {
            let (store, sink, queue, events) =
                (store.clone(), sink.clone(), &queue, free.len() + 1);
            async move {
                (file_sink_ids(&sink).len() == events && queue.drained(&store).await).then_some(())
            }
        },
    )
    .await;
    let metrics = client
        .get(bin.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        counter_value(&metrics, "dedup_events_received_total"),
        free.len() as u64 + 1,
        "each event received once"
    );
    assert_eq!(counter_value(&metrics, "dedup_events_duplicate_total"), 0);
    assert_eq!(
        counter_value(&metrics, "dedup_events_handled_total"),
        free.len() as u64 + 1
    );
    let mut delivered = file_sink_ids(&sink);
    delivered.sort();
    delivered.dedup();
    assert_eq!(
        delivered.len(),
        free.len() + 1,
        "each event at the sink once"
    );
    drop(bin);
    queue.cleanup().await;
}
