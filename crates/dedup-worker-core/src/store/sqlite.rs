//! What every SQLite statement of the store shares: the write transaction, and statements over
//! id lists in chunks. SQLite has one writer at a time, so claims need no row locks: a single
//! `UPDATE … RETURNING` is atomic. Times are Unix milliseconds computed by the caller, since one
//! SQLite file is only ever used by processes on one machine. The statements themselves live
//! with their table family (queue.rs, outbox.rs, dead_letters.rs, dedup/, …: see the store's
//! module), each beside its PostgreSQL form.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::StoreError;

/// Rows per multi-row statement; keeps bound parameters far below SQLite's limit.
pub(super) const CHUNK: usize = 500;

/// Begins a write transaction holding SQLite's write lock from its first statement (`BEGIN
/// IMMEDIATE`), so other writers wait for it within the busy timeout. A deferred transaction
/// (sqlx's `begin`) that reads before it writes fails its first write at once with `database
/// is locked` (`SQLITE_BUSY_SNAPSHOT`, which no busy timeout waits out) whenever another
/// connection committed in between, and the ingress and the relay commit all the time. Every
/// SQLite transaction of this crate writes, and SQLite has one writer anyway: nothing is lost.
pub(crate) async fn begin_immediate(
    pool: &SqlitePool,
) -> Result<sqlx::Transaction<'static, Sqlite>, sqlx::Error> {
    pool.begin_with("BEGIN IMMEDIATE").await
}

/// Runs `head` followed by a bound id list and `)` for all `ids`, in chunks, in one transaction.
pub(super) async fn execute_for_ids(
    pool: &SqlitePool,
    head: &str,
    ids: &[i64],
) -> Result<(), StoreError> {
    let mut tx = begin_immediate(pool).await?;
    for chunk in ids.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(head);
        let mut list = qb.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        qb.push(")");
        qb.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Runs `set` (an UPDATE up to its WHERE) on the rows `ids` still under `claim_token` and
/// matching `also`, in chunks, in one transaction; returns the ids updated.
pub(super) async fn update_claimed(
    pool: &SqlitePool,
    set: &str,
    also: &str,
    claim_token: i64,
    ids: &[i64],
) -> Result<Vec<i64>, StoreError> {
    let mut updated = Vec::with_capacity(ids.len());
    let mut tx = begin_immediate(pool).await?;
    for chunk in ids.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(set);
        qb.push(" WHERE claim_token = ");
        qb.push_bind(claim_token);
        qb.push(also);
        qb.push(" AND id IN (");
        let mut list = qb.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        qb.push(") RETURNING id");
        let ids: Vec<i64> = qb.build_query_scalar().fetch_all(&mut *tx).await?;
        updated.extend(ids);
    }
    tx.commit().await?;
    Ok(updated)
}
