//! SIGKILL while events are in flight, on both stores: after a restart, no event that got a
//! 2xx is missing, no handler effect happened twice, and every sink (re)delivery of an event
//! carries the same `Idempotency-Key` (the event id). 1,500 events; 300 over SQS, whose
//! emulator (moto_server) slows down in proportion to the queue's depth on every call.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    ledger_counts, post_signed, stripe_event, wait_for, Backend, Receiver, RunningBinary, TestDb,
    TestQueue, Transport,
};
use futures::stream::{self, StreamExt};

const SECRET: &str = "whsec_crash";
/// Events sent per test.
fn events(transport: Transport) -> usize {
    match transport {
        Transport::Sqs => 300,
        Transport::Database | Transport::Rabbitmq => 1500,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_postgres() {
    sigkill_mid_flight(Backend::Postgres, Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_postgres_and_sqs() {
    sigkill_mid_flight(Backend::Postgres, Transport::Sqs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_postgres_and_rabbitmq() {
    sigkill_mid_flight(Backend::Postgres, Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_sqlite() {
    sigkill_mid_flight(Backend::Sqlite, Transport::Database).await;
}

fn env(db: &TestDb, receiver: &Receiver, queue: &TestQueue) -> Vec<(&'static str, String)> {
    vec![
        ("DEDUP_TRANSPORT", queue.kind().into()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        ("DEDUP_SINK", receiver.url()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
        // Short leases so that work the killed process held comes back quickly.
        ("DEDUP_CONSUMER__LEASE_SECS", "2".into()),
        ("DEDUP_OUTBOX__LEASE_SECS", "2".into()),
        ("DEDUP_OUTBOX__HTTP_TIMEOUT_MS", "500".into()),
        ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "100".into()),
        ("DEDUP_OUTBOX__POLL_INTERVAL_MS", "100".into()),
        ("DEDUP_CONSUMER__BATCH_SIZE", "50".into()),
        ("DEDUP_OUTBOX__BATCH_SIZE", "50".into()),
    ]
}

async fn sigkill_mid_flight(backend: Backend, transport: Transport) {
    let events = events(transport);
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(transport).await;
    let queue_ref = &queue;
    let work = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut bin = RunningBinary::start(&env(&db, &receiver, &queue), work.path());

    let ids: Vec<String> = (0..events).map(|i| format!("evt_crash_{i:05}")).collect();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let answered = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    let sender = {
        let (ids, acked, answered, client) =
            (ids.clone(), acked.clone(), answered.clone(), client.clone());
        tokio::spawn(async move {
            stream::iter(ids)
                .for_each_concurrent(32, |id| {
                    let (acked, answered, client, url) =
                        (acked.clone(), answered.clone(), client.clone(), url.clone());
                    async move {
                        let body = stripe_event(&id, "charge.succeeded");
                        let result = post_signed(&client, &url, SECRET, body).await;
                        if matches!(&result, Ok(r) if r.status().is_success()) {
                            acked.lock().unwrap().insert(id);
                        }
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .await;
        })
    };

    // Kill once a third has been answered: requests, consumer batches and relay deliveries are
    // all in flight at that moment.
    wait_for(
        "a third of the events to be answered",
        Duration::from_secs(60),
        || async { (answered.load(Ordering::SeqCst) >= events / 3).then_some(()) },
    )
    .await;
    bin.kill();
    sender.await.unwrap();
    let acked: HashSet<String> = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty() && acked.len() < events,
        "the kill landed mid-flight ({} acked)",
        acked.len()
    );

    // Restart on the same database; the provider retries what did not get a 2xx, plus some
    // duplicates of what did.
    let bin = RunningBinary::start(&env(&db, &receiver, &queue), work.path());
    let url = bin.url("/webhooks/stripe");
    let retries: Vec<String> = ids
        .iter()
        .filter(|id| !acked.contains(*id))
        .chain(acked.iter().take(50))
        .cloned()
        .collect();
    let statuses: Vec<u16> = stream::iter(retries)
        .map(|id| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let body = stripe_event(&id, "charge.succeeded");
                let r = post_signed(&client, &url, SECRET, body)
                    .await
                    .expect("send");
                r.status().as_u16()
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 200));

    let store = Arc::new(db.store().await);
    bin.wait_for(
        "every event to reach the sink",
        Duration::from_secs(180),
        || {
            let store = store.clone();
            let received = receiver.snapshot();
            async move {
                let distinct: HashSet<String> = received.iter().map(|r| body_id(&r.body)).collect();
                (distinct.len() == events && queue_ref.drained(&store).await).then_some(())
            }
        },
    )
    .await;

    let received = receiver.snapshot();
    let mut deliveries: HashMap<String, Vec<Option<String>>> = HashMap::new();
    for r in &received {
        deliveries
            .entry(body_id(&r.body))
            .or_default()
            .push(r.idempotency_key.clone());
    }
    for id in &acked {
        assert!(
            deliveries.contains_key(id),
            "{id} got a 2xx before the crash and is missing"
        );
    }
    for (id, keys) in &deliveries {
        assert!(
            keys.iter().all(|k| k.as_deref() == Some(id.as_str())),
            "{id}: every delivery carries Idempotency-Key = event id, got {keys:?}"
        );
    }
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.len(), events);
    let doubled: Vec<_> = ledger.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "handler effects happened twice: {doubled:?}"
    );
    let redelivered = received.len() - deliveries.len();
    eprintln!(
        "acked before kill: {}, sink redeliveries after restart: {redelivered}",
        acked.len()
    );
    drop(bin);
    queue.cleanup().await;
}

fn body_id(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).expect("sink body is the event JSON");
    v["id"].as_str().expect("id").to_owned()
}
