//! Item 1 of issue 26: the ring relies on READ COMMITTED (a batch reads which generation is
//! current in a statement after the one that waited for the ring lock, so it sees a seal that
//! committed meanwhile). On a database whose `default_transaction_isolation` is `repeatable
//! read`, a batch's snapshot is taken by the statement that waits for the lock: a batch that
//! waited during a seal wrote into the sealed generation, while a retry after the seal, in the
//! new generation, could not see that uncommitted row, and both handled the event. The store
//! pins READ COMMITTED on its connections and on each transaction it begins.

use std::time::Duration;

use dedup_worker_core::store::Store;
use sqlx::PgPool;

use super::{deliver, seal, start_binary, wait_for_waiters, Holder};
use crate::helpers::db::{database_name, pg_admin_url};
use crate::helpers::{ledger_counts, Backend, TestDb, TestQueue, Transport};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_waited_on_a_seal_and_a_retry_after_it_handle_an_event_once_under_repeatable_read(
) {
    handled_once_across_a_seal_under("repeatable read").await;
}

/// At SERIALIZABLE, PostgreSQL's own conflict detection already kept the event from being
/// handled twice before the store pinned READ COMMITTED, by aborting one of the batches ("could
/// not serialize access", a failed step that counts towards a broker's delivery limit; the
/// property test in `dedup_model` shows those aborts). Kept as the guard for the level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_waited_on_a_seal_and_a_retry_after_it_handle_an_event_once_under_serializable(
) {
    handled_once_across_a_seal_under("serializable").await;
}

/// The store's transactions and its pool's sessions are READ COMMITTED on such a database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_reads_committed_whatever_the_database_default() {
    for level in ["repeatable read", "serializable"] {
        let db = TestDb::new(Backend::Postgres).await;
        set_default_isolation(&db, level).await;
        let store = db.store().await;
        let mut tx = store.begin().await.unwrap();
        let in_tx: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(tx.conn().postgres().unwrap())
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            in_tx, "read committed",
            "Store::begin on a {level} database"
        );
        // Single statements on the pool (queue and outbox claims, marks) too.
        let pool = store.postgres_pool().unwrap();
        let session: String = sqlx::query_scalar("SHOW default_transaction_isolation")
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(
            session, "read committed",
            "a pool session on a {level} database"
        );
        store.close().await;
        // A session whose default was changed after it connected: each BEGIN still pins it.
        let one = Store::connect_url(&db.url, 1, Duration::from_secs(5))
            .await
            .unwrap();
        let pool = one.postgres_pool().unwrap();
        sqlx::query(&format!("SET default_transaction_isolation = '{level}'"))
            .execute(pool)
            .await
            .unwrap();
        let mut tx = one.begin().await.unwrap();
        let in_tx: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(tx.conn().postgres().unwrap())
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(in_tx, "read committed", "Store::begin after SET {level}");
        one.close().await;
        db.remove().await;
    }
}

async fn set_default_isolation(db: &TestDb, level: &str) {
    let admin = PgPool::connect(&pg_admin_url()).await.unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE {} SET default_transaction_isolation = '{level}'",
        database_name(&db.url)
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
}

/// The race of the issue, through the binary (two consumer workers, the `ledger` handler):
/// 1. the test holds the ring lock shared (a batch in flight) and the ledger table (so a batch
///    that reached its handler stays open);
/// 2. a seal starts and waits for the lock;
/// 3. `evt_iso` is delivered: worker A's batch begins and waits behind the seal;
/// 4. the in-flight batch ends: the seal commits, A goes on, records `evt_iso` and waits in its
///    handler, uncommitted;
/// 5. `evt_iso` is delivered again (Stripe's retry): worker B's batch records it, or finds A's;
/// 6. the ledger is released: both batches commit.
///
/// The ledger must hold `evt_iso` once.
async fn handled_once_across_a_seal_under(level: &str) {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    set_default_isolation(&db, level).await;
    let queue = TestQueue::new(Transport::Database).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start_binary(&db, &queue, 3600, work.path());
    let observer = PgPool::connect(&db.url).await.unwrap();
    let client = reqwest::Client::new();

    let in_flight = Holder::ring_shared(&db).await;
    let ledger = Holder::ledger(&db).await;
    let sealing = tokio::spawn({
        let store = store.clone();
        async move { seal(&store).await }
    });
    wait_for_waiters(
        &observer,
        Some("advisory"),
        1,
        "the seal to wait for the ring lock",
    )
    .await;

    deliver(&client, &bin, "evt_iso").await;
    wait_for_waiters(
        &observer,
        Some("advisory"),
        2,
        "worker A's batch to wait behind the seal",
    )
    .await;

    in_flight.commit().await;
    let sealed = sealing.await.unwrap();
    assert!(
        sealed.sealed,
        "the seal went through once the batch in flight ended"
    );
    wait_for_waiters(
        &observer,
        Some("relation"),
        1,
        "worker A's batch to record evt_iso and wait in its handler",
    )
    .await;

    deliver(&client, &bin, "evt_iso").await;
    // B waits either in its handler (it recorded the id too) or on A's uncommitted dedup row.
    wait_for_waiters(&observer, None, 2, "worker B's batch to wait as well").await;
    ledger.commit().await;

    bin.wait_for(
        "both deliveries to be consumed",
        Duration::from_secs(30),
        || async { queue.drained(&store).await.then_some(()) },
    )
    .await;
    let ledger = ledger_counts(&store).await;
    assert_eq!(
        ledger.get("evt_iso"),
        Some(&1),
        "evt_iso handled once on a database defaulting to {level}: {ledger:?}\n{}",
        bin.stderr()
    );
    observer.close().await;
    store.close().await;
    drop(bin);
    db.remove().await;
}
