//! SQLite statements for the embedded default. SQLite has one writer at a time, so claims need
//! no row locks: a single `UPDATE … RETURNING` is atomic. Times are Unix milliseconds computed
//! here, since one SQLite file is only ever used by processes on one machine.

use std::time::Duration;

use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};

use super::{
    millis, now_ms, DeadLetter, NewDeadLetter, NewOutboxRow, NewQueueMessage, OutboxClaim,
    OutboxCounts, OutboxRow, QueuedMessage, StoreError,
};

/// Rows per multi-row statement; keeps bound parameters far below SQLite's limit.
const CHUNK: usize = 500;

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

pub(super) async fn enqueue(
    pool: &SqlitePool,
    queue: &str,
    messages: &[NewQueueMessage],
) -> Result<(), StoreError> {
    let now = now_ms();
    let mut tx = begin_immediate(pool).await?;
    for chunk in messages.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO queue_messages (queue, source, message_id, message_type, payload, visible_at, enqueued_at, traceparent, stripe_signature) ",
        );
        qb.push_values(chunk, |mut b, m| {
            b.push_bind(queue)
                .push_bind(m.source.as_deref())
                .push_bind(m.message_id.as_deref())
                .push_bind(m.message_type.as_deref())
                .push_bind(m.payload.as_slice())
                .push_bind(now)
                .push_bind(now)
                .push_bind(m.traceparent.as_deref())
                .push_bind(m.stripe_signature.as_deref());
        });
        qb.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn claim_messages(
    pool: &SqlitePool,
    queue: &str,
    max: usize,
    lease: Duration,
    claim_token: i64,
) -> Result<Vec<QueuedMessage>, StoreError> {
    let now = now_ms();
    let rows = sqlx::query_as::<_, QueuedMessage>(
        "UPDATE queue_messages SET visible_at = $1, attempts = attempts + 1, claim_token = $5
          WHERE id IN (SELECT id FROM queue_messages
                        WHERE queue = $2 AND visible_at <= $3
                        ORDER BY visible_at, id LIMIT $4)
      RETURNING id, source, message_id, message_type, payload, attempts, enqueued_at,
                traceparent, stripe_signature, claim_token",
    )
    .bind(now + millis(lease))
    .bind(queue)
    .bind(now)
    .bind(max as i64)
    .bind(claim_token)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

pub(super) async fn ack_messages(pool: &SqlitePool, ids: &[i64]) -> Result<(), StoreError> {
    execute_for_ids(pool, "DELETE FROM queue_messages WHERE id IN (", ids).await
}

/// Runs `head` followed by a bound id list and `)` for all `ids`, in chunks, in one transaction.
async fn execute_for_ids(pool: &SqlitePool, head: &str, ids: &[i64]) -> Result<(), StoreError> {
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

pub(super) async fn release_message(
    pool: &SqlitePool,
    id: i64,
    claim_token: i64,
    delay: Duration,
) -> Result<u64, StoreError> {
    Ok(
        sqlx::query("UPDATE queue_messages SET visible_at = $1 WHERE id = $2 AND claim_token = $3")
            .bind(now_ms() + millis(delay))
            .bind(id)
            .bind(claim_token)
            .execute(pool)
            .await?
            .rows_affected(),
    )
}

pub(super) async fn extend_message_leases(
    pool: &SqlitePool,
    claim_token: i64,
    ids: &[i64],
    lease: Duration,
) -> Result<Vec<i64>, StoreError> {
    let set = format!(
        "UPDATE queue_messages SET visible_at = {}",
        now_ms() + millis(lease)
    );
    update_claimed(pool, &set, "", claim_token, ids).await
}

/// Runs `set` (an UPDATE up to its WHERE) on the rows `ids` still under `claim_token` and
/// matching `also`, in chunks, in one transaction; returns the ids updated.
async fn update_claimed(
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

pub(super) async fn queue_depth(pool: &SqlitePool, queue: &str) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM queue_messages WHERE queue = $1")
            .bind(queue)
            .fetch_one(pool)
            .await?,
    )
}

/// Writes `rows` created at `now`: the transaction's start, the time of the processed ids it
/// records too (`events show` finds an event's outbox rows by that equality).
pub(super) async fn insert_outbox(
    tx: &mut SqliteConnection,
    now: i64,
    rows: &[NewOutboxRow],
) -> Result<(), StoreError> {
    for chunk in rows.chunks(CHUNK / 2) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload, \
             next_attempt_at, created_at, traceparent) ",
        );
        qb.push_values(chunk, |mut b, r| {
            b.push_bind(&r.source)
                .push_bind(&r.event_id)
                .push_bind(r.destination.as_deref())
                .push_bind(&r.idempotency_key)
                .push_bind(&r.event_type)
                .push_bind(r.payload.as_slice())
                .push_bind(now)
                .push_bind(now)
                .push_bind(r.traceparent.as_deref());
        });
        qb.build().execute(&mut *tx).await?;
    }
    Ok(())
}

pub(super) async fn insert_dead_letter(
    tx: &mut SqliteConnection,
    row: &NewDeadLetter,
    once: bool,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts, created_at)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8
          WHERE NOT ($9 AND $2 <> '' AND EXISTS (
                SELECT 1 FROM dead_letters WHERE source = $1 AND event_id = $2 AND queue = $4))",
    )
    .bind(&row.source)
    .bind(&row.event_id)
    .bind(&row.event_type)
    .bind(&row.queue)
    .bind(&row.payload)
    .bind(&row.error)
    .bind(row.attempts)
    .bind(now_ms())
    .bind(once)
    .execute(tx)
    .await?
    .rows_affected())
}

pub(super) async fn claim_outbox(
    pool: &SqlitePool,
    max: usize,
    lease: Duration,
    claim_token: i64,
) -> Result<Vec<OutboxRow>, StoreError> {
    let now = now_ms();
    Ok(sqlx::query_as::<_, OutboxRow>(
        "UPDATE outbox SET next_attempt_at = $1, attempts = attempts + 1, claim_token = $4
          WHERE id IN (SELECT id FROM outbox
                        WHERE status = 'pending' AND next_attempt_at <= $2
                        ORDER BY next_attempt_at LIMIT $3)
      RETURNING id, source, event_id, destination, idempotency_key, event_type, payload, attempts,
                traceparent, claim_token",
    )
    .bind(now + millis(lease))
    .bind(now)
    .bind(max as i64)
    .bind(claim_token)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn mark_dispatched(
    pool: &SqlitePool,
    claims: &[OutboxClaim],
) -> Result<u64, StoreError> {
    let mut marked = 0;
    let mut tx = begin_immediate(pool).await?;
    // Two parameters a claim: half a chunk of claims per statement.
    for chunk in claims.chunks(CHUNK / 2) {
        // 'dispatched' too: marking again under the same claim is a no-op that still counts.
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "UPDATE outbox SET status = 'dispatched', last_error = NULL, \
             dispatched_at = coalesce(dispatched_at, CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
             WHERE status IN ('pending', 'dispatched') AND (id, claim_token) IN (",
        );
        qb.push_values(chunk, |mut b, claim| {
            b.push_bind(claim.id).push_bind(claim.claim_token);
        });
        qb.push(")");
        marked += qb.build().execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(marked)
}

pub(super) async fn extend_outbox_leases(
    pool: &SqlitePool,
    claim_token: i64,
    ids: &[i64],
    lease: Duration,
) -> Result<Vec<i64>, StoreError> {
    let set = format!(
        "UPDATE outbox SET next_attempt_at = {}",
        now_ms() + millis(lease)
    );
    update_claimed(pool, &set, " AND status = 'pending'", claim_token, ids).await
}

pub(super) async fn release_outbox_leases(
    pool: &SqlitePool,
    claim_token: i64,
    ids: &[i64],
) -> Result<u64, StoreError> {
    let set = format!("UPDATE outbox SET next_attempt_at = {}", now_ms());
    let released = update_claimed(pool, &set, " AND status = 'pending'", claim_token, ids).await?;
    Ok(released.len() as u64)
}

pub(super) async fn mark_delivery_failed(
    pool: &SqlitePool,
    claim: OutboxClaim,
    error: &str,
    delay: Duration,
    max_attempts: u32,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE outbox
            SET last_error = $1,
                next_attempt_at = $2,
                status = CASE WHEN attempts >= $3 THEN 'failed' ELSE 'pending' END
          WHERE id = $4 AND claim_token = $5 AND status = 'pending'",
    )
    .bind(error)
    .bind(now_ms() + millis(delay))
    .bind(max_attempts as i64)
    .bind(claim.id)
    .bind(claim.claim_token)
    .execute(pool)
    .await?
    .rows_affected())
}

pub(super) async fn outbox_counts(pool: &SqlitePool) -> Result<OutboxCounts, StoreError> {
    let row = sqlx::query(
        "SELECT coalesce(sum(status = 'pending'), 0),
                coalesce(sum(status = 'dispatched'), 0),
                coalesce(sum(status = 'failed'), 0)
           FROM outbox",
    )
    .fetch_one(pool)
    .await?;
    Ok(OutboxCounts {
        pending: row.try_get(0)?,
        dispatched: row.try_get(1)?,
        failed: row.try_get(2)?,
    })
}

pub(super) async fn failed_outbox(
    pool: &SqlitePool,
    limit: i64,
) -> Result<Vec<OutboxRow>, StoreError> {
    Ok(sqlx::query_as::<_, OutboxRow>(
        "SELECT id, source, event_id, destination, idempotency_key, event_type, payload,
                attempts, traceparent, coalesce(claim_token, 0) AS claim_token
           FROM outbox WHERE status = 'failed' ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn purge_expired(
    pool: &SqlitePool,
    older_than: Duration,
    outbox_older_than: Duration,
    batch: i64,
) -> Result<u64, StoreError> {
    let now = now_ms();
    let processed = sqlx::query(
        "DELETE FROM processed_events_legacy WHERE (source, event_id) IN (
             SELECT source, event_id FROM processed_events_legacy WHERE processed_at < $1 LIMIT $2)",
    )
    .bind(now - millis(older_than))
    .bind(batch)
    .execute(pool)
    .await?
    .rows_affected();
    let outbox = sqlx::query(
        "DELETE FROM outbox WHERE id IN (
             SELECT id FROM outbox WHERE status = 'dispatched' AND dispatched_at < $1 LIMIT $2)",
    )
    .bind(now - millis(outbox_older_than))
    .bind(batch)
    .execute(pool)
    .await?
    .rows_affected();
    // Ids grow with redriven_at: the oldest come first in the primary key.
    let redrives = sqlx::query(
        "DELETE FROM dead_letter_redrives WHERE id IN (
             SELECT id FROM dead_letter_redrives WHERE redriven_at < $1 ORDER BY id LIMIT $2)",
    )
    .bind(now - millis(older_than))
    .bind(batch)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(processed + outbox + redrives)
}

pub(super) async fn dead_letters(
    pool: &SqlitePool,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    Ok(sqlx::query_as::<_, DeadLetter>(
        "SELECT id, source, event_id, event_type, queue, payload, error, attempts
           FROM dead_letters ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn dead_letters_selected(
    pool: &SqlitePool,
    ids: &[i64],
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    // The id list travels as one JSON array parameter; an empty list selects everything.
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    Ok(sqlx::query_as::<_, DeadLetter>(
        "SELECT id, source, event_id, event_type, queue, payload, error, attempts
           FROM dead_letters
          WHERE ($1 OR id IN (SELECT value FROM json_each($2))) AND id > $3
          ORDER BY id LIMIT $4",
    )
    .bind(ids.is_empty())
    .bind(&list)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
