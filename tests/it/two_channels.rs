//! One change on two channels at once (issue 36, item 1): Stripe sends the snapshot event of a
//! change as a webhook and, at the same moment, its thin event or an EventBridge copy on SQS;
//! a foreign producer republishes under its own message ids. Every copy of the change is
//! claimed under one key by the dedup insert itself, so no interleaving sees the change free
//! twice:
//! * the store, on both backends: the copies (decoded as the consumer decodes them) in one
//!   batch are one new event; on PostgreSQL, two batches claiming them at once are one new
//!   event, the second waiting for the first's commit;
//! * the binary, on both stores, four workers: forty changes, each queued as two copies side
//!   by side, are each handled once, under the change's key.

use std::time::Duration;

use bytes::Bytes;
use dedup_worker_core::config::EnvelopeKind;
use dedup_worker_core::consumer::{decode_delivery, ConsumerOptions};
use dedup_worker_core::queue::{Delivery, DeliveryTag};
use dedup_worker_core::store::{NewQueueMessage, ProcessedEvent, Store};
use serde_json::Value;

use crate::helpers::stripe_channels::{eventbridge_envelope, snapshot_event, thin_event};
use crate::helpers::{ledger_counts, pipeline_drained, poll_until, Backend, RunningBinary, TestDb};

const QUEUE: &str = "dedup.events";

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Postgres).await } )*
        }
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
    };
}

on_both_stores!(
    two_copies_claimed_at_once_are_one_event,
    copies_queued_together_are_each_handled_once,
);

fn options() -> ConsumerOptions {
    ConsumerOptions {
        source: "stripe".into(),
        dedup_key_pointer: "/id".into(),
        batch_size: 10,
        poll_interval: Duration::from_millis(10),
        max_attempts: 3,
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(10),
        max_message_bytes: 1 << 20,
        lease: Duration::from_secs(10),
        step_timeout: Duration::from_secs(30),
        envelope: EnvelopeKind::None,
        outbox_plan: Default::default(),
    }
}

/// What the consumer records for `payload` delivered under `message_id`.
fn copy(message_id: Option<&str>, payload: &Value) -> ProcessedEvent {
    let delivery = Delivery {
        tag: DeliveryTag::Row {
            id: 1,
            claim_token: 1,
        },
        source: None,
        message_id: message_id.map(str::to_owned),
        message_type: None,
        payload: Bytes::from(serde_json::to_vec(payload).unwrap()),
        attempts: 1,
        enqueued_at: None,
        defect: None,
        give_up: None,
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    };
    let event = decode_delivery(&delivery, &options()).expect("decodes");
    ProcessedEvent {
        id: event.id,
        event_type: event.event_type,
        alias: event.alias,
        ..ProcessedEvent::default()
    }
}

/// The copies of change `n` a consumer may receive: the webhook's (keyed by the ingress), its
/// thin event under the thin event's own id, and EventBridge copies of each.
fn copies(n: usize) -> Vec<ProcessedEvent> {
    let snapshot_id = format!("evt_change_{n}");
    let thin_id = format!("evt_change_{n}_thin");
    let snapshot = snapshot_event(&snapshot_id, &format!("in_{n}"));
    let thin = thin_event(&thin_id, &format!("in_{n}"), Some(&snapshot_id), None);
    vec![
        copy(Some(&snapshot_id), &snapshot),
        copy(Some(&thin_id), &thin),
        copy(None, &eventbridge_envelope(&snapshot)),
        copy(None, &eventbridge_envelope(&thin)),
    ]
}

async fn claim(store: &Store, events: &[ProcessedEvent]) -> Vec<String> {
    let mut tx = store.begin().await.unwrap();
    let new = tx.insert_processed_events("stripe", events).await.unwrap();
    tx.commit().await.unwrap();
    new
}

async fn two_copies_claimed_at_once_are_one_event(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // On PostgreSQL, two batches at once (SQLite has one writer at a time: two batches never
    // interleave there).
    if let Some(observer) = store.postgres_pool() {
        // Two batches at once: the webhook's copy claimed and not committed, the thin event's
        // claimed beside it. The second must wait for the first, then find it.
        let [webhook, thin, ..] = <[ProcessedEvent; 4]>::try_from(copies(1)).unwrap();
        let mut first = store.begin().await.unwrap();
        let first_new = first
            .insert_processed_events("stripe", std::slice::from_ref(&webhook))
            .await
            .unwrap();
        assert_eq!(first_new, ["evt_change_1"]);
        let claiming = tokio::spawn({
            let store = store.clone();
            async move { claim(&store, &[thin]).await }
        });
        // The second claim either waits on the first's row (the fix) or has already recorded its
        // copy as new beside it (the hole).
        poll_until(Duration::from_secs(20), || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND backend_type = 'client backend'",
            )
            .fetch_one(observer)
            .await
            .ok()?;
            (claiming.is_finished() || waiting > 0).then_some(())
        })
        .await
        .expect("the second claim neither answered nor waited");
        first.commit().await.unwrap();
        let second_new = claiming.await.unwrap();
        assert!(
            second_new.is_empty(),
            "the thin event's copy claimed beside the webhook's was recorded as new: {second_new:?}"
        );
    }
    // Every pair of copies of a change, in one batch: one new event.
    let all = copies(0);
    for (i, first) in all.iter().enumerate() {
        for (j, second) in all.iter().enumerate().skip(i + 1) {
            let n = 100 + i * 10 + j;
            let rename = |e: &ProcessedEvent| ProcessedEvent {
                id: e.id.replace("evt_change_0", &format!("evt_change_{n}")),
                ..e.clone()
            };
            let new = claim(&store, &[rename(first), rename(second)]).await;
            assert_eq!(
                new.len(),
                1,
                "copies {i} and {j} of change {n} in one batch, recorded as new: {new:?}"
            );
        }
    }
}

/// The binary on the database queue with the ledger handler, four workers, small batches.
fn start(db: &TestDb, work: &std::path::Path) -> RunningBinary {
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", "whsec_two_channels".to_owned()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_CONSUMER__WORKERS", "4".to_owned()),
        ("DEDUP_CONSUMER__BATCH_SIZE", "8".to_owned()),
        ("DEDUP_QUEUE", QUEUE.to_owned()),
    ];
    RunningBinary::start(&env, work)
}

fn message(message_id: Option<String>, payload: &Value) -> NewQueueMessage {
    NewQueueMessage {
        source: Some("stripe".into()),
        message_id,
        message_type: None,
        payload: serde_json::to_vec(payload).unwrap(),
        traceparent: None,
        stripe_signature: None,
        sender_headers: None,
    }
}

async fn copies_queued_together_are_each_handled_once(backend: Backend) {
    const CHANGES: usize = 40;
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let store = db.store().await;
    // Each change as the webhook's message (keyed by the ingress) and, next to it, its thin
    // event under its own id or an EventBridge copy without a message id.
    let mut messages = Vec::new();
    for n in 0..CHANGES {
        let id = format!("evt_change_{n}");
        let snapshot = snapshot_event(&id, &format!("in_{n}"));
        messages.push(message(Some(id.clone()), &snapshot));
        messages.push(if n % 2 == 0 {
            let thin_id = format!("{id}_thin");
            let thin = thin_event(&thin_id, &format!("in_{n}"), Some(&id), None);
            message(Some(thin_id), &thin)
        } else {
            message(None, &eventbridge_envelope(&snapshot))
        });
    }
    store.queue().enqueue(QUEUE, &messages).await.unwrap();
    let bin = start(&db, work.path());
    bin.wait_for(
        "both copies of every change settled",
        Duration::from_secs(60),
        || async { pipeline_drained(&store, QUEUE).await.then_some(()) },
    )
    .await;
    let ledger = ledger_counts(&store).await;
    for n in 0..CHANGES {
        let key = format!("evt_change_{n}");
        assert_eq!(
            ledger.get(&key),
            Some(&1),
            "change {n} handled once under its key; the ledger: {ledger:?}"
        );
    }
    assert_eq!(
        ledger.values().sum::<i64>(),
        CHANGES as i64,
        "handler runs for {CHANGES} changes: {ledger:?}"
    );
    drop(bin);
}
