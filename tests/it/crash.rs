//! SIGKILL while events are in flight, on both stores: after a restart, no event that got a
//! 2xx is missing, no handler effect happened twice, and every sink (re)delivery of an event
//! carries the same `Idempotency-Key` (the event id). 1,500 events; 120 over SQS, whose
//! emulator (moto_server) slows down in proportion to the queue's depth on every call.
//!
//! The leases are the defaults (10 s, heartbeated): every event acknowledged before the kill is
//! at the sink within 15 s of the restart (25 s over the SQS emulator), though the killed process
//! held some of them leased.
//! After SIGTERM, with the sink hanging so that the relay cannot finish in the grace period,
//! the process gives back what it held, and every acknowledged event is at the sink within 12 s
//! of the restart: sooner than any of its 30-s leases would let it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::{
    dedup_command, ledger_counts, poll_until, post_signed, post_signed_until_not_503, sqs_turn,
    stripe_event, wait_for, Backend, Receiver, RunningBinary, SqsLoad, TestDb, TestQueue,
    Transport,
};
use futures::stream::{self, StreamExt};

const SECRET: &str = "whsec_crash";
/// After SIGKILL, every acknowledged event is at the sink within this of the restart: the
/// default lease (10 s) plus time to process the backlog. On SQS the backlog takes longer: the
/// emulator answers each receive in time proportional to the queue's depth, in one Python
/// process the whole suite shares, so under the suite's load a backlog of the killed process's
/// leased messages and the provider's retries takes up to ten seconds more. (The bound shows
/// that the leases lapse and are taken up, not how fast the emulator is: without it the wait
/// below would be the 180-s drain.)
fn after_sigkill(transport: Transport) -> Duration {
    match transport {
        Transport::Sqs => Duration::from_secs(25),
        Transport::Database | Transport::Rabbitmq => Duration::from_secs(15),
    }
}
/// After SIGTERM, within this: nothing waits out a lease ([`SIGTERM_LEASE`]).
const AFTER_SIGTERM: Duration = Duration::from_secs(12);
/// The consumer's and the relay's lease in the SIGTERM test: long beside [`AFTER_SIGTERM`], so
/// an event that waited out a lease cannot make the bound, and the bound still leaves a loaded
/// machine room (5 s under a 10-s lease failed once while another build shared the two cores).
const SIGTERM_LEASE: &str = "30s";
/// Events sent per test.
///
/// Fewer on SQS: the emulator (moto) scans the whole queue several times per `ReceiveMessage`,
/// so a receive from a queue 300 deep takes about half a second of its single Python process,
/// and a backlog that deep is drained too slowly for the bounds under test.
fn events(transport: Transport) -> usize {
    match transport {
        Transport::Sqs => 120,
        Transport::Database | Transport::Rabbitmq => 1500,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_postgres() {
    sigkill_mid_flight(Backend::Postgres, Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_loses_nothing_acknowledged_on_postgres_and_sqs() {
    // Heavy: two backlogs at once in the emulator's one Python process slow both past the
    // bounds under test (see [`events`]).
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
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

/// Events posted 32 at a time in the background, each acknowledged one recorded.
struct Load {
    acked: Arc<Mutex<HashSet<String>>>,
    answered: Arc<AtomicUsize>,
    sender: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(client: &reqwest::Client, url: String, ids: Vec<String>) -> Load {
        let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
        let answered = Arc::new(AtomicUsize::new(0));
        let sender = {
            let (acked, answered, client) = (acked.clone(), answered.clone(), client.clone());
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
        Load {
            acked,
            answered,
            sender,
        }
    }

    /// Waits until a third of `events` has been answered: requests, consumer batches and relay
    /// deliveries are all in flight then.
    async fn wait_for_a_third(&self, events: usize) {
        wait_for(
            "a third of the events to be answered",
            Duration::from_secs(60),
            || async { (self.answered.load(Ordering::SeqCst) >= events / 3).then_some(()) },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_gives_back_what_it_held_on_postgres() {
    sigterm_under_load(Backend::Postgres, Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_gives_back_what_it_held_on_postgres_and_sqs() {
    // Heavy: two backlogs at once in the emulator's one Python process slow both past the
    // bounds under test (see [`events`]).
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    sigterm_under_load(Backend::Postgres, Transport::Sqs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_gives_back_what_it_held_on_sqlite() {
    sigterm_under_load(Backend::Sqlite, Transport::Database).await;
}

fn env(db: &TestDb, receiver: &Receiver, queue: &TestQueue) -> Vec<(&'static str, String)> {
    vec![
        ("DEDUP_TRANSPORT", queue.kind().into()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        ("DEDUP_SINK", receiver.url()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
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
    let client = reqwest::Client::new();
    let load = Load::start(&client, bin.url("/webhooks/stripe"), ids.clone());

    load.wait_for_a_third(events).await;
    bin.kill();
    load.sender.await.unwrap();
    let acked: HashSet<String> = load.acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty() && acked.len() < events,
        "the kill landed mid-flight ({} acked)",
        acked.len()
    );

    // Restart on the same database; the provider retries what did not get a 2xx, plus some
    // duplicates of what did, while what was acknowledged comes through.
    let bin = RunningBinary::start(&env(&db, &receiver, &queue), work.path());
    let restarted = Instant::now();
    let url = bin.url("/webhooks/stripe");
    let retries: Vec<String> = ids
        .iter()
        .filter(|id| !acked.contains(*id))
        .chain(acked.iter().take(50))
        .cloned()
        .collect();
    let resend = tokio::spawn(async move {
        stream::iter(retries)
            .map(|id| {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    // A 503 is "not now" (a publish slower than its timeout on a loaded
                    // machine), and Stripe retries it.
                    let body = stripe_event(&id, "charge.succeeded");
                    let r = post_signed_until_not_503(&client, &url, SECRET, body).await;
                    r.status().as_u16()
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<u16>>()
            .await
    });
    let within = after_sigkill(transport);
    wait_for_acked_at_sink(&bin, &receiver, &acked, restarted, within).await;
    let statuses = resend.await.unwrap();
    assert!(statuses.iter().all(|s| *s == 200));

    let store = Arc::new(db.store().await);
    let arrived = poll_until(Duration::from_secs(180), || {
        let store = store.clone();
        let received = receiver.snapshot();
        async move {
            let distinct: HashSet<String> = received.iter().map(|r| body_id(&r.body)).collect();
            (distinct.len() == events && queue_ref.drained(&store).await).then_some(())
        }
    })
    .await;
    if arrived.is_none() {
        panic!(
            "{}",
            not_at_the_sink(&db, &receiver, &queue, &store, &ids, &bin).await
        );
    }

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

/// Why the pipeline did not drain: each event not at the sink, with what the store recorded of
/// it (`events show`, for the first few), whether the queue is empty, and the binary's log.
async fn not_at_the_sink(
    db: &TestDb,
    receiver: &Receiver,
    queue: &TestQueue,
    store: &dedup_worker_core::store::Store,
    ids: &[String],
    bin: &RunningBinary,
) -> String {
    let received: HashSet<String> = receiver
        .snapshot()
        .iter()
        .map(|r| body_id(&r.body))
        .collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !received.contains(*id)).collect();
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
    ];
    let mut told = format!(
        "timed out after 180 s waiting for every event at the sink and the queue drained \
         (drained: {}); {} of {} not at the sink: {:?}\n",
        queue.drained(store).await,
        missing.len(),
        ids.len(),
        missing.iter().take(20).collect::<Vec<_>>()
    );
    for id in missing.iter().take(5) {
        let shown = dedup_command(&env)
            .args(["events", "show", id.as_str()])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_else(|e| format!("events show failed: {e}"));
        told.push_str(&format!("events show {id}:\n{shown}\n"));
    }
    told.push_str(&format!("the binary logged:\n{}", bin.stderr()));
    told
}

/// SIGTERM while events are posted and the sink hangs: the relay's step cannot finish in the
/// grace period (2 s here), so it is abandoned and its rows not yet marked are made due at
/// once; the consumer finishes or gives back its batch. After a restart, every acknowledged
/// event is at the sink within [`AFTER_SIGTERM`], sooner than any lease it held could lapse,
/// and no handler effect happened twice.
async fn sigterm_under_load(backend: Backend, transport: Transport) {
    let events = events(transport);
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut env = env(&db, &receiver, &queue);
    env.push(("DEDUP_SHUTDOWN__GRACE", "2s".into()));
    env.push(("DEDUP_CONSUMER__LEASE", SIGTERM_LEASE.into()));
    env.push(("DEDUP_OUTBOX__LEASE", SIGTERM_LEASE.into()));
    let mut bin = RunningBinary::start(&env, work.path());

    let ids: Vec<String> = (0..events).map(|i| format!("evt_term_{i:05}")).collect();
    let client = reqwest::Client::new();
    let load = Load::start(&client, bin.url("/webhooks/stripe"), ids);
    load.wait_for_a_third(events).await;
    // The sink stops answering: the relay's batch hangs mid-delivery, part of it sent, the rest
    // waiting for a free connection.
    let before = receiver.snapshot().len();
    receiver.delay_answers(Duration::from_secs(120));
    wait_for(
        "the relay to deliver into the hanging sink",
        Duration::from_secs(30),
        || {
            let now = receiver.snapshot().len();
            async move { (now > before).then_some(()) }
        },
    )
    .await;
    let stopping = Instant::now();
    bin.terminate();
    let status = bin.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}; it logged:\n{}", bin.stderr());
    let stopped_after = stopping.elapsed();
    load.sender.await.unwrap();
    let acked: HashSet<String> = load.acked.lock().unwrap().clone();
    assert!(!acked.is_empty(), "events were acknowledged before SIGTERM");

    receiver.delay_answers(Duration::ZERO);
    let bin = RunningBinary::start(&env, work.path());
    let restarted = Instant::now();
    wait_for_acked_at_sink(&bin, &receiver, &acked, restarted, AFTER_SIGTERM).await;
    eprintln!("exited {stopped_after:?} after SIGTERM");

    let store = db.store().await;
    let ledger = ledger_counts(&store).await;
    let doubled: Vec<_> = ledger.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "handler effects happened twice: {doubled:?}"
    );
    for id in &acked {
        assert!(
            ledger.contains_key(id),
            "{id} was acknowledged and not handled"
        );
    }
    drop(bin);
    queue.cleanup().await;
}

/// Waits until every id in `acked` has reached the sink, failing if that takes longer than
/// `within` from `since`.
async fn wait_for_acked_at_sink(
    bin: &RunningBinary,
    receiver: &Receiver,
    acked: &HashSet<String>,
    since: Instant,
    within: Duration,
) {
    let deadline = within.saturating_sub(since.elapsed());
    bin.wait_for(
        &format!("every acknowledged event at the sink within {within:?} of the restart"),
        deadline,
        || {
            let received = receiver.snapshot();
            async move {
                let at_sink: HashSet<String> = received.iter().map(|r| body_id(&r.body)).collect();
                acked.iter().all(|id| at_sink.contains(id)).then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "{} acknowledged events at the sink {:?} after the restart",
        acked.len(),
        since.elapsed()
    );
}

fn body_id(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).expect("sink body is the event JSON");
    v["id"].as_str().expect("id").to_owned()
}
