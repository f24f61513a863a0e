//! The dedup record on SQLite (see the module above). SQLite takes one writer at a time, so a
//! batch's read of the current generation and its insert never interleave with a rotation: a
//! rotation that commits between them makes the batch's write fail (its snapshot is stale) and
//! the batch is retried.

use std::time::Duration;

use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::{
    generation_length, keyed, next_slot, others, table, ProcessedEvent, RingMaintenance, Seal,
};
use crate::store::{millis, now_ms, StoreError};

/// Rows per statement: nine bound values each, under SQLite's default limit of 32,766.
const CHUNK: usize = 500;

/// The current generation's slot.
async fn current_generation(tx: &mut SqliteConnection) -> Result<i16, StoreError> {
    let rows: Vec<(i16, bool)> =
        sqlx::query_as("SELECT slot, sealed_at IS NOT NULL FROM dedup_generations")
            .fetch_all(&mut *tx)
            .await?;
    super::current_slot(&rows)
}

/// Records `events` at `now` (Unix ms): the transaction's start, which the outbox rows it
/// writes also carry (`events show` finds an event's outbox rows by that equality).
pub(crate) async fn insert_processed(
    tx: &mut SqliteConnection,
    now: i64,
    source: &str,
    events: &[ProcessedEvent],
) -> Result<Vec<String>, StoreError> {
    let current = current_generation(tx).await?;
    let rows = keyed(source, events);
    let mut new = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(CHUNK) {
        // The VALUES list's columns are column1 … column9 (key, source, id, type, time,
        // received, attempt, alias key, alias); every other generation is looked up, and an
        // alias everywhere.
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "INSERT INTO {} (key, source, event_id, event_type, processed_at, received_at,
                             delivery_attempt)
             SELECT e.column1, e.column2, e.column3, e.column4, e.column5, e.column6, e.column7
               FROM (",
            table(current)
        ));
        qb.push_values(chunk, |mut b, row| {
            b.push_bind(row.key.as_slice())
                .push_bind(source)
                .push_bind(&row.event.id)
                .push_bind(&row.event.event_type)
                .push_bind(now)
                .push_bind(row.event.received_at)
                .push_bind(row.event.delivery_attempt)
                .push_bind(row.alias.map(|key| key.to_vec()))
                .push_bind(row.event.alias.as_deref());
        });
        qb.push(
            ") AS e WHERE NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                  WHERE l.source = e.column2 AND l.event_id = e.column3)",
        );
        for slot in others(current) {
            qb.push(format!(
                " AND NOT EXISTS (SELECT 1 FROM {} p WHERE p.key = e.column1)",
                table(slot)
            ));
        }
        qb.push(
            " AND (e.column8 IS NULL OR (NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                  WHERE l.source = e.column2 AND l.event_id = e.column9)",
        );
        for slot in 0..super::RING_SLOTS {
            qb.push(format!(
                " AND NOT EXISTS (SELECT 1 FROM {} p WHERE p.key = e.column8)",
                table(slot)
            ));
        }
        qb.push(")) ON CONFLICT DO NOTHING RETURNING event_id");
        let ids: Vec<String> = qb.build_query_scalar().fetch_all(&mut *tx).await?;
        new.extend(ids);
    }
    Ok(new)
}

pub(crate) async fn delete_processed(
    tx: &mut SqliteConnection,
    source: &str,
    event_id: &str,
) -> Result<(), StoreError> {
    let current = current_generation(tx).await?;
    let key = super::dedup_key(source, event_id);
    sqlx::query(&format!("DELETE FROM {} WHERE key = $1", table(current)))
        .bind(key.as_slice())
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub(crate) async fn processed_among(
    pool: &SqlitePool,
    source: &str,
    ids: &[String],
) -> Result<Vec<String>, StoreError> {
    let mut found = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new("");
        for slot in 0..super::RING_SLOTS {
            qb.push(format!(
                "SELECT event_id FROM {} WHERE key IN (",
                table(slot)
            ));
            let mut list = qb.separated(", ");
            for id in chunk {
                list.push_bind(super::dedup_key(source, id).to_vec());
            }
            qb.push(") UNION ALL ");
        }
        qb.push("SELECT event_id FROM processed_events_legacy WHERE source = ");
        qb.push_bind(source);
        qb.push(" AND event_id IN (");
        let mut list = qb.separated(", ");
        for id in chunk {
            list.push_bind(id);
        }
        qb.push(")");
        let ids: Vec<String> = qb.build_query_scalar().fetch_all(pool).await?;
        found.extend(ids);
    }
    Ok(found)
}

/// As on PostgreSQL: empties the generations sealed longer ago than `window`, then seals the
/// current one if due (or at once) and starts the next, in one write transaction.
pub(crate) async fn maintain_generations(
    pool: &SqlitePool,
    window: Duration,
    seal: Seal,
) -> Result<RingMaintenance, StoreError> {
    let mut done = RingMaintenance::default();
    let now = now_ms();
    let mut tx = crate::store::sqlite::begin_immediate(pool).await?;
    let expired: Vec<i16> =
        sqlx::query_scalar("SELECT slot FROM dedup_generations WHERE sealed_at < $1 ORDER BY slot")
            .bind(now - millis(window))
            .fetch_all(&mut *tx)
            .await?;
    for slot in &expired {
        // A DELETE without WHERE: SQLite's truncate optimisation drops the pages at once. The
        // generation's duplicate deliveries go with its ids.
        for emptied in [table(*slot), super::duplicates_table(*slot)] {
            sqlx::query(&format!("DELETE FROM {emptied}"))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM dedup_generations WHERE slot = $1")
            .bind(slot)
            .execute(&mut *tx)
            .await?;
    }
    done.expired = expired.len();

    let (current, started_at): (i16, i64) =
        sqlx::query_as("SELECT slot, started_at FROM dedup_generations WHERE sealed_at IS NULL")
            .fetch_one(&mut *tx)
            .await?;
    let due = started_at <= now - millis(generation_length(window));
    if due || matches!(seal, Seal::Now) {
        let next = next_slot(current);
        let free: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM dedup_generations WHERE slot = $1)",
        )
        .bind(next)
        .fetch_one(&mut *tx)
        .await?;
        if free {
            sqlx::query("UPDATE dedup_generations SET sealed_at = $1 WHERE slot = $2")
                .bind(now_ms())
                .bind(current)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO dedup_generations (slot, started_at) VALUES ($1, $2)")
                .bind(next)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            done.sealed = true;
        } else {
            done.next_slot_busy = true;
        }
    }
    tx.commit().await?;
    Ok(done)
}
