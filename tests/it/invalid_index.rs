//! Issue 26, item 8: an interrupted `CREATE INDEX CONCURRENTLY IF NOT EXISTS` leaves an invalid
//! index; the next run's `IF NOT EXISTS` skipped it and recorded the migration as applied, with
//! an index that does nothing. Reproduced for real on PostgreSQL: the binary's `migrate` builds
//! `outbox_failed` (migration 20261210000001) while the test holds a lock that makes the build
//! wait, the test cancels the building backend (`pg_cancel_backend`), and the index is left
//! invalid; sqlx's migrator run again records the migration as applied with it still invalid
//! (the bug). The binary's next `migrate` leaves it valid, saying so. Likewise the invalid `_ccnew` copy a
//! cancelled `REINDEX INDEX CONCURRENTLY` leaves is dropped.

use std::process::Stdio;
use std::time::Duration;

use sqlx::{Executor, PgPool};

use crate::helpers::{dedup_command, run_cli, wait_for, Backend, TestDb};

/// The migration that builds `dedup_worker.outbox_failed` concurrently.
const OUTBOX_FAILED_INDEX: i64 = 20261210000001;

/// The library's migrations, as sqlx's migrator runs them without dedup-worker's runner.
static LIBRARY: sqlx::migrate::Migrator =
    sqlx::migrate!("crates/dedup-worker-core/migrations/postgres");

/// Whether the migration that builds the index is recorded as applied.
async fn recorded(pool: &PgPool) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT success FROM dedup_worker._sqlx_migrations WHERE version = $1",
    )
    .bind(OUTBOX_FAILED_INDEX)
    .fetch_optional(pool)
    .await
    .unwrap()
    .unwrap_or(false)
}

/// `(name, valid)` of `outbox_failed` and the copies a `REINDEX CONCURRENTLY` makes of it
/// (`outbox_failed_ccnew`, `…_ccold`), not the outbox's other indexes.
async fn outbox_failed_indexes(pool: &PgPool) -> Vec<(String, bool)> {
    sqlx::query_as(
        "SELECT c.relname::text, i.indisvalid FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indexrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'dedup_worker' \
            AND (c.relname = 'outbox_failed' OR c.relname LIKE 'outbox\\_failed\\_cc%') \
          ORDER BY c.relname",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A session that holds `ROW EXCLUSIVE` on the outbox (as any writer's open transaction does),
/// so a concurrent index build or rebuild on it waits; its backend pid.
async fn hold_the_outbox(pool: &PgPool) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut holder = pool.begin().await.unwrap();
    holder
        .execute("LOCK TABLE dedup_worker.outbox IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    (holder, pid)
}

/// Waits for a session blocked by `holder_pid`, then cancels its statement (as a deploy's
/// timeout or an operator would).
async fn cancel_the_blocked_build(pool: &PgPool, holder_pid: i32) {
    let pid: i32 = wait_for(
        "a concurrent index build waiting for the held lock",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) \
                  AND query ILIKE '%CONCURRENTLY%'",
            )
            .bind(holder_pid)
            .fetch_optional(pool)
            .await
            .unwrap()
        },
    )
    .await;
    let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(cancelled, "pg_cancel_backend({pid})");
}

/// `migrate` through the binary; its stderr (it must succeed).
fn migrate(db: &TestDb) -> String {
    let out = dedup_command(&[("DATABASE_URL", db.url.clone())])
        .arg("migrate")
        .output()
        .expect("run migrate");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "migrate failed: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_left_invalid_by_an_interrupted_concurrent_build_is_rebuilt_by_migrate() {
    let db = TestDb::new(Backend::Postgres).await;
    let env = [("DATABASE_URL", db.url.clone())];
    run_cli(&env, &["migrate"]);
    let pool = PgPool::connect(&db.url).await.unwrap();
    // The database as the version before that migration left it.
    pool.execute("DROP INDEX dedup_worker.outbox_failed")
        .await
        .unwrap();
    sqlx::query("DELETE FROM dedup_worker._sqlx_migrations WHERE version = $1")
        .bind(OUTBOX_FAILED_INDEX)
        .execute(&pool)
        .await
        .unwrap();

    // The upgrade's build is interrupted mid-way.
    let (holder, holder_pid) = hold_the_outbox(&pool).await;
    let interrupted = dedup_command(&env)
        .arg("migrate")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start migrate");
    cancel_the_blocked_build(&pool, holder_pid).await;
    let out = tokio::task::spawn_blocking(move || interrupted.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the interrupted migrate succeeded");
    assert!(stderr.contains("canceling statement"), "{stderr}");
    holder.rollback().await.unwrap();
    assert_eq!(
        outbox_failed_indexes(&pool).await,
        [("outbox_failed".to_owned(), false)],
        "the cancelled build left its index invalid"
    );
    // What the next run did before this fix, as sqlx's migrator alone does it: `IF NOT EXISTS`
    // skips the invalid index and the migration is recorded as applied.
    let mut conn = pool.acquire().await.unwrap();
    conn.execute("SET search_path TO dedup_worker")
        .await
        .unwrap();
    LIBRARY.run(&mut *conn).await.unwrap();
    drop(conn);
    assert!(recorded(&pool).await);
    assert_eq!(
        outbox_failed_indexes(&pool).await,
        [("outbox_failed".to_owned(), false)],
        "recorded as applied, the index still invalid"
    );

    // The binary's migrate: the index is valid, the migration still recorded.
    let logged = migrate(&db);
    assert_eq!(
        outbox_failed_indexes(&pool).await,
        [("outbox_failed".to_owned(), true)],
        "migrate left the index invalid; it logged:\n{logged}"
    );
    assert!(
        logged.contains("rebuilt an invalid index") && logged.contains("outbox_failed"),
        "{logged}"
    );
    assert!(recorded(&pool).await);

    // A REINDEX CONCURRENTLY interrupted the same way leaves an invalid `_ccnew` copy beside
    // the index; migrate drops it.
    let (holder, holder_pid) = hold_the_outbox(&pool).await;
    let reindexer = pool.clone();
    let reindex = tokio::spawn(async move {
        reindexer
            .execute("REINDEX INDEX CONCURRENTLY dedup_worker.outbox_failed")
            .await
    });
    cancel_the_blocked_build(&pool, holder_pid).await;
    let error = reindex.await.unwrap().expect_err("cancelled");
    assert!(error.to_string().contains("canceling statement"), "{error}");
    holder.rollback().await.unwrap();
    assert_eq!(
        outbox_failed_indexes(&pool).await,
        [
            ("outbox_failed".to_owned(), true),
            ("outbox_failed_ccnew".to_owned(), false)
        ]
    );
    let logged = migrate(&db);
    assert_eq!(
        outbox_failed_indexes(&pool).await,
        [("outbox_failed".to_owned(), true)],
        "{logged}"
    );
    assert!(logged.contains("outbox_failed_ccnew"), "{logged}");
    pool.close().await;
}
