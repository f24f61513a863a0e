//! PostgreSQL statements. Multi-row writes go through `UNNEST` so a batch is one statement;
//! claims use `FOR UPDATE SKIP LOCKED` so any number of workers and relays can run at once.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool, Row};

use super::{
    DeadLetter, NewDeadLetter, NewOutboxRow, NewQueueMessage, OutboxClaim, OutboxCounts, OutboxRow,
    QueuedMessage, StoreError, Wakeups, OUTBOX_CHANNEL, QUEUE_CHANNEL,
};

/// The isolation every transaction of the pipeline runs at on PostgreSQL, whatever the server's,
/// the database's or the role's default (`default_transaction_isolation`, which shops set to
/// `repeatable read` or `serializable` cluster-wide). The dedup ring needs it: a batch reads
/// which generation is current in a statement after the one that waited for the shared ring
/// lock, and only at READ COMMITTED does that statement see a seal that committed during the
/// wait. At REPEATABLE READ the snapshot is taken by the waiting statement, so a batch that
/// waited during a seal records its ids in the sealed generation while a retry after the seal
/// records them in the new one, neither seeing the other's uncommitted row: handled twice.
/// Queue and outbox claims (single statements) rely on it too: at READ COMMITTED a row another
/// claim updated meanwhile is re-checked, not a serialization failure.
///
/// Set twice, at the mechanism rather than per call site: as a startup parameter of every
/// connection of the store's pools ([`READ_COMMITTED_OPTION`], no round trip, and it outranks
/// database and role defaults), and in the `BEGIN` of each transaction the store opens
/// ([`begin`]), should a session's default be changed after it connected.
pub(super) const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The startup parameter of [`BEGIN_READ_COMMITTED`]: `-c default_transaction_isolation=…` (the
/// space escaped, as the `options` string splits on unescaped spaces). Appended after any
/// `options` of the database URL, so it wins over them as well.
pub(super) const READ_COMMITTED_OPTION: (&str, &str) =
    ("default_transaction_isolation", r"read\ committed");

/// Begins a transaction of the pipeline, at READ COMMITTED (see [`BEGIN_READ_COMMITTED`]).
pub(super) async fn begin(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    pool.begin_with(BEGIN_READ_COMMITTED).await
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub(super) async fn enqueue(
    pool: &PgPool,
    queue: &str,
    messages: &[NewQueueMessage],
) -> Result<(), StoreError> {
    let sources: Vec<Option<&str>> = messages.iter().map(|m| m.source.as_deref()).collect();
    let ids: Vec<Option<&str>> = messages.iter().map(|m| m.message_id.as_deref()).collect();
    let types: Vec<Option<&str>> = messages.iter().map(|m| m.message_type.as_deref()).collect();
    let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
    let traces: Vec<Option<&str>> = messages.iter().map(|m| m.traceparent.as_deref()).collect();
    let signatures: Vec<Option<&str>> = messages
        .iter()
        .map(|m| m.stripe_signature.as_deref())
        .collect();
    // One statement, one commit: the insert and the notification (delivered on commit).
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO queue_messages (queue, message_id, message_type, payload, source,
                                         traceparent, stripe_signature)
             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::bytea[], $6::text[], $7::text[],
                                      $8::text[])
             RETURNING 1
         )
         SELECT pg_notify($5, $1), (SELECT count(*) FROM inserted)",
    )
    .bind(queue)
    .bind(&ids)
    .bind(&types)
    .bind(&payloads)
    .bind(QUEUE_CHANNEL)
    .bind(&sources)
    .bind(&traces)
    .bind(&signatures)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn claim_messages(
    pool: &PgPool,
    queue: &str,
    max: usize,
    lease: Duration,
    claim_token: i64,
) -> Result<Vec<QueuedMessage>, StoreError> {
    let rows = sqlx::query_as::<_, QueuedMessage>(
        "UPDATE queue_messages q
            SET visible_at = now() + make_interval(secs => $3), attempts = q.attempts + 1,
                claim_token = $4
           FROM (SELECT id FROM queue_messages
                  WHERE queue = $1 AND visible_at <= now()
                  ORDER BY visible_at, id
                  LIMIT $2
                  FOR UPDATE SKIP LOCKED) c
          WHERE q.id = c.id
      RETURNING q.id, q.source, q.message_id, q.message_type, q.payload, q.attempts,
                floor(extract(epoch FROM q.enqueued_at) * 1000)::int8 AS enqueued_at,
                q.traceparent, q.stripe_signature, q.claim_token",
    )
    .bind(queue)
    .bind(max as i64)
    .bind(secs(lease))
    .bind(claim_token)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

pub(super) async fn ack_messages(pool: &PgPool, ids: &[i64]) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM queue_messages WHERE id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

pub(super) async fn release_message(
    pool: &PgPool,
    id: i64,
    claim_token: i64,
    delay: Duration,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $2)
          WHERE id = $1 AND claim_token = $3",
    )
    .bind(id)
    .bind(secs(delay))
    .bind(claim_token)
    .execute(pool)
    .await?
    .rows_affected())
}

pub(super) async fn extend_message_leases(
    pool: &PgPool,
    claim_token: i64,
    ids: &[i64],
    lease: Duration,
) -> Result<Vec<i64>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $3)
          WHERE id = ANY($1) AND claim_token = $2
      RETURNING id",
    )
    .bind(ids)
    .bind(claim_token)
    .bind(secs(lease))
    .fetch_all(pool)
    .await?)
}

pub(super) async fn queue_depth(pool: &PgPool, queue: &str) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM queue_messages WHERE queue = $1")
            .bind(queue)
            .fetch_one(pool)
            .await?,
    )
}

pub(super) async fn insert_outbox(
    tx: &mut PgConnection,
    rows: &[NewOutboxRow],
) -> Result<(), StoreError> {
    let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
    let dests: Vec<Option<&str>> = rows.iter().map(|r| r.destination.as_deref()).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.idempotency_key.as_str()).collect();
    let types: Vec<&str> = rows.iter().map(|r| r.event_type.as_str()).collect();
    let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
    let traces: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent.as_deref()).collect();
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload,
                                 traceparent)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[],
                                  $8::text[])
             RETURNING 1
         )
         SELECT pg_notify($7, ''), (SELECT count(*) FROM inserted)",
    )
    .bind(&sources)
    .bind(&ids)
    .bind(&dests)
    .bind(&keys)
    .bind(&types)
    .bind(&payloads)
    .bind(OUTBOX_CHANNEL)
    .bind(&traces)
    .execute(tx)
    .await?;
    Ok(())
}

/// Arbitrary constant naming the advisory locks (the two-`int4` key space, apart from the
/// `bigint` locks above and in `dedup`) that make a once-only dead letter once.
const DEAD_LETTER_LOCK_CLASS: i32 = 0x6465_6164;

pub(super) async fn insert_dead_letter(
    tx: &mut PgConnection,
    row: &NewDeadLetter,
    once: bool,
) -> Result<u64, StoreError> {
    if once && !row.event_id.is_empty() {
        // The check below reads committed rows only: two batches moving one event at once (SQS
        // handed its message to two receivers) would each find none and each insert. Locked
        // per event until commit, the second one's check sees the first's row. A hash collision
        // only makes two events wait for each other.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2 || ' ' || $3 || ' ' || $4))")
            .bind(DEAD_LETTER_LOCK_CLASS)
            .bind(&row.source)
            .bind(&row.queue)
            .bind(&row.event_id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(sqlx::query(
        "INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts)
         SELECT $1, $2, $3, $4, $5, $6, $7
          WHERE NOT ($8 AND $2 <> '' AND EXISTS (
                SELECT 1 FROM dead_letters WHERE source = $1 AND event_id = $2 AND queue = $4))",
    )
    .bind(&row.source)
    .bind(&row.event_id)
    .bind(&row.event_type)
    .bind(&row.queue)
    .bind(&row.payload)
    .bind(&row.error)
    .bind(row.attempts)
    .bind(once)
    .execute(tx)
    .await?
    .rows_affected())
}

pub(super) async fn claim_outbox(
    pool: &PgPool,
    max: usize,
    lease: Duration,
    claim_token: i64,
) -> Result<Vec<OutboxRow>, StoreError> {
    let rows = sqlx::query_as::<_, OutboxRow>(
        "UPDATE outbox o
            SET next_attempt_at = now() + make_interval(secs => $2), attempts = o.attempts + 1,
                claim_token = $3
           FROM (SELECT id FROM outbox
                  WHERE status = 'pending' AND next_attempt_at <= now()
                  ORDER BY next_attempt_at
                  LIMIT $1
                  FOR UPDATE SKIP LOCKED) c
          WHERE o.id = c.id
      RETURNING o.id, o.source, o.event_id, o.destination, o.idempotency_key, o.event_type, o.payload,
                o.attempts, o.traceparent, o.claim_token",
    )
    .bind(max as i64)
    .bind(secs(lease))
    .bind(claim_token)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

pub(super) async fn mark_dispatched(
    pool: &PgPool,
    claims: &[OutboxClaim],
) -> Result<u64, StoreError> {
    let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
    let tokens: Vec<i64> = claims.iter().map(|c| c.claim_token).collect();
    // 'dispatched' too: marking again under the same claim is a no-op that still counts.
    Ok(sqlx::query(
        "UPDATE outbox o
            SET status = 'dispatched', dispatched_at = coalesce(o.dispatched_at, now()),
                last_error = NULL
           FROM UNNEST($1::bigint[], $2::bigint[]) AS c(id, claim_token)
          WHERE o.id = c.id AND o.claim_token = c.claim_token
            AND o.status IN ('pending', 'dispatched')",
    )
    .bind(&ids)
    .bind(&tokens)
    .execute(pool)
    .await?
    .rows_affected())
}

pub(super) async fn extend_outbox_leases(
    pool: &PgPool,
    claim_token: i64,
    ids: &[i64],
    lease: Duration,
) -> Result<Vec<i64>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE outbox SET next_attempt_at = now() + make_interval(secs => $3)
          WHERE id = ANY($1) AND claim_token = $2 AND status = 'pending'
      RETURNING id",
    )
    .bind(ids)
    .bind(claim_token)
    .bind(secs(lease))
    .fetch_all(pool)
    .await?)
}

pub(super) async fn release_outbox_leases(
    pool: &PgPool,
    claim_token: i64,
    ids: &[i64],
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE outbox SET next_attempt_at = now()
          WHERE id = ANY($1) AND claim_token = $2 AND status = 'pending'",
    )
    .bind(ids)
    .bind(claim_token)
    .execute(pool)
    .await?
    .rows_affected())
}

pub(super) async fn mark_delivery_failed(
    pool: &PgPool,
    claim: OutboxClaim,
    error: &str,
    delay: Duration,
    max_attempts: u32,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE outbox
            SET last_error = $2,
                next_attempt_at = now() + make_interval(secs => $3),
                status = CASE WHEN attempts >= $4 THEN 'failed' ELSE 'pending' END
          WHERE id = $1 AND claim_token = $5 AND status = 'pending'",
    )
    .bind(claim.id)
    .bind(error)
    .bind(secs(delay))
    .bind(max_attempts as i32)
    .bind(claim.claim_token)
    .execute(pool)
    .await?
    .rows_affected())
}

pub(super) async fn outbox_counts(pool: &PgPool) -> Result<OutboxCounts, StoreError> {
    let row = sqlx::query(
        "SELECT count(*) FILTER (WHERE status = 'pending'),
                count(*) FILTER (WHERE status = 'dispatched'),
                count(*) FILTER (WHERE status = 'failed')
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

pub(super) async fn failed_outbox(pool: &PgPool, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
    Ok(sqlx::query_as::<_, OutboxRow>(
        "SELECT id, source, event_id, destination, idempotency_key, event_type, payload,
                attempts, traceparent, coalesce(claim_token, 0) AS claim_token
           FROM outbox WHERE status = 'failed' ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Arbitrary constant naming the retention job's advisory lock.
pub(super) const RETENTION_LOCK: i64 = 0x6465_6475_7072_6574;

pub(super) async fn purge_expired(
    pool: &PgPool,
    older_than: Duration,
    outbox_older_than: Duration,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut tx = begin(pool).await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(RETENTION_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(0);
    }
    let processed = sqlx::query(
        "DELETE FROM processed_events_legacy WHERE ctid IN (
             SELECT ctid FROM processed_events_legacy
              WHERE processed_at < now() - make_interval(secs => $1) LIMIT $2)",
    )
    .bind(secs(older_than))
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let outbox = sqlx::query(
        "DELETE FROM outbox WHERE id IN (
             SELECT id FROM outbox
              WHERE status = 'dispatched' AND dispatched_at < now() - make_interval(secs => $1)
              LIMIT $2)",
    )
    .bind(secs(outbox_older_than))
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    // Ids grow with redriven_at: the oldest come first in the primary key.
    let redrives = sqlx::query(
        "DELETE FROM dead_letter_redrives WHERE id IN (
             SELECT id FROM dead_letter_redrives
              WHERE redriven_at < now() - make_interval(secs => $1) ORDER BY id LIMIT $2)",
    )
    .bind(secs(older_than))
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(processed + outbox + redrives)
}

pub(super) async fn dead_letters(pool: &PgPool, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
    Ok(sqlx::query_as::<_, DeadLetter>(
        "SELECT id, source, event_id, event_type, queue, payload, error, attempts
           FROM dead_letters ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn dead_letters_selected(
    pool: &PgPool,
    ids: &[i64],
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    Ok(sqlx::query_as::<_, DeadLetter>(
        "SELECT id, source, event_id, event_type, queue, payload, error, attempts
           FROM dead_letters WHERE ($1 OR id = ANY($2)) AND id > $3 ORDER BY id LIMIT $4",
    )
    .bind(ids.is_empty())
    .bind(ids)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Turns notifications into in-process wake-ups. Reconnects (PgListener does) after errors;
/// while it is down the pollers' fallback keeps things moving.
pub(super) async fn listen(pool: PgPool, wakeups: Arc<Wakeups>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(error) => {
                if pool.is_closed() {
                    return;
                }
                tracing::warn!(%error, "LISTEN connection failed; relying on polling");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([QUEUE_CHANNEL, OUTBOX_CHANNEL]).await {
            tracing::warn!(%error, "LISTEN failed; relying on polling");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.recv().await {
                Ok(n) if n.channel() == QUEUE_CHANNEL => wakeups.queue.notify_waiters(),
                Ok(_) => wakeups.outbox.notify_waiters(),
                Err(error) => {
                    if pool.is_closed() {
                        return;
                    }
                    tracing::debug!(%error, "notification listener error; reconnecting");
                    // Something may have been missed while reconnecting.
                    wakeups.queue.notify_waiters();
                    wakeups.outbox.notify_waiters();
                    break;
                }
            }
        }
    }
}
