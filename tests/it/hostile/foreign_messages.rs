//! Foreign producers on a shared queue: messages that are not events become dead letters with
//! their reason, and the good messages behind them are all handled; a batch the database
//! refuses for one event's data dead-letters that event alone.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::queue::{OutgoingMessage, SqsQueue, Transport as _};
use dedup_worker_core::store::{DbTx, DeadLetter, Store};
use serde_json::json;

use crate::helpers::{
    file_sink_ids, poll_until, post_signed, sqs_turn, stripe_event, test_settings, wait_for,
    Backend, RunningBinary, SqsLoad, TestApp, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_foreign";

fn message(message_id: Option<&str>, payload: impl Into<Bytes>) -> OutgoingMessage {
    OutgoingMessage {
        source: None,
        message_id: message_id.map(str::to_owned),
        message_type: None,
        payload: payload.into(),
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    }
}

/// What foreign producers send, and a part of the reason each must be dead-lettered with.
fn foreign(with_nul_property: bool) -> Vec<(OutgoingMessage, &'static str)> {
    let mut messages = vec![
        (message(None, "hello, not json"), "not JSON"),
        (
            message(None, r#"{"type":"invoice.paid","data":{}}"#),
            "no non-empty string at /id",
        ),
        (
            message(None, vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0xff, 0x80]),
            "not JSON",
        ),
        (message(None, r#"{"id":"evt_\u0000nul"}"#), "U+0000"),
        (
            message(None, json!({ "id": "x".repeat(5000) }).to_string()),
            "5000 bytes",
        ),
    ];
    if with_nul_property {
        // AMQP short strings may hold a NUL; SQS attributes may not.
        messages.push((message(Some("evt_\u{0}prop"), "{}"), "U+0000"));
    }
    messages
}

fn good(i: usize) -> OutgoingMessage {
    message(
        None,
        json!({ "id": format!("evt_good_{i:03}"), "type": "t" }).to_string(),
    )
}

fn start(db: &TestDb, queue: &TestQueue, work: &std::path::Path) -> RunningBinary {
    RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
            (
                "DEDUP_SINK",
                format!("file:{}", work.join("out.jsonl").display()),
            ),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "200ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
        ],
        work,
    )
}

/// Waits until the 100 good messages reached the sink and every foreign one is a dead letter
/// whose error names its reason.
async fn expect_dead_letters_and_good_ones(
    bin: &RunningBinary,
    store: &Store,
    work: &std::path::Path,
    reasons: &[&str],
    duplicate_deliveries: bool,
) {
    let sink = work.join("out.jsonl");
    let store = Arc::new(store.clone());
    let timeout = Duration::from_secs(90);
    let done = poll_until(timeout, || {
        let (sink, store) = (sink.clone(), store.clone());
        async move {
            let delivered = file_sink_ids(&sink).len();
            let dead = store.dead_letters().list(100).await.ok()?;
            let mut payloads: Vec<Vec<u8>> = dead.into_iter().map(|d| d.payload).collect();
            payloads.sort();
            payloads.dedup();
            (delivered >= 100 && payloads.len() >= reasons.len()).then_some(())
        }
    })
    .await;
    if done.is_none() {
        // What is there, first: CI shows a message's first lines, and the log is long.
        let delivered = file_sink_ids(&sink);
        let missing: Vec<String> = (0..100)
            .map(|i| format!("evt_good_{i:03}"))
            .filter(|id| !delivered.contains(id))
            .collect();
        let dead: Vec<(String, String)> = store
            .dead_letters()
            .list(100)
            .await
            .map(|d| d.into_iter().map(|d| (d.event_id, d.error)).collect())
            .unwrap_or_default();
        panic!(
            "timed out after {timeout:?}: {} of 100 good messages at the sink (missing {missing:?}), \
             {} dead letters of {} expected ({dead:?}); the binary logged:\n{}",
            delivered.len(),
            dead.len(),
            reasons.len(),
            bin.stderr()
        );
    }
    let mut delivered = file_sink_ids(&sink);
    delivered.sort();
    let expected: Vec<String> = (0..100).map(|i| format!("evt_good_{i:03}")).collect();
    assert_eq!(delivered, expected, "each good message handled once");
    let dead = store.dead_letters().list(100).await.unwrap();
    // One dead letter per foreign message. On SQS a message may be one of two: a standard
    // queue may hand a message to two receivers at once (the emulator does so when two
    // workers' receives overlap), and a message with no id cannot be told from a second
    // send of the same bytes, so each delivery is dead-lettered. Not a good message, though:
    // those have ids, and a second delivery is a duplicate.
    let mut distinct: Vec<&DeadLetter> = Vec::new();
    for d in &dead {
        if !distinct.iter().any(|seen| seen.payload == d.payload) {
            distinct.push(d);
        }
    }
    if !duplicate_deliveries {
        assert_eq!(
            distinct.len(),
            dead.len(),
            "a message dead-lettered twice: {dead:#?}"
        );
    }
    assert_eq!(distinct.len(), reasons.len(), "{dead:#?}");
    let mut errors: Vec<String> = distinct.iter().map(|d| d.error.clone()).collect();
    for reason in reasons {
        let found = errors.iter().position(|e| e.contains(reason));
        let found = found.unwrap_or_else(|| panic!("no dead letter says {reason:?}: {errors:#?}"));
        errors.remove(found);
    }
    // The payloads are kept byte for byte, for a redrive once the producer is fixed.
    assert!(dead.iter().any(|d| d.payload == b"hello, not json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_messages_on_rabbitmq_are_dead_lettered_and_100_good_ones_handled() {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq).await;
    let work = tempfile::tempdir().unwrap();
    let producer = queue.rabbit();
    let foreign = foreign(true);
    for (m, _) in &foreign {
        producer.publish(m.clone()).await.expect("publish foreign");
    }
    for i in 0..100 {
        producer.publish(good(i)).await.expect("publish good");
    }
    producer.close().await;
    let bin = start(&db, &queue, work.path());
    let reasons: Vec<&str> = foreign.iter().map(|(_, r)| *r).collect();
    expect_dead_letters_and_good_ones(&bin, &db.store().await, work.path(), &reasons, false).await;
    drop(bin);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_messages_on_sqs_are_dead_lettered_and_100_good_ones_handled() {
    // Heavy: a backlog of over a hundred messages.
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    let work = tempfile::tempdir().unwrap();
    let client = queue.sqs_client().expect("sqs client").clone();
    let producer =
        SqsQueue::with_client(client.clone(), queue.name.clone(), Duration::from_secs(30));
    let foreign = foreign(false);
    for (m, _) in &foreign {
        producer.publish(m.clone()).await.expect("publish foreign");
    }
    // A body marked as base64 that is not: without a reason it would come back forever.
    let attribute = aws_sdk_sqs::types::MessageAttributeValue::builder()
        .data_type("String")
        .string_value("base64")
        .build()
        .unwrap();
    client
        .send_message()
        .queue_url(&queue.name)
        .message_body("!!! not base64 !!!")
        .message_attributes("dedup-encoding", attribute)
        .send()
        .await
        .expect("send");
    for i in 0..100 {
        producer.publish(good(i)).await.expect("publish good");
    }
    let bin = start(&db, &queue, work.path());
    let mut reasons: Vec<&str> = foreign.iter().map(|(_, r)| *r).collect();
    reasons.push("is not base64");
    expect_dead_letters_and_good_ones(&bin, &db.store().await, work.path(), &reasons, true).await;
    drop(bin);
    queue.cleanup().await;
}

/// Forwards every event, but gives `evt_poison_outbox` an outbox row PostgreSQL cannot hold.
struct UnstorableOutbox;

#[async_trait]
impl Handler for UnstorableOutbox {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let mut message = OutboxMessage::forward(event);
        if event.id == "evt_poison_outbox" {
            message.event_type = "bad\u{0}type".into();
        }
        Ok(vec![message])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_one_events_data_dead_letters_that_event_alone() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    // The consumer starts only after all 30 are queued, so they share one batch.
    let settings = test_settings(
        &db.url,
        &[
            ("roles.consumer", json!(false)),
            ("roles.relay", json!(false)),
        ],
    );
    let ingress = TestApp::spawn(settings, Service::new()).await;
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..30)
        .map(|i| match i {
            13 => "evt_poison_outbox".to_owned(),
            i => format!("evt_fine_{i:02}"),
        })
        .collect();
    for id in &ids {
        let body = stripe_event(id, "charge.succeeded");
        let r = post_signed(
            &client,
            &ingress.url("/webhooks/stripe"),
            "whsec_test_secret",
            body,
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    ingress.stop().await;
    let worker = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("roles.ingress", json!(false)),
                ("outbox.sink", json!(format!("file:{}", sink.display()))),
                ("consumer.poll_interval", json!("50ms")),
                ("outbox.poll_interval", json!("50ms")),
            ],
        ),
        Service::new().handler(UnstorableOutbox),
    )
    .await;
    let store = Arc::new(worker.store.clone());
    wait_for(
        "29 events delivered and the poison dead-lettered",
        Duration::from_secs(30),
        || {
            let (sink, store) = (sink.clone(), store.clone());
            async move {
                let delivered = file_sink_ids(&sink).len();
                let dead = store.dead_letters().list(10).await.ok()?.len();
                (delivered == 29 && dead == 1).then_some(())
            }
        },
    )
    .await;
    let dead = store.dead_letters().list(10).await.unwrap();
    assert_eq!(dead[0].event_id, "evt_poison_outbox");
    assert!(
        dead[0].error.contains("refused this event's data"),
        "{}",
        dead[0].error
    );
    assert!(!file_sink_ids(&sink).contains(&"evt_poison_outbox".to_owned()));
    worker.stop().await;
}
