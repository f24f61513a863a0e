//! A database that exists for one test (PostgreSQL database or SQLite file: the test kit's
//! [`TestDb`]), a dedup row the test holds open, and what the stores hold.

use std::time::Duration;

use dedup_worker_core::store::Store;

pub use dedup_worker::testing::{pg_admin_url, Backend, TestDb};

/// An event's dedup row, inserted by the test in a transaction it keeps open: a consumer step
/// that receives the event waits server-side on its `INSERT … ON CONFLICT DO NOTHING` until the
/// row is released. A step made as slow as the test likes, with no hook in the product.
pub struct HeldDedupRow {
    /// The open transaction that inserted the row (through the store, into the current dedup
    /// generation, holding the generation lock shared as every batch does).
    lock: dedup_worker_core::store::StoreTx,
    /// The backend holding the row.
    holder_pid: i32,
    observer: sqlx::PgPool,
}

impl HeldDedupRow {
    /// Holds `(source, event_id)`'s row on the PostgreSQL database at `db_url`.
    pub async fn hold(db_url: &str, source: &str, event_id: &str) -> Self {
        let holder = Store::connect_url(db_url, 1, Duration::from_secs(10))
            .await
            .expect("connect");
        let mut lock = holder.begin().await.expect("begin");
        let dedup_worker_core::store::StoreTx::Postgres(tx) = &mut lock else {
            panic!("a held dedup row needs PostgreSQL");
        };
        let holder_pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **tx)
            .await
            .expect("backend pid");
        let new = lock
            .insert_processed(source, &[(event_id.to_owned(), "held".to_owned())])
            .await
            .expect("insert the dedup row");
        assert_eq!(new, [event_id], "the held id was new");
        let observer = sqlx::PgPool::connect(db_url).await.expect("connect");
        HeldDedupRow {
            lock,
            holder_pid,
            observer,
        }
    }

    /// Database sessions waiting for the row now (consumer steps that received its event).
    pub async fn waiting(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(self.holder_pid)
        .fetch_one(&self.observer)
        .await
        .expect("blocked sessions")
    }

    /// Rolls the row back: the waiting steps go on, and the first to insert it handles the event.
    pub async fn release(self) {
        self.lock.rollback().await.expect("rollback");
        self.observer.close().await;
    }
}

/// Rows in the example handler's table, per event id.
pub async fn ledger_counts(store: &Store) -> std::collections::HashMap<String, i64> {
    let sql = "SELECT event_id, count(*) FROM event_ledger GROUP BY event_id";
    let rows: Vec<(String, i64)> = match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("ledger");
    rows.into_iter().collect()
}

/// Runs `sql` on the store (either backend), failing the test if it fails.
pub async fn execute(store: &Store, sql: &str) {
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query(sql).execute(pool).await.map(drop),
        (_, Some(pool)) => sqlx::query(sql).execute(pool).await.map(drop),
        (None, None) => unreachable!("a store is one of the two"),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// True when nothing is left to do: queue empty and no pending outbox rows.
pub async fn pipeline_drained(store: &Store, queue: &str) -> bool {
    let depth = store.queue().depth(queue).await.unwrap_or(i64::MAX);
    let counts = store
        .outbox()
        .counts()
        .await
        .map(|c| c.pending)
        .unwrap_or(i64::MAX);
    depth == 0 && counts == 0
}

/// Polls the store's outbox counts until `done` holds for them, or panics with `what` after
/// `timeout`.
pub async fn wait_for_outbox<F>(store: &Store, what: &str, timeout: Duration, done: F)
where
    F: Fn(&dedup_worker_core::store::OutboxCounts) -> bool,
{
    super::wait_for(what, timeout, || async {
        let counts = store.outbox().counts().await.ok()?;
        done(&counts).then_some(())
    })
    .await;
}

/// The PostgreSQL database's name in `url` (its last path segment).
pub fn database_name(url: &str) -> &str {
    url.rsplit('/').next().expect("a database url")
}
