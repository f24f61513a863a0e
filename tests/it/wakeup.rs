//! LISTEN/NOTIFY on PostgreSQL: a consumer and a relay whose polling interval is far longer
//! than the test's deadline still pick up work committed by *another* connection at once,
//! because the commit's NOTIFY wakes them. (Without the notification the test times out.)

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::{file_sink_ids, test_settings, wait_for, Backend, TestApp, TestDb};
use dedup_worker::Service;
use dedup_worker_core::store::{NewOutboxRow, NewQueueMessage};
use serde_json::json;

const POLL: &str = "10m";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_consumer_and_relay_of_another_process() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("roles.ingress", json!(false)),
                ("outbox.sink", json!(format!("file:{}", sink.display()))),
                ("consumer.poll_interval", json!(POLL)),
                ("outbox.poll_interval", json!(POLL)),
            ],
        ),
        Service::new(),
    )
    .await;
    // A separate pool stands for another process: the in-process signal cannot reach the app.
    let other = Arc::new(db.store().await);
    // Let the app's first (empty) polls happen, so only a wake-up can find what comes next.
    wait_for("the app to be ready", Duration::from_secs(10), || async {
        reqwest::get(app.url("/readyz"))
            .await
            .ok()
            .filter(|r| r.status() == 200)
            .map(|_| ())
    })
    .await;

    other
        .queue()
        .enqueue(
            "dedup.events",
            &[NewQueueMessage {
                source: None,
                message_id: Some("evt_notify_queue".into()),
                message_type: Some("x.y".into()),
                payload: br#"{"id":"evt_notify_queue","type":"x.y"}"#.to_vec(),
                traceparent: None,
                stripe_signature: None,
                sender_headers: None,
            }],
        )
        .await
        .unwrap();
    wait_for(
        "the consumer to be woken by NOTIFY",
        Duration::from_secs(20),
        || {
            let sink = sink.clone();
            async move {
                file_sink_ids(&sink)
                    .contains(&"evt_notify_queue".to_owned())
                    .then_some(())
            }
        },
    )
    .await;

    let mut tx = other.begin().await.unwrap();
    tx.insert_outbox(&[NewOutboxRow {
        source: "manual".into(),
        event_id: "evt_notify_outbox".into(),
        destination: None,
        idempotency_key: "evt_notify_outbox".into(),
        event_type: "x.y".into(),
        payload: br#"{"id":"evt_notify_outbox"}"#.to_vec(),
        traceparent: None,
        ordering_key: None,
    }])
    .await
    .unwrap();
    tx.commit().await.unwrap();
    wait_for(
        "the relay to be woken by NOTIFY",
        Duration::from_secs(20),
        || {
            let sink = sink.clone();
            async move {
                file_sink_ids(&sink)
                    .contains(&"evt_notify_outbox".to_owned())
                    .then_some(())
            }
        },
    )
    .await;
    app.stop().await;
}
