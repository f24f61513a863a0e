//! Item 3 of issue 26: one lock order, the ring lock before any generation table's. A batch
//! takes the ring lock shared and then reads every generation; retention emptied an expired
//! generation (TRUNCATE: an exclusive lock on its table) and only then asked for the ring lock
//! exclusively, so a batch holding the shared lock that had not yet read that generation and
//! retention each waited for the other: "deadlock detected", a failed step (counting towards
//! RabbitMQ's delivery limit) or a failed pass. Retention now takes the ring lock first, and only
//! when it has something to expire or seal.

use std::time::Duration;

use sqlx::PgPool;

use super::{deliver, seal, start_binary, wait_for_waiters, Holder, WINDOW};
use crate::helpers::{db::execute, ledger_counts, Backend, TestDb, TestQueue, Transport};

/// Moves every generation a window and a day back in time: the next retention pass expires the
/// sealed ones and seals the current one, in one transaction.
const A_WINDOW_LATER: &str = "UPDATE dedup_generations
    SET sealed_at = sealed_at - interval '31 days', started_at = started_at - interval '31 days'";

/// At the store: a batch holds the ring lock shared and has not yet read generation 0; a
/// retention pass that expires generation 0 and seals generation 1 runs meanwhile; then the
/// batch records its ids. Both succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_a_generation_while_a_batch_holds_the_ring_lock_is_no_deadlock() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let observer = PgPool::connect(&db.url).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.insert_processed("stripe", &[("evt_old".into(), "test.event".into())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(seal(&store).await.sealed);
    execute(&store, A_WINDOW_LATER).await;

    // A batch in flight: the shared ring lock taken, no generation read yet.
    let mut batch = store.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(dedup_worker_core::store::dedup::RING_LOCK)
        .execute(batch.conn().postgres().unwrap())
        .await
        .unwrap();
    let expiring = tokio::spawn({
        let store = store.clone();
        async move { store.dedup().maintain(WINDOW).await }
    });
    // Retention waits for the batch (on the ring lock, or before the fix on it with generation
    // 0's table already locked).
    wait_for_waiters(
        &observer,
        Some("advisory"),
        1,
        "retention to wait for the batch",
    )
    .await;
    let recorded = batch
        .insert_processed(
            "stripe",
            &[
                ("evt_old".into(), "test.event".into()),
                ("evt_new".into(), "test.event".into()),
            ],
        )
        .await;
    let committed = match recorded {
        Ok(new) => batch.commit().await.map(|()| new),
        Err(error) => Err(error),
    };
    let expired = expiring.await.unwrap();
    let new = committed.unwrap_or_else(|e| panic!("the batch failed: {e:?}"));
    let expired = expired.unwrap_or_else(|e| panic!("the retention pass failed: {e:?}"));
    assert_eq!(
        expired.expired, 1,
        "generation 0 expired once the batch ended"
    );
    // The batch read generation 0 before it was emptied: evt_old was still a duplicate.
    assert_eq!(new, ["evt_new"]);
    observer.close().await;
    store.close().await;
    db.remove().await;
}

/// A pass with nothing to expire or seal does not take the ring lock: it does not wait for, nor
/// hold up, the batches in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_with_nothing_to_do_leaves_the_ring_lock_alone() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let held = Holder::ring_shared(&db).await;
    let exclusive = Holder::begin(&db).await;
    let mut exclusive = exclusive;
    // An exclusive waiter in the queue: a pass asking for the ring lock would wait behind it.
    let observer = PgPool::connect(&db.url).await.unwrap();
    let queued = tokio::spawn(async move {
        exclusive
            .run(&format!(
                "SELECT pg_advisory_xact_lock({})",
                dedup_worker_core::store::dedup::RING_LOCK
            ))
            .await;
        exclusive
    });
    wait_for_waiters(
        &observer,
        Some("advisory"),
        1,
        "the exclusive request to queue",
    )
    .await;
    let done = tokio::time::timeout(Duration::from_secs(10), store.dedup().maintain(WINDOW))
        .await
        .expect("a pass with nothing to do never waits on the ring lock")
        .unwrap();
    assert_eq!(done, Default::default());
    held.commit().await;
    queued.await.unwrap().commit().await;
    observer.close().await;
    store.close().await;
    db.remove().await;
}

/// Through the binary, its own retention every second: batch A (the `ledger` handler) has read
/// every generation and waits in its handler; the ring is moved a window back in time, and the
/// binary's retention pass starts (expire generation 0, seal generation 1); batch B begins.
/// Then A ends. Before the fix retention locked generation 0's table, then waited for B's
/// shared ring lock while B waited for that table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binarys_retention_expires_a_generation_under_traffic_without_deadlock() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let queue = TestQueue::new(Transport::Database).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start_binary(&db, &queue, 1, work.path());
    let observer = PgPool::connect(&db.url).await.unwrap();
    let client = reqwest::Client::new();

    deliver(&client, &bin, "evt_before").await;
    bin.wait_for(
        "evt_before to be consumed",
        Duration::from_secs(30),
        || async { queue.drained(&store).await.then_some(()) },
    )
    .await;
    assert!(seal(&store).await.sealed);

    let ledger = Holder::ledger(&db).await;
    deliver(&client, &bin, "evt_a").await;
    wait_for_waiters(
        &observer,
        Some("relation"),
        1,
        "batch A to wait in its handler",
    )
    .await;
    execute(&store, A_WINDOW_LATER).await;
    // The binary's next pass (within a second) waits for batch A, either way.
    wait_for_waiters(&observer, None, 2, "retention to wait for batch A").await;
    deliver(&client, &bin, "evt_b").await;
    wait_for_waiters(&observer, None, 3, "batch B to wait behind retention").await;
    ledger.commit().await;

    bin.wait_for(
        "the generation to expire and both events to be consumed",
        Duration::from_secs(30),
        || async {
            // Generation 0 expired, 1 sealed, 2 current.
            let generations: Vec<(i16, bool)> = sqlx::query_as(
                "SELECT slot, sealed_at IS NULL FROM dedup_worker.dedup_generations ORDER BY slot",
            )
            .fetch_all(&observer)
            .await
            .ok()?;
            (generations == [(1, false), (2, true)] && queue.drained(&store).await).then_some(())
        },
    )
    .await;
    let logged = bin.stderr();
    assert!(
        !logged.contains("deadlock detected"),
        "no deadlock between retention and the batches:\n{logged}"
    );
    let ledger = ledger_counts(&store).await;
    for id in ["evt_before", "evt_a", "evt_b"] {
        assert_eq!(ledger.get(id), Some(&1), "{id} handled once: {ledger:?}");
    }
    observer.close().await;
    store.close().await;
    drop(bin);
    db.remove().await;
}
