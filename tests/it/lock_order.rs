//! Lock orders, on PostgreSQL: two batches that touch the same rows in opposite orders must both
//! commit, never end in `deadlock detected` (40P01). Each failed step would give its batch back,
//! and each give-back counts towards the delivery limit.
//!
//! * The stale-event guard records one version per object, one event at a time: batch A updates
//!   objects X then Y, batch B objects Y then X. The interleaving is made deterministic: A's
//!   handler of its first event waits until another session of the database waits on a lock.
//! * Dead letters are listed once per event under an advisory lock each: A lists events 1 then
//!   2, B 2 then 1, with a third transaction holding 1 until both wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dedup_worker_core::config::{EnvelopeKind, StaleGuardSettings};
use dedup_worker_core::consumer::{
    Consumer, ConsumerOptions, Handler, HandlerError, OutboxMessage,
};
use dedup_worker_core::consumer::{StaleGuard, StepOutcome};
use dedup_worker_core::event::Event;
use dedup_worker_core::queue::{Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};
use dedup_worker_core::store::{DbTx, NewDeadLetter, Store, StoreTx, Wakeups};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::helpers::{poll_until, Backend, TestDb};

/// How long a wait for another session may take before the test gives up on it.
const DEADLINE: Duration = Duration::from_secs(30);

/// Sessions of this database waiting on a lock (row, transaction id or advisory). Waits on a
/// transaction id have no database in `pg_locks`, so `pg_stat_activity` is asked.
async fn lock_waiters(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(observer)
    .await
    .expect("read pg_stat_activity")
}

async fn wait_for_waiters(observer: &PgPool, n: i64, what: &str) {
    poll_until(DEADLINE, || async {
        (lock_waiters(observer).await >= n).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{what}: fewer than {n} sessions ever waited on a lock"));
}

/// A transport that hands out one fixed batch, once.
struct OneBatch {
    batch: Mutex<Option<Vec<Delivery>>>,
}

#[async_trait]
impl Transport for OneBatch {
    async fn publish(&self, _: OutgoingMessage) -> Result<(), TransportError> {
        Err(TransportError::Closed)
    }
    async fn receive(&self, _: usize, _: Duration) -> Result<Vec<Delivery>, TransportError> {
        Ok(self.batch.lock().unwrap().take().unwrap_or_default())
    }
    async fn ack(&self, _: &[DeliveryTag]) -> Result<(), TransportError> {
        Ok(())
    }
    async fn release(&self, _: &[DeliveryTag]) -> Result<(), TransportError> {
        Ok(())
    }
    async fn extend_leases(
        &self,
        _: &[DeliveryTag],
        _: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        Ok(Vec::new())
    }
    async fn retry_later(&self, _: &Delivery, _: Duration) -> Result<(), TransportError> {
        Ok(())
    }
    async fn ready(&self) -> Result<(), TransportError> {
        Ok(())
    }
    fn queue_name(&self) -> &str {
        "lock_order"
    }
}

/// An `updated` event of `object`: the delivery the transport hands out.
fn delivery(n: i64, id: &str, object: &str) -> Delivery {
    let payload = json!({"id": id, "object": "event", "created": 1_796_119_200 + n,
                         "type": "customer.subscription.updated",
                         "data": {"object": {"id": object}}});
    Delivery {
        tag: DeliveryTag::Row {
            id: n,
            claim_token: 1,
        },
        source: Some("stripe".into()),
        message_id: Some(id.into()),
        message_type: Some("customer.subscription.updated".into()),
        payload: Bytes::from(payload.to_string()),
        attempts: 1,
        enqueued_at: None,
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
        defect: None,
        give_up: None,
    }
}

/// Counts its runs per event; the first run of `pause_on` waits (in its batch's transaction,
/// its first object's version recorded) until another session waits on a lock.
struct PauseOnce {
    pause_on: &'static str,
    observer: PgPool,
    paused: Notify,
    runs: Mutex<HashMap<String, u32>>,
}

#[async_trait]
impl Handler for PauseOnce {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let first = {
            let mut runs = self.runs.lock().unwrap();
            let n = runs.entry(event.id.clone()).or_default();
            *n += 1;
            *n == 1
        };
        if first && event.id == self.pause_on {
            self.paused.notify_one();
            wait_for_waiters(&self.observer, 1, "the other batch").await;
        }
        Ok(Vec::new())
    }
}

fn consumer(store: &Store, handler: Arc<PauseOnce>, batch: Vec<Delivery>) -> Consumer {
    let options = ConsumerOptions {
        source: "stripe".into(),
        dedup_key_pointer: "/id".into(),
        batch_size: 10,
        poll_interval: Duration::from_millis(10),
        max_attempts: 5,
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        max_message_bytes: 1 << 20,
        lease: Duration::from_secs(60),
        step_timeout: Duration::from_secs(120),
        envelope: EnvelopeKind::None,
        outbox_plan: Default::default(),
    };
    let transport = Arc::new(OneBatch {
        batch: Mutex::new(Some(batch)),
    });
    let guard = StaleGuard::from_settings(&StaleGuardSettings {
        enabled: true,
        types: vec!["*.updated".into()],
        object_pointer: "/data/object/id".into(),
        version_pointer: "/created".into(),
    });
    Consumer::new(
        store.clone(),
        transport,
        handler,
        Arc::new(Wakeups::default()),
        options,
    )
    .with_stale_guard(guard)
}

/// Deadlocks this database has counted, read for the failure message (the statistics are
/// flushed by each session after a while: polled, and only when the test fails anyway).
async fn deadlocks_counted(observer: &PgPool) -> i64 {
    poll_until(Duration::from_secs(15), || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(observer)
        .await
        .ok()?;
        (n > 0).then_some(n)
    })
    .await
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_guard_batches_in_opposite_object_orders_both_commit() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let observer = PgPool::connect(&db.url).await.expect("connect");
    let handler = Arc::new(PauseOnce {
        pause_on: "evt_a1",
        observer: observer.clone(),
        paused: Notify::new(),
        runs: Mutex::default(),
    });
    let a = consumer(
        &store,
        handler.clone(),
        vec![
            delivery(1, "evt_a1", "sub_X"),
            delivery(2, "evt_a2", "sub_Y"),
        ],
    );
    let b = consumer(
        &store,
        handler.clone(),
        vec![
            delivery(3, "evt_b1", "sub_Y"),
            delivery(4, "evt_b2", "sub_X"),
        ],
    );
    let step_a = tokio::spawn(async move { a.try_step().await });
    // B starts once A holds its first object (and waits in its handler for B to wait).
    tokio::time::timeout(DEADLINE, handler.paused.notified())
        .await
        .expect("batch A reached its first handler");
    let step_b = tokio::spawn(async move { b.try_step().await });
    let outcome_a = step_a.await.expect("step A");
    let outcome_b = step_b.await.expect("step B");

    let runs = handler.runs.lock().unwrap().clone();
    let clean = |o: &Result<StepOutcome, _>| {
        matches!(
            o,
            Ok(StepOutcome {
                handled: 2,
                retried: 0,
                dead_lettered: 0,
                ..
            })
        )
    };
    if !(clean(&outcome_a) && clean(&outcome_b) && runs.values().all(|&n| n == 1)) {
        let deadlocks = deadlocks_counted(&observer).await;
        panic!(
            "both batches must commit at once, each handler running once; got A {outcome_a:?}, \
             B {outcome_b:?}, handler runs {runs:?} (a batch started over: its transaction was \
             rolled back); PostgreSQL counted {deadlocks} deadlock(s) (deadlock detected, 40P01)"
        );
    }
    store.close().await;
    observer.close().await;
    db.remove().await;
}

fn dead_letter(event_id: &str) -> NewDeadLetter {
    NewDeadLetter {
        source: "stripe".into(),
        event_id: event_id.into(),
        event_type: "invoice.paid".into(),
        queue: "lock_order".into(),
        payload: b"{}".to_vec(),
        error: "fatal: test".into(),
        attempts: 1,
    }
}

/// Lists `rows` as one batch does, then commits.
async fn list_dead_letters(mut tx: StoreTx, rows: Vec<NewDeadLetter>) -> Result<(), String> {
    tx.insert_dead_letters_once(&rows)
        .await
        .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_listed_in_opposite_orders_both_commit() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let observer = PgPool::connect(&db.url).await.expect("connect");
    // A third transaction holds event 1's lock, so both batches line up behind it: A, which
    // lists 1 then 2, first; then B, which lists 2 then 1. Taken in the order given, B holds 2
    // when A gets 1 and wants 2.
    let mut holder = store.begin().await.expect("begin");
    holder
        .insert_dead_letter_once(&dead_letter("evt_1"))
        .await
        .expect("hold event 1's lock");
    let tx_a = store.begin().await.expect("begin");
    let a = tokio::spawn(list_dead_letters(
        tx_a,
        vec![dead_letter("evt_1"), dead_letter("evt_2")],
    ));
    wait_for_waiters(&observer, 1, "batch A").await;
    let tx_b = store.begin().await.expect("begin");
    let b = tokio::spawn(list_dead_letters(
        tx_b,
        vec![dead_letter("evt_2"), dead_letter("evt_1")],
    ));
    wait_for_waiters(&observer, 2, "batches A and B").await;
    holder.rollback().await.expect("rollback");

    let (a, b) = (a.await.expect("A"), b.await.expect("B"));
    assert!(
        a.is_ok() && b.is_ok(),
        "both batches must commit: A {a:?}, B {b:?}"
    );
    let listed: Vec<String> = store
        .dead_letters()
        .list(10)
        .await
        .expect("dead letters")
        .into_iter()
        .map(|d| d.event_id)
        .collect();
    assert_eq!(listed.len(), 2, "each event listed once: {listed:?}");
    store.close().await;
    observer.close().await;
    db.remove().await;
}
