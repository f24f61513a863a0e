//! End to end through the real binary, on both stores: 1,000 distinct events delivered with
//! 30 % duplicates (some as 20 concurrent copies of one event) reach the file sink once each,
//! and the example handler's table holds exactly one row per event. The same over RabbitMQ,
//! and over SQS with 300 events: the emulator, moto_server, spends time proportional to the
//! queue's depth on every call (about a second per receive at 1,000 messages), which measures
//! moto rather than us.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{
    file_sink_ids, ledger_counts, post_signed, stripe_event, Backend, RunningBinary, TestDb,
    TestQueue, Transport,
};
use futures::stream::{self, StreamExt};

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
            ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "100".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL_MS", "100".into()),
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

    let send = |id: &str| {
        let body = payloads[id].clone();
        let (client, url) = (&client, &url);
        async move {
            post_signed(client, url, SECRET, body)
                .await
                .map(|r| r.status().as_u16())
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
    assert!(
        statuses.iter().all(|s| matches!(s, Ok(200))),
        "every delivery accepted"
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
