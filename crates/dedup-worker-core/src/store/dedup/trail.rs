//! What the dedup record tells `events show` of one event: its processed row (in whichever
//! generation, or the legacy table, holds it) and the later deliveries recognised as its
//! duplicates; and the consumer's write of those duplicates.
//!
//! Duplicates are kept in the ring like the ids (`duplicate_deliveries_N`, emptied with
//! `processed_events_N`): each is recorded in the generation current when it arrived, whichever
//! generation holds the id. Which generation that is matters only for how long the record is
//! kept, so it is read without the ring lock's protocol: a batch that races a seal and records
//! into the generation just sealed keeps its record a window after that seal, as long as any.

use std::sync::LazyLock;

use sqlx::{PgConnection, PgPool, QueryBuilder, Sqlite, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::{dedup_key, duplicates_table, table, RING_SLOTS};
use crate::store::{DuplicateDeliveries, ProcessedRecord, StoreError};

/// Rows per SQLite insert (two bound values each, far under its limit of 32,766).
const CHUNK: usize = 1000;

/// `SELECT {columns} FROM` each generation's table `WHERE key = $1`, and the legacy table
/// (by `$2`, `$3`: source and id) with `legacy` as its columns, as one UNION ALL.
fn each_table(columns: &str, legacy: &str) -> String {
    let mut parts: Vec<String> = (0..RING_SLOTS)
        .map(|s| format!("SELECT {columns} FROM {} WHERE key = $1", table(s)))
        .collect();
    parts.push(format!(
        "SELECT {legacy} FROM processed_events_legacy WHERE source = $2 AND event_id = $3"
    ));
    parts.join(" UNION ALL ")
}

/// PostgreSQL: a time as Unix milliseconds.
fn pg_ms(column: &str) -> String {
    format!("floor(extract(epoch FROM {column}) * 1000)::int8")
}

static PROCESSED_PG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT event_type, {}, {}, delivery_attempt
           FROM ({}) p ORDER BY processed_at DESC LIMIT 1",
        pg_ms("processed_at") + " AS processed_at",
        pg_ms("received_at") + " AS received_at",
        each_table(
            "event_type, processed_at, received_at, delivery_attempt",
            "event_type, processed_at, NULL::timestamptz, NULL::int4"
        )
    )
});

static PROCESSED_SQLITE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT event_type, processed_at, received_at, delivery_attempt
           FROM ({}) ORDER BY processed_at DESC LIMIT 1",
        each_table(
            "event_type, processed_at, received_at, delivery_attempt",
            "event_type, processed_at, NULL, NULL"
        )
    )
});

static TIMES: LazyLock<String> = LazyLock::new(|| each_table("processed_at", "processed_at"));

/// A subquery (both stores) of the times at which the event `($2, $3)`, keyed `$1` (a UUID on
/// PostgreSQL, a blob on SQLite), was recorded as processed (at most once within the window):
/// the outbox rows its batch wrote carry the same `created_at`.
pub(crate) fn processed_times() -> &'static str {
    &TIMES
}

pub(crate) async fn processed_record_pg(
    pool: &PgPool,
    source: &str,
    event_id: &str,
) -> Result<Option<ProcessedRecord>, StoreError> {
    Ok(sqlx::query_as(&PROCESSED_PG)
        .bind(Uuid::from_bytes(dedup_key(source, event_id)))
        .bind(source)
        .bind(event_id)
        .fetch_optional(pool)
        .await?)
}

pub(crate) async fn processed_record_sqlite(
    pool: &SqlitePool,
    source: &str,
    event_id: &str,
) -> Result<Option<ProcessedRecord>, StoreError> {
    Ok(sqlx::query_as(&PROCESSED_SQLITE)
        .bind(dedup_key(source, event_id).to_vec())
        .bind(source)
        .bind(event_id)
        .fetch_optional(pool)
        .await?)
}

/// The duplicates of the event keyed `key`, at most `limit` of them counted.
pub(crate) async fn duplicates_of_pg(
    pool: &PgPool,
    key: [u8; 16],
    limit: i64,
) -> Result<DuplicateDeliveries, StoreError> {
    let sql = format!(
        "SELECT count(*) AS count, {} AS first_at, {} AS last_at
           FROM (SELECT seen_at FROM duplicate_deliveries WHERE key = $1 LIMIT $2) d",
        pg_ms("min(seen_at)"),
        pg_ms("max(seen_at)")
    );
    Ok(sqlx::query_as(&sql)
        .bind(Uuid::from_bytes(key))
        .bind(limit)
        .fetch_one(pool)
        .await?)
}

pub(crate) async fn duplicates_of_sqlite(
    pool: &SqlitePool,
    key: [u8; 16],
    limit: i64,
) -> Result<DuplicateDeliveries, StoreError> {
    let each: Vec<String> = (0..RING_SLOTS)
        .map(|s| format!("SELECT seen_at FROM {} WHERE key = $1", duplicates_table(s)))
        .collect();
    let sql = format!(
        "SELECT count(*) AS count, min(seen_at) AS first_at, max(seen_at) AS last_at
           FROM ({} LIMIT $2)",
        each.join(" UNION ALL ")
    );
    Ok(sqlx::query_as(&sql)
        .bind(key.to_vec())
        .bind(limit)
        .fetch_one(pool)
        .await?)
}

/// Records one later delivery per key, in the batch transaction: one statement, whose
/// subquery routes the rows to the current generation's partition.
pub(crate) async fn record_duplicates_pg(
    tx: &mut PgConnection,
    keys: &[([u8; 16], &str)],
) -> Result<(), StoreError> {
    let (keys, types): (Vec<Uuid>, Vec<&str>) =
        keys.iter().map(|(k, t)| (Uuid::from_bytes(*k), *t)).unzip();
    sqlx::query(
        "INSERT INTO duplicate_deliveries (slot, key, event_type)
         SELECT (SELECT slot FROM dedup_generations WHERE sealed_at IS NULL), k, t
           FROM UNNEST($1::uuid[], $2::text[]) AS u(k, t)",
    )
    .bind(&keys)
    .bind(&types)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// As on PostgreSQL, at `now` (the transaction's start, Unix ms): the current generation is
/// read first (SQLite has no routing), in the same write transaction.
pub(crate) async fn record_duplicates_sqlite(
    tx: &mut SqliteConnection,
    now: i64,
    keys: &[([u8; 16], &str)],
) -> Result<(), StoreError> {
    let current: i16 =
        sqlx::query_scalar("SELECT slot FROM dedup_generations WHERE sealed_at IS NULL")
            .fetch_one(&mut *tx)
            .await?;
    for chunk in keys.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "INSERT INTO {} (key, seen_at, event_type) ",
            duplicates_table(current)
        ));
        qb.push_values(chunk, |mut b, (key, event_type)| {
            b.push_bind(key.to_vec())
                .push_bind(now)
                .push_bind(*event_type);
        });
        qb.build().execute(&mut *tx).await?;
    }
    Ok(())
}
