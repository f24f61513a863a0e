//! The outbox's rows (`outbox`): [`Outbox`], reached as `store.outbox()`, and [`insert`], the
//! batch transaction's write ([`StoreTx::insert_outbox`] calls it). Each statement is here
//! once, its PostgreSQL and its SQLite form side by side in one `match`. (Retention's purge of
//! dispatched rows is in `retention.rs`, the operator's bulk retry and re-send in `bulk/`.)

mod attempts;
mod mark_sql;
mod marks;

pub use attempts::{AttemptKind, AttemptLane, AttemptMark, FailedMark};

use std::time::Duration;

use sqlx::{QueryBuilder, Row, Sqlite};

use super::ordering::FIRST_IN_ITS_KEY;
use super::postgres::secs;
use super::sqlite::{update_claimed, CHUNK};
use super::{
    millis, new_claim_token, now_ms, NewOutboxRow, OutboxCounts, OutboxRow, Pool, StoreError,
    StoreTx, OUTBOX_CHANNEL,
};

/// The outbox's rows (`outbox`): written by handlers in the batch transaction, then claimed,
/// marked dispatched or failed, extended and released by the relay, counted for readiness and
/// metrics.
#[derive(Debug, Clone, Copy)]
pub struct Outbox<'a> {
    pub(super) pool: &'a Pool,
}

/// Writes `rows` in the batch transaction. On PostgreSQL the same statement notifies the
/// relays (delivered on commit). On SQLite the rows are created at the transaction's start,
/// the time of the processed ids it records too, as PostgreSQL's now() is for both (`events
/// show` finds an event's outbox rows by that equality).
pub(super) async fn insert(tx: &mut StoreTx, rows: &[NewOutboxRow]) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    match tx {
        StoreTx::Postgres(tx) => {
            let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
            let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
            let dests: Vec<Option<&str>> = rows.iter().map(|r| r.destination.as_deref()).collect();
            let keys: Vec<&str> = rows.iter().map(|r| r.idempotency_key.as_str()).collect();
            let types: Vec<&str> = rows.iter().map(|r| r.event_type.as_str()).collect();
            let payloads: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
            let traces: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent.as_deref()).collect();
            let sinks: Vec<&str> = rows.iter().map(NewOutboxRow::lane).collect();
            let ordering: Vec<Option<&str>> =
                rows.iter().map(|r| r.ordering_key.as_deref()).collect();
            super::ordering::lock_ordering_keys(tx, rows).await?;
            sqlx::query(
                "WITH inserted AS (
                 INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload,
                                     traceparent, sink, ordering_key)
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[],
                                      $8::text[], $9::text[], $10::text[])
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
            .bind(&sinks)
            .bind(&ordering)
            .execute(&mut **tx)
            .await?;
        }
        StoreTx::Sqlite(tx, began) => {
            let now = *began;
            for chunk in rows.chunks(CHUNK / 2) {
                let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                    "INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload, \
                 next_attempt_at, created_at, traceparent, sink, ordering_key) ",
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
                        .push_bind(r.traceparent.as_deref())
                        .push_bind(r.lane())
                        .push_bind(r.ordering_key.as_deref());
                });
                qb.build().execute(&mut **tx).await?;
            }
        }
    }
    Ok(())
}

impl Outbox<'_> {
    /// Leases up to `max` due pending rows of lane `sink` for `lease` (FOR UPDATE SKIP LOCKED on
    /// PostgreSQL), under a fresh claim token, counting an attempt on each. On an `ordered`
    /// lane a row of a key is due only when no earlier row of its key is pending (leased,
    /// backing off, deferred) or failed and not skipped: a batch holds at most one row of a key,
    /// and no other relay claims the next one before this one is settled.
    pub async fn claim_lane(
        self,
        sink: &str,
        max: usize,
        lease: Duration,
        ordered: bool,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let claim_token = new_claim_token();
        let first_in_its_key = if ordered { FIRST_IN_ITS_KEY } else { "" };
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                let sql = format!(
                    "UPDATE outbox o
                SET next_attempt_at = now() + make_interval(secs => $2), attempts = o.attempts + 1,
                    claim_token = $3
               FROM (SELECT c.id FROM outbox c
                      WHERE c.sink = $4 AND c.status = 'pending' AND c.next_attempt_at <= now() {first_in_its_key}
                      ORDER BY c.next_attempt_at
                      LIMIT $1
                      FOR UPDATE OF c SKIP LOCKED) c
              WHERE o.id = c.id
          RETURNING o.id, o.source, o.event_id, o.destination, o.idempotency_key, o.event_type, o.payload,
                    o.attempts, o.traceparent, o.claim_token"
                );
                sqlx::query_as::<_, OutboxRow>(&sql)
                    .bind(max as i64)
                    .bind(secs(lease))
                    .bind(claim_token)
                    .bind(sink)
                    .fetch_all(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                let sql = format!(
                    "UPDATE outbox SET next_attempt_at = $1, attempts = attempts + 1, claim_token = $4
              WHERE id IN (SELECT c.id FROM outbox c
                            WHERE c.sink = $5 AND c.status = 'pending' AND c.next_attempt_at <= $2 {first_in_its_key}
                            ORDER BY c.next_attempt_at LIMIT $3)
          RETURNING id, source, event_id, destination, idempotency_key, event_type, payload, attempts,
                    traceparent, claim_token"
                );
                sqlx::query_as::<_, OutboxRow>(&sql)
                    .bind(now + millis(lease))
                    .bind(now)
                    .bind(max as i64)
                    .bind(claim_token)
                    .bind(sink)
                    .fetch_all(pool)
                    .await?
            }
        })
    }

    /// The lanes that have pending rows (due or not), by a loose scan of `outbox_lane_due`: one
    /// index probe per lane, however many rows wait.
    pub async fn pending_lanes(self) -> Result<Vec<String>, StoreError> {
        const SQL: &str = "WITH RECURSIVE lanes(sink) AS (
                SELECT min(sink) FROM outbox WHERE status = 'pending'
                UNION ALL
                SELECT (SELECT min(o.sink) FROM outbox o
                         WHERE o.status = 'pending' AND o.sink > lanes.sink)
                  FROM lanes WHERE lanes.sink IS NOT NULL)
            SELECT sink FROM lanes WHERE sink IS NOT NULL";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await?,
        })
    }

    /// Extends the lease of pending rows `ids` still under the claim `claim_token` to `lease`
    /// from now (the relay's heartbeat while it delivers them). Returns the ids extended: one
    /// missing was claimed by another relay since (its lease had run out), or is marked already.
    pub async fn extend_leases(
        self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        match self.pool {
            Pool::Postgres(pool) => Ok(sqlx::query_scalar(
                "UPDATE outbox SET next_attempt_at = now() + make_interval(secs => $3)
              WHERE id = ANY($1) AND claim_token = $2 AND status = 'pending'
          RETURNING id",
            )
            .bind(ids)
            .bind(claim_token)
            .bind(secs(lease))
            .fetch_all(pool)
            .await?),
            Pool::Sqlite(pool) => {
                let set = format!(
                    "UPDATE outbox SET next_attempt_at = {}",
                    now_ms() + millis(lease)
                );
                update_claimed(pool, &set, " AND status = 'pending'", claim_token, ids).await
            }
        }
    }

    /// Makes pending rows `ids` still under the claim `claim_token` due now: a relay that stops
    /// before delivering them gives them back, so the next relay need not wait out the lease.
    /// Returns the rows released (rows marked meanwhile, or claimed by another relay, are not).
    pub async fn release_leases(self, claim_token: i64, ids: &[i64]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        match self.pool {
            Pool::Postgres(pool) => Ok(sqlx::query(
                "UPDATE outbox SET next_attempt_at = now()
              WHERE id = ANY($1) AND claim_token = $2 AND status = 'pending'",
            )
            .bind(ids)
            .bind(claim_token)
            .execute(pool)
            .await?
            .rows_affected()),
            Pool::Sqlite(pool) => {
                let set = format!("UPDATE outbox SET next_attempt_at = {}", now_ms());
                let released =
                    update_claimed(pool, &set, " AND status = 'pending'", claim_token, ids).await?;
                Ok(released.len() as u64)
            }
        }
    }

    /// Rows by status.
    pub async fn counts(self) -> Result<OutboxCounts, StoreError> {
        let row = match self.pool {
            Pool::Postgres(pool) => {
                let row = sqlx::query(
                    "SELECT count(*) FILTER (WHERE status = 'pending'),
                    count(*) FILTER (WHERE status = 'dispatched'),
                    count(*) FILTER (WHERE status = 'failed')
               FROM outbox",
                )
                .fetch_one(pool)
                .await?;
                [row.try_get(0)?, row.try_get(1)?, row.try_get(2)?]
            }
            Pool::Sqlite(pool) => {
                let row = sqlx::query(
                    "SELECT coalesce(sum(status = 'pending'), 0),
                    coalesce(sum(status = 'dispatched'), 0),
                    coalesce(sum(status = 'failed'), 0)
               FROM outbox",
                )
                .fetch_one(pool)
                .await?;
                [row.try_get(0)?, row.try_get(1)?, row.try_get(2)?]
            }
        };
        let [pending, dispatched, failed] = row;
        Ok(OutboxCounts {
            pending,
            dispatched,
            failed,
        })
    }

    /// Rows that exhausted their delivery attempts.
    pub async fn failed(self, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
        const SQL: &str = "SELECT id, source, event_id, destination, idempotency_key, event_type,
                                  payload, attempts, traceparent,
                                  coalesce(claim_token, 0) AS claim_token
                             FROM outbox WHERE status = 'failed' ORDER BY id LIMIT $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }
}
