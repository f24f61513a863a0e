//! SQS FIFO queues: the event's object is the message group (one object's events stay in order,
//! others do not wait behind them) and `source:id` the deduplication id; through the real
//! binary, interleaved events of two objects are handled in order per object, and a duplicate
//! inside SQS's 5-minute window (dropped by SQS) or outside it (sent again, dropped by the
//! consumer's dedup) is handled once.

use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use dedup_worker_core::queue::{OutgoingMessage, SqsQueue, Transport as _};

use crate::helpers::{sqs_turn, Backend, RunningBinary, SqsLoad, TestDb};

const SECRET: &str = "whsec_fifo_test";

/// A FIFO queue on the emulator, deleted on drop.
struct FifoQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl FifoQueue {
    async fn new() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let client = aws_sdk_sqs::Client::new(&config);
        let name = format!("dw_test_{}.fifo", uuid::Uuid::new_v4().simple());
        let url = client
            .create_queue()
            .queue_name(&name)
            .attributes(QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("create a FIFO queue (is moto_server running? use scripts/test.sh)")
            .queue_url()
            .expect("queue url")
            .to_owned();
        FifoQueue { client, url }
    }
}

impl Drop for FifoQueue {
    fn drop(&mut self) {
        let (client, url) = (self.client.clone(), self.url.clone());
        // The runtime may be shutting down: delete on a thread of its own.
        std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Runtime::new() {
                runtime.block_on(async {
                    let _ = client.delete_queue().queue_url(url).send().await;
                });
            }
        })
        .join()
        .ok();
    }
}

/// A `customer.subscription.updated` for `object`, created at `created`.
fn subscription_updated(id: &str, object: &str, created: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": id,
        "object": "event",
        "created": created,
        "type": "customer.subscription.updated",
        "data": { "object": { "id": object, "object": "subscription" } }
    }))
    .expect("serialize")
}

fn message(id: &str, payload: Vec<u8>) -> OutgoingMessage {
    OutgoingMessage {
        source: Some("stripe".into()),
        message_id: Some(id.into()),
        message_type: Some("customer.subscription.updated".into()),
        payload: payload.into(),
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_groups_by_object_and_deduplicates_by_source_and_id() {
    let _turn = sqs_turn(SqsLoad::Light).await;
    let queue = FifoQueue::new().await;
    let sqs = SqsQueue::with_client(
        queue.client.clone(),
        queue.url.clone(),
        Duration::from_secs(30),
    );
    let sent = [
        ("evt_a1", subscription_updated("evt_a1", "sub_A", 1)),
        ("evt_b1", subscription_updated("evt_b1", "sub_B", 2)),
        // No object: its own group.
        ("evt_plain", br#"{"id":"evt_plain","type":"ping"}"#.to_vec()),
        // The same event again, inside the 5-minute window: SQS drops it.
        ("evt_a1", subscription_updated("evt_a1", "sub_A", 1)),
    ];
    for (id, payload) in sent {
        sqs.publish(message(id, payload)).await.expect("publish");
    }
    let mut seen = Vec::new();
    for _ in 0..5 {
        let received = queue
            .client
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_system_attribute_names(MessageSystemAttributeName::MessageDeduplicationId)
            .message_attribute_names("All")
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive");
        for m in received.messages() {
            let system = m.attributes().expect("system attributes");
            let id = m
                .message_attributes()
                .and_then(|a| a.get("dedup-message-id"))
                .and_then(MessageAttributeValue::string_value)
                .expect("the event id attribute")
                .to_owned();
            seen.push((
                id,
                system[&MessageSystemAttributeName::MessageGroupId].clone(),
                system[&MessageSystemAttributeName::MessageDeduplicationId].clone(),
            ));
            queue
                .client
                .delete_message()
                .queue_url(&queue.url)
                .receipt_handle(m.receipt_handle().expect("receipt"))
                .send()
                .await
                .expect("delete");
        }
        if seen.len() >= 3 {
            break;
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("evt_a1".into(), "sub_A".into(), "stripe:evt_a1".into()),
            ("evt_b1".into(), "sub_B".into(), "stripe:evt_b1".into()),
            (
                "evt_plain".into(),
                "evt_plain".into(),
                "stripe:evt_plain".into()
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_objects_are_handled_in_order_and_duplicates_once_through_the_binary() {
    let _turn = sqs_turn(SqsLoad::Light).await;
    let queue = FifoQueue::new().await;
    // The events are queued before the binary starts, as ingress queues them (the same
    // publish), so the consumer's batches hold several objects' events at once.
    let sqs = SqsQueue::with_client(
        queue.client.clone(),
        queue.url.clone(),
        Duration::from_secs(30),
    );
    let order = [
        ("evt_a1", "sub_A"),
        ("evt_b1", "sub_B"),
        ("evt_a2", "sub_A"),
        ("evt_b2", "sub_B"),
        ("evt_a3", "sub_A"),
        ("evt_b3", "sub_B"),
    ];
    for (i, (id, object)) in order.iter().enumerate() {
        let payload = subscription_updated(id, object, 1_700_000_000 + i as i64);
        sqs.publish(message(id, payload)).await.expect("publish");
    }
    // Stripe sends evt_a2 again at once (inside SQS's window: the send is dropped) ...
    sqs.publish(message(
        "evt_a2",
        subscription_updated("evt_a2", "sub_A", 1_700_000_002),
    ))
    .await
    .expect("publish the duplicate");
    // ... and evt_b2 again after the window: a send SQS accepts (another deduplication id),
    // which the consumer's dedup drops.
    queue
        .client
        .send_message()
        .queue_url(&queue.url)
        .message_body(
            String::from_utf8(subscription_updated("evt_b2", "sub_B", 1_700_000_003)).unwrap(),
        )
        .message_group_id("sub_B")
        .message_deduplication_id("stripe:evt_b2:retried-after-the-window")
        .message_attributes("dedup-message-id", string_attribute("evt_b2"))
        .message_attributes("dedup-source", string_attribute("stripe"))
        .message_attributes(
            "dedup-type",
            string_attribute("customer.subscription.updated"),
        )
        .send()
        .await
        .expect("send the late duplicate");

    // SQLite: one consumer worker, and the ledger's rowid is the order events were handled in.
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_TRANSPORT", "sqs".into()),
            ("DEDUP_QUEUE", queue.url.clone()),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_TRANSPORT__SQS_WAIT_TIME", "1s".into()),
            ("DEDUP_CONSUMER__BATCH_SIZE", "4".into()),
        ],
        work.path(),
    );
    let store = db.store().await;
    let pool = store.sqlite_pool().expect("a SQLite test").clone();
    let handled: Vec<String> = bin
        .wait_for(
            "every event handled, and the late duplicate consumed",
            Duration::from_secs(60),
            || {
                let (pool, client, queue_url) =
                    (pool.clone(), queue.client.clone(), queue.url.clone());
                async move {
                    let rows: Vec<(String,)> =
                        sqlx::query_as("SELECT event_id FROM event_ledger ORDER BY rowid")
                            .fetch_all(&pool)
                            .await
                            .ok()?;
                    let attributes = client
                        .get_queue_attributes()
                        .queue_url(queue_url)
                        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                        .send()
                        .await
                        .ok()?;
                    let empty = attributes
                        .attributes()
                        .is_some_and(|a| a.values().all(|v| v == "0"));
                    (rows.len() >= 6 && empty).then(|| rows.into_iter().map(|(id,)| id).collect())
                }
            },
        )
        .await;
    let of = |prefix: &str| -> Vec<String> {
        handled
            .iter()
            .filter(|id| id.starts_with(prefix))
            .cloned()
            .collect()
    };
    assert_eq!(
        of("evt_a"),
        ["evt_a1", "evt_a2", "evt_a3"],
        "sub_A in order, each once"
    );
    assert_eq!(
        of("evt_b"),
        ["evt_b1", "evt_b2", "evt_b3"],
        "sub_B in order, each once"
    );
    assert_eq!(handled.len(), 6, "nothing handled twice: {handled:?}");
    drop(bin);
}

fn string_attribute(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("attribute")
}
