//! The sinks, end to end in the running app: events deduplicated by the consumer are
//! published by the relay to a RabbitMQ exchange (routing key = event type, `message_id` =
//! event id) and to an SQS queue (the `dedup-message-id` attribute = event id), once each, with
//! the raw payload; and POSTed by the real binary to an HTTP sink signed with Standard Webhooks
//! signatures that the official `standardwebhooks` library verifies (`v1`), and Python's
//! `cryptography` (`v1a`, ed25519).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_worker::Service;
use dedup_worker_core::queue::{SqsQueue, Transport as _};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use serde_json::json;

use crate::helpers::{
    amqp_url, ed25519_python_sign, ed25519_python_verified, post_signed, sqs_turn,
    standard_python_verified, stripe_event, test_settings, wait_for, Backend, Receiver,
    RunningBinary, SqsLoad, TestApp, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_test_secret";

/// Posts each id as a signed Stripe event (a repeated id is a duplicate delivery).
async fn post_events(app: &TestApp, ids: &[&str]) -> Vec<Vec<u8>> {
    let client = reqwest::Client::new();
    let mut bodies = Vec::new();
    for id in ids {
        let body = stripe_event(id, "charge.refunded");
        let r = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body.clone())
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        bodies.push(body);
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_sink_publishes_each_event_once_to_the_exchange() {
    let amqp = amqp_url();
    let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
    // The receiving side: a queue bound to the exchange for every routing key.
    let connection = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .exchange_declare(
            name.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let db = TestDb::new(Backend::Sqlite).await;
    let sink = format!("{amqp}?exchange={name}");
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("outbox.sink", json!(sink)),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let bodies = post_events(&app, &["evt_amqp_1", "evt_amqp_2", "evt_amqp_1"]).await;

    let received = Arc::new(Mutex::new(Vec::new()));
    wait_for(
        "two messages at the exchange's queue",
        Duration::from_secs(30),
        || {
            let (channel, name, received) = (channel.clone(), name.clone(), received.clone());
            async move {
                while let Some(m) = channel
                    .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
                {
                    received.lock().unwrap().push(m.delivery);
                }
                (received.lock().unwrap().len() >= 2).then_some(())
            }
        },
    )
    .await;
    let got = std::mem::take(&mut *received.lock().unwrap());
    // Nothing more arrives once the outbox is drained.
    wait_for("the outbox to drain", Duration::from_secs(30), || async {
        (app.store.outbox().counts().await.unwrap().pending == 0).then_some(())
    })
    .await;
    assert!(channel
        .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .is_none());
    assert_eq!(got.len(), 2, "the duplicate delivery was not forwarded");
    let first = got
        .iter()
        .find(|d| d.properties.message_id().as_ref().map(|s| s.as_str()) == Some("evt_amqp_1"))
        .expect("message_id = event id");
    assert_eq!(first.routing_key.as_str(), "charge.refunded");
    assert_eq!(first.data, bodies[0], "the raw payload, byte for byte");

    app.stop().await;
    channel
        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    channel
        .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_sink_sends_each_event_once_to_the_queue() {
    let _emulator = sqs_turn(SqsLoad::Light).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    let client = queue.sqs_client().expect("sqs").clone();
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("outbox.sink", json!(format!("sqs:{}", queue.name))),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let bodies = post_events(&app, &["evt_sqs_1", "evt_sqs_2", "evt_sqs_2"]).await;

    let reader = SqsQueue::with_client(client, queue.name.clone(), Duration::from_secs(30));
    let received = Arc::new(Mutex::new(Vec::new()));
    let reader = Arc::new(reader);
    wait_for(
        "two messages on the SQS queue",
        Duration::from_secs(30),
        || {
            let (reader, received) = (reader.clone(), received.clone());
            async move {
                let batch = reader.receive(10, Duration::from_secs(1)).await.unwrap();
                let mut received = received.lock().unwrap();
                received.extend(batch);
                (received.len() >= 2).then_some(())
            }
        },
    )
    .await;
    let mut got = std::mem::take(&mut *received.lock().unwrap());
    wait_for("the outbox to drain", Duration::from_secs(30), || async {
        (app.store.outbox().counts().await.unwrap().pending == 0).then_some(())
    })
    .await;
    got.extend(reader.receive(10, Duration::from_secs(1)).await.unwrap());
    assert_eq!(got.len(), 2, "the duplicate delivery was not forwarded");
    let second = got
        .iter()
        .find(|d| d.message_id.as_deref() == Some("evt_sqs_2"))
        .expect("dedup-message-id = event id");
    assert_eq!(second.message_type.as_deref(), Some("charge.refunded"));
    assert_eq!(second.payload, bodies[1]);

    app.stop().await;
    queue.cleanup().await;
}

/// Two signing secrets, as during a rotation.
const SIGNING_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SIGNING_B: &str = "whsec_ZGVkdXAtd29ya2VyLXNlY29uZC1rZXkh";
/// A secret the relay does not sign with: nothing may verify under it.
const NOT_SIGNING: &str = "whsec_bm90LWEtc2lnbmluZy1rZXktYXQtYWxs";

/// With `outbox.signing_secret` set to two `whsec_` secrets and two `whsk_` ed25519 keys (one a
/// 32-byte seed, one libsodium's 64-byte seed and public key), all made elsewhere (the keys by
/// Python's `cryptography`), every POST of the HTTP sink verifies with the official Standard
/// Webhooks library under either secret alone, and with `cryptography` under either public key
/// alone (and under no other secret or key); its `webhook-id` is the event's idempotency key, the
/// same on the redelivery after a 500, which is signed anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_http_deliveries_verify_under_any_one_secret_or_public_key() {
    // The first delivery of each event is answered 500, so each is delivered twice.
    let receiver = Receiver::answering(|_, attempt| {
        if attempt == 1 {
            axum::http::StatusCode::INTERNAL_SERVER_ERROR
        } else {
            axum::http::StatusCode::OK
        }
    })
    .await;
    let (seed_key, pair_key, stranger) = (
        ed25519_python_sign(&[]),
        ed25519_python_sign(&[]),
        ed25519_python_sign(&[]),
    );
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", receiver.url()),
            (
                "DEDUP_SINK_SIGNING_SECRET",
                format!(
                    "{SIGNING_A}, {SIGNING_B}, {}, {}",
                    seed_key.whsk_seed, pair_key.whsk_pair
                ),
            ),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__RETRY_BASE", "100ms".into()),
            ("DEDUP_OUTBOX__RETRY_MAX", "200ms".into()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..5).map(|i| format!("evt_signed_{i}")).collect();
    for id in &ids {
        let r = post_signed(
            &client,
            &bin.url("/webhooks/stripe"),
            SECRET,
            stripe_event(id, "invoice.paid"),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    bin.wait_for(
        "every event delivered twice (a 500, then a 200)",
        Duration::from_secs(60),
        || {
            let keys = receiver.keys();
            let ids = &ids;
            async move {
                ids.iter()
                    .all(|id| keys.iter().filter(|k| *k == id).count() >= 2)
                    .then_some(())
            }
        },
    )
    .await;
    let deliveries = receiver.snapshot();
    let header = |d: &crate::helpers::receiver::Received, name: &str| {
        d.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} header in {:?}", d.headers))
    };
    for delivery in &deliveries {
        // The same id on every attempt: the receiver deduplicates on it.
        assert_eq!(
            Some(header(delivery, "webhook-id")),
            delivery.idempotency_key,
            "webhook-id is the idempotency key"
        );
        let signature = header(delivery, "webhook-signature");
        let schemes: Vec<&str> = signature
            .split(' ')
            .map(|item| item.split(',').next().unwrap_or_default())
            .collect();
        assert_eq!(
            schemes,
            ["v1", "v1", "v1a", "v1a"],
            "one item per secret, in order: {signature}"
        );
    }
    assert_eq!(
        standard_python_verified(SIGNING_A, &deliveries),
        deliveries.len()
    );
    assert_eq!(
        standard_python_verified(SIGNING_B, &deliveries),
        deliveries.len()
    );
    assert_eq!(standard_python_verified(NOT_SIGNING, &deliveries), 0);
    // The official library ignores v1a items; the public keys verify them.
    for key in [&seed_key, &pair_key] {
        assert_eq!(
            ed25519_python_verified(&key.whpk, &deliveries),
            deliveries.len()
        );
    }
    assert_eq!(ed25519_python_verified(&stranger.whpk, &deliveries), 0);
    drop(bin);
}
