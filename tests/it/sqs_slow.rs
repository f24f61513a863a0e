//! SQS keeps draining when its calls are slow (issue 26, item 7). Every call goes through
//! [`SqsCalls`] (counting each operation's calls and how many overlapped) and then the fault
//! proxy, which adds latency to every round trip, in front of the emulator:
//! * a backlog of 500 events, every SQS call 400 ms late, two consumer processes: all 500 reach
//!   the sink once each, and no lease lapses (no message is handed out again);
//! * the same backlog with no added latency (the emulator's own slowness on a deep queue);
//! * one fill of 256 and its visibility changes and deletes, each 26 calls of ten, go out side
//!   by side (a few round trips deep, not 26);
//! * a fill stops gathering once its time budget (a quarter of the lease) is spent and returns
//!   what it holds;
//! * a fill kept waiting past the lease (its later calls held back) keeps the pages it holds
//!   leased meanwhile: none of them is received a second time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_worker_core::queue::sqs::{CALLS_AT_ONCE, FILL_BUDGET_PER_LEASE};
use dedup_worker_core::queue::{Delivery, OutgoingMessage, SqsQueue, Transport as _};
use futures::stream::{self, StreamExt};

use crate::helpers::fault_proxy::FaultProxy;
use crate::helpers::sqs_calls::SqsCalls;
use crate::helpers::{
    file_sink_ids, ledger_counts, poll_until, sqs_turn, stripe_event, Backend, RunningBinary,
    SqsLoad, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_sqs_slow";

/// The emulator's endpoint, which scripts/test.sh exports.
fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (moto_server; see scripts/test.sh)")
}

/// `host:port` of `url`.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// The emulator behind the counting proxy, behind the fault proxy:
/// SDK → [`SqsCalls`] → [`FaultProxy`] → moto_server.
struct SlowSqs {
    faults: FaultProxy,
    calls: SqsCalls,
}

impl SlowSqs {
    /// Every round trip `latency` late each way.
    async fn start(latency: Duration) -> Self {
        let faults = FaultProxy::start(&authority(&endpoint())).await;
        faults.set_latency(latency);
        let calls = SqsCalls::start(&format!("http://127.0.0.1:{}", faults.port)).await;
        SlowSqs { faults, calls }
    }

    /// A client that reaches the emulator through both proxies.
    async fn client(&self) -> aws_sdk_sqs::Client {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(self.calls.url())
            .load()
            .await;
        aws_sdk_sqs::Client::new(&config)
    }
}

/// The event `i` of the backlog, as the ingress publishes it.
fn event(i: usize) -> OutgoingMessage {
    let id = format!("evt_slow_{i:04}");
    OutgoingMessage {
        source: Some("stripe".into()),
        message_type: Some("invoice.paid".into()),
        payload: stripe_event(&id, "invoice.paid").into(),
        message_id: Some(id),
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    }
}

/// Publishes `count` events straight to the queue (not through the proxies).
async fn backlog(queue: &TestQueue, count: usize) {
    let client = queue.sqs_client().expect("sqs client").clone();
    let producer = SqsQueue::with_client(client, queue.name.clone(), Duration::from_secs(30));
    let producer = &producer;
    let published: Vec<_> = stream::iter(0..count)
        .map(|i| async move { producer.publish(event(i)).await })
        .buffer_unordered(8)
        .collect()
        .await;
    assert!(published.iter().all(Result::is_ok), "backlog published");
}

/// A consumer process on the queue, its SQS calls through `sqs`, delivering to its own file.
fn consumer_process(
    db: &TestDb,
    queue: &TestQueue,
    sqs: &SlowSqs,
    sink: &std::path::Path,
    work: &std::path::Path,
) -> RunningBinary {
    RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_TRANSPORT", "sqs".into()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("AWS_ENDPOINT_URL", sqs.calls.url()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
        ],
        work,
    )
}

/// A backlog of `count` events drained by two consumer processes (default batch of 256, lease
/// of 10 s, two workers each) whose every SQS call is `2 × latency` late: every event at the
/// sink and in the handler's table once, within `deadline` (the time taken is printed).
async fn drain_with_two_processes(count: usize, latency: Duration, deadline: Duration) {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    let work = tempfile::tempdir().unwrap();
    backlog(&queue, count).await;
    let sqs = SlowSqs::start(latency).await;
    let sinks = [work.path().join("a.jsonl"), work.path().join("b.jsonl")];
    let started = Instant::now();
    let processes: Vec<RunningBinary> = sinks
        .iter()
        .map(|sink| consumer_process(&db, &queue, &sqs, sink, work.path()))
        .collect();
    let store = Arc::new(db.store().await);
    let delivered = || {
        sinks
            .iter()
            .flat_map(|s| file_sink_ids(s))
            .collect::<Vec<_>>()
    };
    let drained = poll_until(deadline, || {
        let (store, queue, done) = (store.clone(), &queue, delivered().len() >= count);
        async move { (done && queue.drained(&store).await).then_some(()) }
    })
    .await;
    let took = started.elapsed();
    let mut at_sink: HashMap<String, usize> = HashMap::new();
    for id in delivered() {
        *at_sink.entry(id).or_default() += 1;
    }
    let ledger = ledger_counts(&store).await;
    let (receives, deletes) = (
        sqs.calls.calls("ReceiveMessage"),
        sqs.calls.calls("DeleteMessageBatch"),
    );
    eprintln!(
        "{count} events, SQS calls {:?} late: {} distinct at the sink, {} handled, {} handed out again, after \
         {took:?}; ReceiveMessage {receives:?}, DeleteMessageBatch {deletes:?}",
        sqs.faults.latency() * 2,
        at_sink.len(),
        ledger.len(),
        sqs.calls.redeliveries(),
    );
    if std::env::var("SQS_SLOW_DEBUG").is_ok() {
        for p in &processes {
            eprintln!("=== process log\n{}", p.stderr());
        }
    }
    assert!(
        drained.is_some(),
        "not drained within {deadline:?}: {} of {count} events at the sink, {} handled; the first \
         process logged:\n{}",
        at_sink.len(),
        ledger.len(),
        processes[0].stderr()
    );
    assert_eq!(at_sink.len(), count, "every event at the sink");
    // Before the fix no fill ever committed: every page came back, again and again. Now a lease
    // lapses only where the emulator answers a heartbeat's visibility changes slower than the
    // heartbeat's period (on some machines it takes seconds for ten handles with hundreds
    // queued): a few messages, never a stall. A heartbeat that resumes where a cut one stopped
    // would make this zero (left open, see the issue 26 note).
    assert!(
        sqs.calls.redeliveries() * 20 <= count,
        "leases lapsed for {} of {count} messages (at most 1 in 20 may be handed out again)",
        sqs.calls.redeliveries()
    );
    let repeated: Vec<_> = at_sink.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "delivered more than once: {repeated:?}"
    );
    assert_eq!(ledger.len(), count, "every event handled");
    assert!(ledger.values().all(|n| *n == 1), "each event handled once");
    drop(processes);
    queue.cleanup().await;
}

/// The reproduction: before the fix, each fill of 256 took 26 calls one after another,
/// over 10 s at 400 ms a call, so the first pages' leases ran out before their batch committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_500_with_every_call_400_ms_late_drains_through_two_processes() {
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    drain_with_two_processes(500, Duration::from_millis(200), Duration::from_secs(120)).await;
}

/// No latency added: the emulator's own calls slow down as its queue deepens (and far more once
/// leases lapse and messages come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_500_on_the_emulator_alone_drains_through_two_processes() {
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    drain_with_two_processes(500, Duration::ZERO, Duration::from_secs(120)).await;
}

/// The transport on the test's queue, reached through `sqs`, with `lease`.
async fn transport(queue: &TestQueue, sqs: &SlowSqs, lease: Duration) -> SqsQueue {
    SqsQueue::with_client(sqs.client().await, queue.name.clone(), lease)
}

fn tags(deliveries: &[Delivery]) -> Vec<dedup_worker_core::queue::DeliveryTag> {
    deliveries.iter().map(|d| d.tag.clone()).collect()
}

/// A fill of 256, then a heartbeat and the acks of the whole batch, every call 400 ms late:
/// each is 26 calls of ten, and they overlap ([`CALLS_AT_ONCE`] at a time), so each is seven
/// round trips deep, not 26.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_its_heartbeat_and_its_acks_send_their_calls_side_by_side() {
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    backlog(&queue, 300).await;
    let sqs = SlowSqs::start(Duration::from_millis(200)).await;
    // A long lease: the fill's budget (a quarter of it) is not what ends this fill.
    let consumer = transport(&queue, &sqs, Duration::from_secs(60)).await;

    let batch = consumer
        .receive(256, Duration::from_secs(1))
        .await
        .expect("receive");
    let receives = sqs.calls.calls("ReceiveMessage");
    let lost = consumer
        .extend_leases(&tags(&batch), Duration::from_secs(60))
        .await
        .expect("extend");
    assert!(lost.is_empty(), "{lost:?}");
    let extends = sqs.calls.calls("ChangeMessageVisibilityBatch");
    consumer.ack(&tags(&batch)).await.expect("ack");
    let deletes = sqs.calls.calls("DeleteMessageBatch");
    eprintln!(
        "a fill of {}: ReceiveMessage {receives:?}, ChangeMessageVisibilityBatch {extends:?}, \
         DeleteMessageBatch {deletes:?}",
        batch.len()
    );
    // The emulator's overlapping receives may hand one message to two of them: the fill keeps
    // it once, so a batch may be a message or two short.
    assert!(batch.len() > 250, "a full batch: {receives:?}");
    assert_eq!(receives.total, 26, "{receives:?}");
    let chunks = batch.len().div_ceil(10);
    for (what, calls) in [
        ("ReceiveMessage", receives),
        ("ChangeMessageVisibilityBatch", extends),
        ("DeleteMessageBatch", deletes),
    ] {
        assert!(calls.total >= chunks, "{what}: {calls:?}");
        // One after another, calls never overlap.
        assert_eq!(calls.max_in_flight, CALLS_AT_ONCE, "{what}: {calls:?}");
    }
    let rest = consumer
        .receive(256, Duration::from_secs(1))
        .await
        .expect("receive the rest");
    assert_eq!(batch.len() + rest.len(), 300, "the acked ones are gone");
    consumer.ack(&tags(&rest)).await.expect("ack the rest");
    assert_eq!(sqs.calls.redeliveries(), 0);
    queue.cleanup().await;
}

/// Every call 1.4 s late and a lease of 4 s: the fill's budget (1 s from its first page) is
/// spent by the time its first calls after the first page return, so it returns what it holds
/// then rather than gather a full batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_returns_what_it_holds_once_its_budget_is_spent() {
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    backlog(&queue, 300).await;
    let sqs = SlowSqs::start(Duration::from_millis(700)).await;
    let lease = Duration::from_secs(4);
    assert_eq!(lease / FILL_BUDGET_PER_LEASE, Duration::from_secs(1));
    let consumer = transport(&queue, &sqs, lease).await;

    let batch = consumer
        .receive(256, Duration::from_secs(1))
        .await
        .expect("receive");
    let receives = sqs.calls.calls("ReceiveMessage");
    eprintln!("a fill of {} in {receives:?}", batch.len());
    // The first page, then the calls started at once after it; none after them.
    assert_eq!(receives.total, 1 + CALLS_AT_ONCE, "{receives:?}");
    assert!(
        batch.len() > 10 && batch.len() <= 10 * (1 + CALLS_AT_ONCE),
        "more than the first page, less than a full batch: {} in {receives:?}",
        batch.len()
    );
    assert_eq!(sqs.calls.redeliveries(), 0, "no page's lease lapsed");
    consumer.ack(&tags(&batch)).await.expect("ack");
    queue.cleanup().await;
}

/// A fill whose second call is held back 3 s, past its 2-s lease: the first page it holds is
/// extended meanwhile, so none of it comes back to be received a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_longer_than_the_lease_keeps_what_it_holds() {
    let _emulator = sqs_turn(SqsLoad::Light).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    backlog(&queue, 30).await;
    let sqs = SlowSqs::start(Duration::ZERO).await;
    sqs.calls.delay_short_polls(Duration::from_secs(3));
    let consumer = transport(&queue, &sqs, Duration::from_secs(2)).await;

    // Twenty: the first page, then one call (two at once could both be handed one message by
    // the emulator).
    let batch = consumer
        .receive(20, Duration::from_secs(1))
        .await
        .expect("receive");
    let extends = sqs.calls.calls("ChangeMessageVisibilityBatch");
    let attempts: Vec<u32> = batch.iter().map(|d| d.attempts).collect();
    eprintln!(
        "a fill of {} with {:?}; ChangeMessageVisibilityBatch {extends:?}",
        batch.len(),
        attempts
    );
    assert_eq!(batch.len(), 20, "twenty messages: {attempts:?}");
    assert!(
        attempts.iter().all(|n| *n == 1),
        "no message was received twice: {attempts:?}"
    );
    assert_eq!(sqs.calls.redeliveries(), 0);
    assert!(extends.total >= 1, "{extends:?}");
    consumer.ack(&tags(&batch)).await.expect("ack");
    queue.cleanup().await;
}
