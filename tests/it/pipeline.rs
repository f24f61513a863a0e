//! End to end through the real binary, on both stores: 1,000 distinct events delivered with
//! 30 % duplicates (some as 20 concurrent copies of one event) reach the file sink once each,
//! and the example handler's table holds exactly one row per event. The same over RabbitMQ,
//! and over SQS with 300 events: the emulator, moto_server, spends time proportional to the
//! queue's depth on every call (about a second per receive at 1,000 messages), which measures
//! moto rather than us. And an idle SQS pipeline long-polls: a few `ReceiveMessage` calls in
//! ten seconds (counted by a proxy in front of the emulator), an event arriving during a poll
//! is still handled at once, and SIGTERM stops it within seconds although its polls are pending.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use crate::helpers::sqs_calls::SqsCalls;
use crate::helpers::{
    file_sink_ids, ledger_counts, post_signed, post_signed_until_not_503, sqs_turn, stripe_event,
    Backend, RunningBinary, SqsLoad, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_pipeline";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_events_with_duplicates_once_each_on_sqlite() {
    events_with_duplicates_once_each(Backend::Sqlite, Transport::Database, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_events_with_duplicates_once_each_on_postgres() {
    events_with_duplicates_once_each(Backend::Postgres, Transport::Database, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_events_with_duplicates_once_each_on_postgres_and_sqs() {
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    events_with_duplicates_once_each(Backend::Postgres, Transport::Sqs, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_events_with_duplicates_once_each_on_postgres_and_rabbitmq() {
    events_with_duplicates_once_each(Backend::Postgres, Transport::Rabbitmq, 1000).await;
}

async fn events_with_duplicates_once_each(backend: Backend, transport: Transport, events: usize) {
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
        ],
        work.path(),
    );

    // Of 1,000 events, 10 arrive as 20 concurrent copies (190 extra deliveries) and 110 others
    // arrive twice: 300 duplicate deliveries in all (30 %, and the same shares for fewer).
    let storms = events / 100;
    let doubles = events * 3 / 10 - storms * 19;
    let ids: Vec<String> = (0..events).map(|i| format!("evt_pipe_{i:04}")).collect();
    let payloads: HashMap<&str, Vec<u8>> = ids
        .iter()
        .map(|id| (id.as_str(), stripe_event(id, "invoice.paid")))
        .collect();
    let mut singles: Vec<&str> = ids[storms..].iter().map(String::as_str).collect();
    singles.extend(ids[storms..storms + doubles].iter().map(String::as_str));
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");

    // On SQS the emulator is the bottleneck: moto answers one call at a time, each slower as the
    // queue fills, so on a busy machine a `SendMessage` can outlast
    // `transport.publish_timeout` and the ingress rightly answers 503. There the sender does
    // what Stripe does and sends again, and the once-each checks below then also cover a publish
    // that landed after its 503 (its retry is the same event id). On the database queue and
    // RabbitMQ every first delivery must be accepted.
    let resend_503 = transport == Transport::Sqs;
    let resent = AtomicUsize::new(0);
    let send = |id: &str| {
        let body = payloads[id].clone();
        let (client, url, resent) = (&client, &url, &resent);
        async move {
            let status = post_signed(client, url, SECRET, body.clone())
                .await
                .map(|r| r.status().as_u16());
            if resend_503 && matches!(status, Ok(503)) {
                resent.fetch_add(1, Ordering::Relaxed);
                return Ok(post_signed_until_not_503(client, url, SECRET, body)
                    .await
                    .status()
                    .as_u16());
            }
            status
        }
    };

    // The storm of copies first, each group of 20 all at once.
    for id in &ids[..storms] {
        let copies: Vec<_> = (0..20).map(|_| send(id)).collect();
        for status in futures::future::join_all(copies).await {
            assert_eq!(status.expect("request"), 200);
        }
    }
    let statuses: Vec<_> = stream::iter(singles.iter().map(|id| send(id)))
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(statuses.len(), events - storms + doubles);
    eprintln!(
        "{} deliveries answered 503 and were sent again",
        resent.load(Ordering::Relaxed)
    );
    let refused: Vec<_> = statuses.iter().filter(|s| !matches!(s, Ok(200))).collect();
    assert!(
        refused.is_empty(),
        "every delivery accepted; {} were not: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );

    let store = Arc::new(db.store().await);
    let queue_ref = &queue;
    bin.wait_for("the pipeline to drain", Duration::from_secs(180), || {
        let store = store.clone();
        let sink = sink.clone();
        async move {
            let queue = queue_ref;
            (queue.drained(&store).await && file_sink_ids(&sink).len() >= events).then_some(())
        }
    })
    .await;

    let mut seen: HashMap<String, usize> = HashMap::new();
    for id in file_sink_ids(&sink) {
        *seen.entry(id).or_default() += 1;
    }
    assert_eq!(seen.len(), events, "every event reached the sink");
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "events delivered more than once: {repeated:?}"
    );

    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.len(), events);
    assert!(
        ledger.values().all(|n| *n == 1),
        "one handler effect per event"
    );
    drop(bin);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sqs_consumer_long_polls_yet_handles_an_arrival_at_once_and_stops_on_sigterm() {
    let _emulator = sqs_turn(SqsLoad::Light).await;
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let proxy = SqsCalls::start(
        &std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (scripts/test.sh sets it)"),
    )
    .await;
    // Default consumer settings (four workers, a 500 ms poll interval), SQS through the proxy.
    let mut bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("AWS_ENDPOINT_URL", proxy.url()),
        ],
        work.path(),
    );
    bin.wait_for("the consumer's first poll", Duration::from_secs(30), || {
        std::future::ready((proxy.calls("ReceiveMessage").total >= 1).then_some(()))
    })
    .await;

    // The deliberate idle window being measured. Short polling sends hundreds of calls in it.
    let before = proxy.calls("ReceiveMessage").total;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_calls = proxy.calls("ReceiveMessage").total - before;
    assert!(
        idle_calls <= 4,
        "{idle_calls} ReceiveMessage calls in 10 idle seconds; the binary logged:\n{}",
        bin.stderr()
    );

    // Both workers are inside a long poll now; SQS answers it as soon as the event arrives.
    let posted = Instant::now();
    let body = stripe_event("evt_long_poll", "invoice.paid");
    let response = post_signed(
        &reqwest::Client::new(),
        &bin.url("/webhooks/stripe"),
        SECRET,
        body,
    )
    .await
    .expect("request");
    assert_eq!(response.status(), 200);
    bin.wait_for(
        "the event to be handled while the polls were pending (not at their 20-s end)",
        Duration::from_secs(5),
        || {
            std::future::ready(
                file_sink_ids(&sink)
                    .contains(&"evt_long_poll".to_owned())
                    .then_some(()),
            )
        },
    )
    .await;
    let handled_after = posted.elapsed();

    // SIGTERM while the workers are back in a long poll: run() drops the pending receive.
    let stopping = Instant::now();
    bin.terminate();
    let status = bin.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.success(),
        "{status}; the binary logged:\n{}",
        bin.stderr()
    );
    eprintln!(
        "idle ReceiveMessage calls in 10 s: {idle_calls}; event handled after {handled_after:?}; \
         exited {:?} after SIGTERM",
        stopping.elapsed()
    );
    drop(bin);
    queue.cleanup().await;
}
