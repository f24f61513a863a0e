//! The dedup record on PostgreSQL (see the module above for the layout and its guarantees).

use std::sync::LazyLock;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{
    generation_length, keyed, next_slot, others, table, ProcessedEvent, RingMaintenance, Seal,
};
use super::{RING_LOCK, RING_LOCK_TIMEOUT, RING_SLOTS};
use crate::store::postgres::RETENTION_LOCK;
use crate::store::StoreError;

/// The insert for each current slot: into that generation's table, unless the legacy table or
/// another generation holds the id (every one: see the module above); the primary key settles
/// the rest. An event with an alias (`e.ak`, `e.ai`) is inserted only if no generation, the current
/// one included, nor the legacy table holds the alias either; `e.ak IS NULL`, written first,
/// spares every other event those probes. `processed_at` is the transaction's now(), as is the
/// `created_at` of the outbox rows the batch writes: `events show` finds an event's outbox rows
/// by that equality.
static INSERT_SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
    let alias_lookups: String = (0..RING_SLOTS)
        .map(|s| {
            format!(
                "\n        AND NOT EXISTS (SELECT 1 FROM {} p WHERE p.key = e.ak)",
                table(s)
            )
        })
        .collect();
    (0..RING_SLOTS)
        .map(|current| {
            let lookups: String = others(current)
                .map(|s| {
                    format!(
                        "\n   AND NOT EXISTS (SELECT 1 FROM {} p WHERE p.key = e.key)",
                        table(s)
                    )
                })
                .collect();
            format!(
                "INSERT INTO {} (key, source, event_id, event_type, received_at, delivery_attempt)
                 SELECT e.key, $1, e.id, e.t, to_timestamp(e.r / 1000.0::float8), e.a
                   FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::int8[], $6::int4[],
                               $7::uuid[], $8::text[]) AS e(key, id, t, r, a, ak, ai)
                  WHERE NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                                     WHERE l.source = $1 AND l.event_id = e.id){lookups}
                    AND (e.ak IS NULL OR (NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                                           WHERE l.source = $1 AND l.event_id = e.ai){alias_lookups}))
                 ON CONFLICT DO NOTHING
                 RETURNING event_id",
                table(current)
            )
        })
        .collect()
});

/// Which of a list of keys (and, in the legacy table, of ids) are recorded.
static AMONG_SQL: LazyLock<String> = LazyLock::new(|| {
    let mut parts: Vec<String> = (0..RING_SLOTS)
        .map(|s| format!("SELECT event_id FROM {} WHERE key = ANY($1)", table(s)))
        .collect();
    parts.push(
        "SELECT event_id FROM processed_events_legacy WHERE source = $2 AND event_id = ANY($3)"
            .into(),
    );
    parts.join(" UNION ALL ")
});

/// The current generation's slot. Read under the shared ring lock, held to the transaction's end. Two statements on purpose: a statement's snapshot
/// is taken when it starts, so a read in the statement that waited for the lock could still see
/// the generation a seal has just closed.
async fn current_generation(tx: &mut PgConnection) -> Result<i16, StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(RING_LOCK)
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(i16, bool)> =
        sqlx::query_as("SELECT slot, sealed_at IS NOT NULL FROM dedup_generations")
            .fetch_all(&mut *tx)
            .await?;
    super::current_slot(&rows)
}

pub(crate) async fn insert_processed(
    tx: &mut PgConnection,
    source: &str,
    events: &[ProcessedEvent],
) -> Result<Vec<String>, StoreError> {
    let rows = keyed(source, events);
    let keys: Vec<Uuid> = rows.iter().map(|r| Uuid::from_bytes(r.key)).collect();
    let ids: Vec<&str> = rows.iter().map(|r| r.event.id.as_str()).collect();
    let types: Vec<&str> = rows.iter().map(|r| r.event.event_type.as_str()).collect();
    let received: Vec<Option<i64>> = rows.iter().map(|r| r.event.received_at).collect();
    let attempts: Vec<Option<i32>> = rows.iter().map(|r| r.event.delivery_attempt).collect();
    let alias_keys: Vec<Option<Uuid>> =
        rows.iter().map(|r| r.alias.map(Uuid::from_bytes)).collect();
    let aliases: Vec<Option<&str>> = rows.iter().map(|r| r.event.alias.as_deref()).collect();
    let current = current_generation(tx).await?;
    Ok(sqlx::query_scalar(&INSERT_SQL[current as usize])
        .bind(source)
        .bind(&keys)
        .bind(&ids)
        .bind(&types)
        .bind(&received)
        .bind(&attempts)
        .bind(&alias_keys)
        .bind(&aliases)
        .fetch_all(&mut *tx)
        .await?)
}

/// Undoes an insert of this transaction: the row is in the current generation, which cannot
/// change while the transaction holds the shared ring lock.
pub(crate) async fn delete_processed(
    tx: &mut PgConnection,
    source: &str,
    event_id: &str,
) -> Result<(), StoreError> {
    let current = current_generation(tx).await?;
    let sql = format!("DELETE FROM {} WHERE key = $1", table(current));
    sqlx::query(&sql)
        .bind(Uuid::from_bytes(super::dedup_key(source, event_id)))
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub(crate) async fn processed_among(
    pool: &PgPool,
    source: &str,
    ids: &[String],
) -> Result<Vec<String>, StoreError> {
    let keys: Vec<Uuid> = ids
        .iter()
        .map(|id| Uuid::from_bytes(super::dedup_key(source, id)))
        .collect();
    Ok(sqlx::query_scalar(&AMONG_SQL)
        .bind(&keys)
        .bind(source)
        .bind(ids)
        .fetch_all(pool)
        .await?)
}

/// One maintenance pass: empties the generations sealed longer ago than `window`, then seals
/// the current one if due (or at once with [`Seal::Now`]) and starts the next. One process at
/// a time (the retention lock; others return at once), in one short transaction whose lock
/// waits are bounded by [`RING_LOCK_TIMEOUT`].
///
/// Lock order: the ring lock (exclusive) before any generation table's lock, as batches take
/// the ring lock (shared) before they read the generations. Emptying a table first and asking
/// for the ring lock after it made a cycle with a batch that held the shared lock and had not
/// yet read that table ("deadlock detected"). The ring lock is taken only when the pass has
/// something to expire or seal: a pass with nothing to do never waits for, nor holds up, the
/// batches.
pub(crate) async fn maintain_generations(
    pool: &PgPool,
    window: Duration,
    seal: Seal,
) -> Result<RingMaintenance, StoreError> {
    let mut done = RingMaintenance::default();
    let mut tx = crate::store::postgres::begin(pool).await?;
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(RETENTION_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !ours {
        return Ok(done);
    }
    sqlx::query(&format!(
        "SET LOCAL lock_timeout = {}",
        RING_LOCK_TIMEOUT.as_millis()
    ))
    .execute(&mut *tx)
    .await?;
    // What to do, read before any lock but the retention lock: only a maintenance pass (which
    // that lock keeps to one at a time) changes dedup_generations.
    let expired: Vec<i16> = sqlx::query_scalar(
        "SELECT slot FROM dedup_generations
          WHERE sealed_at < now() - make_interval(secs => $1) ORDER BY slot",
    )
    .bind(window.as_secs_f64())
    .fetch_all(&mut *tx)
    .await?;
    let (current, due): (i16, bool) = sqlx::query_as(
        "SELECT slot, started_at <= now() - make_interval(secs => $1)
           FROM dedup_generations WHERE sealed_at IS NULL",
    )
    .bind(generation_length(window).as_secs_f64())
    .fetch_one(&mut *tx)
    .await?;
    let next = next_slot(current);
    let sealing = due || matches!(seal, Seal::Now);
    // The next slot is free if no generation uses it, or if this pass empties it.
    let next_free = sealing
        && (expired.contains(&next)
            || sqlx::query_scalar(
                "SELECT NOT EXISTS (SELECT 1 FROM dedup_generations WHERE slot = $1)",
            )
            .bind(next)
            .fetch_one(&mut *tx)
            .await?);
    done.next_slot_busy = sealing && !next_free;
    if expired.is_empty() && !next_free {
        tx.commit().await?;
        return Ok(done);
    }

    // Waits for every batch in flight (they hold it shared from before they read any
    // generation to their commit), so none of them holds a lock on a table emptied below, nor
    // can still commit into `current`; batches that start from here wait for this commit and
    // then read `next`.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(RING_LOCK)
        .execute(&mut *tx)
        .await?;
    for slot in &expired {
        // The generation's duplicate deliveries go with its ids.
        sqlx::query(&format!(
            "TRUNCATE {}, {}",
            table(*slot),
            super::duplicates_table(*slot)
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM dedup_generations WHERE slot = $1")
            .bind(slot)
            .execute(&mut *tx)
            .await?;
    }
    done.expired = expired.len();
    if next_free {
        // The clock after the lock: every id of `current` committed before this instant,
        // which lookups by creation time rely on.
        sqlx::query("UPDATE dedup_generations SET sealed_at = clock_timestamp() WHERE slot = $1")
            .bind(current)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO dedup_generations (slot) VALUES ($1)")
            .bind(next)
            .execute(&mut *tx)
            .await?;
        done.sealed = true;
    }
    tx.commit().await?;
    Ok(done)
}
