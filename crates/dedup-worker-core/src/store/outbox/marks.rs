//! The relay's marks on its claimed rows: delivered, failed, deferred; each delivery attempt
//! recorded in `outbox_attempts` by the mark's own statement (PostgreSQL) or transaction
//! (SQLite). On PostgreSQL a mark is one statement of CTEs, listed in order so more can join
//! (the per-minute counts): `input` (the arrays), `fresh` (the attempts to record, read from
//! the snapshot before the mark), `marked` (the outbox update), `kept` (the history insert),
//! `counted` (the minute's counts, last: its counter rows stay locked for the commit only).

use std::time::Duration;

use sqlx::{QueryBuilder, Row, Sqlite};

use super::attempts::{AttemptKind, AttemptLane, AttemptMark, FailedMark, COLUMNS};
use super::mark_sql::{
    counted, counts, pg_statement, sqlite_fresh, sqlite_record, unrecorded, PgColumns, UNRECORDED,
};
use super::Outbox;
use crate::store::activity::{add_sqlite, Counts, Series};
use crate::store::postgres::secs;
use crate::store::postgres::PG_TODAYS_PARTITION;
use crate::store::sqlite::{begin_immediate, CHUNK};
use crate::store::{millis, now_ms, OutboxClaim, Pool, StoreError};

impl Outbox<'_> {
    /// Puts rows claimed under `claim_token` back, due after `delay`, and gives back the attempt
    /// their claim counted: they were not sent (their lane is held by the receiver's
    /// `Retry-After`, its circuit opened, or it was paused), or the receiver asked for time.
    /// `reason` becomes their `last_error`. Returns the rows deferred (not those marked or
    /// claimed by another relay meanwhile).
    pub async fn defer(
        self,
        claim_token: i64,
        ids: &[i64],
        delay: Duration,
        reason: &str,
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        match self.pool {
            Pool::Postgres(pool) => Ok(sqlx::query(
                "UPDATE outbox SET next_attempt_at = now() + make_interval(secs => $3),
                        attempts = GREATEST(attempts - 1, 0), last_error = $4
              WHERE id = ANY($1) AND claim_token = $2 AND status = 'pending'",
            )
            .bind(ids)
            .bind(claim_token)
            .bind(secs(delay))
            .bind(reason)
            .execute(pool)
            .await?
            .rows_affected()),
            Pool::Sqlite(pool) => {
                let due = now_ms() + millis(delay);
                let mut deferred = 0;
                let mut tx = begin_immediate(pool).await?;
                for chunk in ids.chunks(CHUNK - 3) {
                    let mut qb: QueryBuilder<Sqlite> =
                        QueryBuilder::new("UPDATE outbox SET next_attempt_at = ");
                    qb.push_bind(due)
                        .push(", attempts = max(attempts - 1, 0), last_error = ")
                        .push_bind(reason)
                        .push(" WHERE status = 'pending' AND claim_token = ")
                        .push_bind(claim_token)
                        .push(" AND id IN (");
                    let mut list = qb.separated(", ");
                    for id in chunk {
                        list.push_bind(*id);
                    }
                    qb.push(")");
                    deferred += qb.build().execute(&mut *tx).await?.rows_affected();
                }
                tx.commit().await?;
                Ok(deferred)
            }
        }
    }

    /// Marks rows dispatched, each only if it still carries the token of `claims`, recording
    /// nothing. Returns how many are marked (see [`Outbox::mark_delivered`]).
    pub async fn mark_dispatched(self, claims: &[OutboxClaim]) -> Result<u64, StoreError> {
        let attempts: Vec<AttemptMark> = claims.iter().map(|c| unrecorded(*c)).collect();
        self.mark_delivered(&attempts, UNRECORDED).await
    }

    /// Marks the delivered rows of `attempts` dispatched, each only if it still carries its
    /// claim's token, and records each attempt (`delivered`) when `lane.record`. Returns how
    /// many are marked; the others were claimed by another relay since (see [`OutboxClaim`]),
    /// and are recorded all the same: this relay did deliver them. Marking again under the same
    /// claim counts the row again and changes nothing, so a mark retried after an outage that
    /// hid its commit is not mistaken for a lost lease; it records nothing again either (a row
    /// already dispatched under the same claim was recorded by the mark that committed).
    pub async fn mark_delivered(
        self,
        attempts: &[AttemptMark],
        lane: AttemptLane<'_>,
    ) -> Result<u64, StoreError> {
        if attempts.is_empty() {
            return Ok(0);
        }
        match self.pool {
            Pool::Postgres(pool) => {
                let c = PgColumns::of(attempts);
                let ctes = [
                    format!(
                        "input AS (SELECT * FROM UNNEST({}) AS c({}))",
                        PgColumns::TYPES,
                        PgColumns::NAMES
                    ),
                    // The snapshot before this statement: a row already dispatched under this
                    // claim was recorded by the mark whose answer an outage hid; a row another
                    // relay claimed since (lease lost) was still delivered by this one.
                    "fresh AS (SELECT c.* FROM input c JOIN outbox o ON o.id = c.id
                      WHERE NOT (o.status = 'dispatched'
                                 AND o.claim_token IS NOT DISTINCT FROM c.claim_token))"
                        .to_owned(),
                    "marked AS (UPDATE outbox o SET status = 'dispatched',
                            dispatched_at = coalesce(o.dispatched_at, now()), last_error = NULL
                       FROM input c WHERE o.id = c.id AND o.claim_token = c.claim_token
                        AND o.status IN ('pending', 'dispatched') RETURNING 1)"
                        .to_owned(),
                    format!(
                        "kept AS (INSERT INTO outbox_attempts ({COLUMNS})
                     SELECT f.event_key, f.id, f.attempt, 'delivered', $12, $13, f.started_at,
                            f.duration_ms, f.status, NULL, f.headers, f.body, f.truncated
                       FROM fresh f WHERE $14 AND {PG_TODAYS_PARTITION} RETURNING 1)"
                    ),
                    counted("SELECT 'delivered', count(*) FROM fresh", 15),
                ];
                let sql = pg_statement(&ctes);
                let row = c
                    .bind(sqlx::query(&sql))
                    .bind(lane.lane)
                    .bind(lane.destination)
                    .bind(lane.record)
                    .bind(lane.shard.number())
                    .fetch_one(pool)
                    .await?;
                Ok(counts(&row, &lane)?)
            }
            Pool::Sqlite(pool) => {
                let mut tx = begin_immediate(pool).await?;
                let (mut marked, mut delivered) = (0, 0);
                for chunk in attempts.chunks(CHUNK / 16) {
                    delivered += sqlite_fresh(&mut tx, chunk).await?;
                    if lane.record {
                        let kinds = vec![AttemptKind::Delivered; chunk.len()];
                        sqlite_record(&mut tx, chunk, &kinds, &lane, true).await?;
                    }
                    // 'dispatched' too: marking again under the same claim is a no-op that
                    // still counts.
                    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                        "UPDATE outbox SET status = 'dispatched', last_error = NULL, \
                 dispatched_at = coalesce(dispatched_at, CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
                 WHERE status IN ('pending', 'dispatched') AND (id, claim_token) IN (",
                    );
                    qb.push_values(chunk, |mut b, a| {
                        b.push_bind(a.claim.id).push_bind(a.claim.claim_token);
                    });
                    qb.push(")");
                    marked += qb.build().execute(&mut *tx).await?.rows_affected();
                }
                let began = now_ms();
                let counts = Counts::of(Series::Delivered, delivered);
                add_sqlite(&mut tx, began, &counts, lane.shard).await?;
                tx.commit().await?;
                Ok(marked)
            }
        }
    }

    /// Records a failed delivery under `claim`, recording nothing: retried after `delay`, or
    /// marked failed once `attempts` reached `max_attempts`. Returns 1, or 0 if another relay
    /// claimed the row since or it is no longer pending (see [`Outbox::mark_failed`]).
    pub async fn mark_delivery_failed(
        self,
        claim: OutboxClaim,
        error: &str,
        delay: Duration,
        max_attempts: u32,
    ) -> Result<u64, StoreError> {
        let mut attempt = unrecorded(claim);
        attempt.error = Some(error.to_owned());
        let failed = FailedMark {
            attempt,
            delay,
            max_attempts,
        };
        self.mark_failed(&[failed], UNRECORDED).await
    }

    /// Marks a batch's failed deliveries in one statement: each row still under its claim is
    /// retried after its `delay`, or marked `failed` once its `attempts` reached its
    /// `max_attempts`; each attempt is recorded (`failed`, or `gave_up` for the rows this mark
    /// fails for good) when `lane.record`, a lease-lost row's too. Returns the rows marked; the
    /// others were claimed by another relay since (its own delivery decides them) or are no
    /// longer pending. A failure mark is not retried after an outage (the row comes back at
    /// lease end), so such an attempt is not recorded.
    pub async fn mark_failed(
        self,
        failures: &[FailedMark],
        lane: AttemptLane<'_>,
    ) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let attempts: Vec<AttemptMark> = failures.iter().map(|f| f.attempt.clone()).collect();
        match self.pool {
            Pool::Postgres(pool) => {
                let c = PgColumns::of(&attempts);
                let delays: Vec<f64> = failures.iter().map(|f| secs(f.delay)).collect();
                let limits: Vec<i32> = failures
                    .iter()
                    .map(|f| i32::try_from(f.max_attempts).unwrap_or(i32::MAX))
                    .collect();
                let ctes = [
                    format!("input AS (SELECT * FROM UNNEST({}, $15::float8[], $16::int4[])
                                AS c({}, delay_secs, max_attempts))", PgColumns::TYPES, PgColumns::NAMES),
                    "fresh AS (SELECT c.*, CASE WHEN o.status = 'pending' AND o.claim_token = c.claim_token
                                              AND o.attempts >= c.max_attempts
                                             THEN 'gave_up' ELSE 'failed' END AS kind
                                 FROM input c JOIN outbox o ON o.id = c.id)".to_owned(),
                    "marked AS (UPDATE outbox o SET last_error = c.error,
                            next_attempt_at = now() + make_interval(secs => c.delay_secs),
                            status = CASE WHEN o.attempts >= c.max_attempts THEN 'failed' ELSE 'pending' END
                       FROM input c WHERE o.id = c.id AND o.claim_token = c.claim_token
                        AND o.status = 'pending' RETURNING 1)".to_owned(),
                    format!("kept AS (INSERT INTO outbox_attempts ({COLUMNS})
                     SELECT f.event_key, f.id, f.attempt, f.kind, $12, $13, f.started_at,
                            f.duration_ms, f.status, f.error, f.headers, f.body, f.truncated
                       FROM fresh f WHERE $14 AND {PG_TODAYS_PARTITION} RETURNING 1)"),
                    counted("SELECT CASE WHEN kind = 'gave_up' THEN 'gave_up' ELSE 'delivery_failed' END, 1
                               FROM fresh", 17),
                ];
                let sql = pg_statement(&ctes);
                let row = c
                    .bind(sqlx::query(&sql))
                    .bind(lane.lane)
                    .bind(lane.destination)
                    .bind(lane.record)
                    .bind(&delays)
                    .bind(&limits)
                    .bind(lane.shard.number())
                    .fetch_one(pool)
                    .await?;
                Ok(counts(&row, &lane)?)
            }
            Pool::Sqlite(pool) => {
                let mut tx = begin_immediate(pool).await?;
                let now = now_ms();
                let mut marked = 0;
                let mut counts = Counts::default();
                for failure in failures {
                    let a = &failure.attempt;
                    let limit = i64::from(failure.max_attempts);
                    let gave_up: bool = sqlx::query_scalar(
                        "SELECT coalesce((SELECT status = 'pending' AND claim_token = $2
                                                 AND attempts >= $3 FROM outbox WHERE id = $1), 0)",
                    )
                    .bind(a.claim.id)
                    .bind(a.claim.claim_token)
                    .bind(limit)
                    .fetch_one(&mut *tx)
                    .await?;
                    let (kind, series) = if gave_up {
                        (AttemptKind::GaveUp, Series::GaveUp)
                    } else {
                        (AttemptKind::Failed, Series::DeliveryFailed)
                    };
                    counts.add(series, 1);
                    if lane.record {
                        sqlite_record(&mut tx, std::slice::from_ref(a), &[kind], &lane, false)
                            .await?;
                    }
                    marked += sqlx::query(
                        "UPDATE outbox
                            SET last_error = $1, next_attempt_at = $2,
                                status = CASE WHEN attempts >= $3 THEN 'failed' ELSE 'pending' END
                          WHERE id = $4 AND claim_token = $5 AND status = 'pending'",
                    )
                    .bind(a.error.as_deref())
                    .bind(now + millis(failure.delay))
                    .bind(limit)
                    .bind(a.claim.id)
                    .bind(a.claim.claim_token)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                }
                add_sqlite(&mut tx, now, &counts, lane.shard).await?;
                tx.commit().await?;
                Ok(marked)
            }
        }
    }

    /// Records attempts whose rows were deferred with their attempt given back (`throttled`:
    /// the receiver answered `Retry-After`; `probe_failed`: a probe of an open circuit failed).
    /// Rare, so a statement of its own after the deferral. Returns the attempts recorded.
    pub async fn record_attempts(
        self,
        attempts: &[AttemptMark],
        kind: AttemptKind,
        lane: AttemptLane<'_>,
    ) -> Result<u64, StoreError> {
        if attempts.is_empty() {
            return Ok(0);
        }
        // A throttled answer is counted as such; a failed probe as a failed attempt.
        let series = match kind {
            AttemptKind::Throttled => Series::Throttled,
            _ => Series::DeliveryFailed,
        };
        match self.pool {
            Pool::Postgres(pool) => {
                let c = PgColumns::of(attempts);
                let ctes = [
                    format!(
                        "input AS (SELECT * FROM UNNEST({}) AS c({}))",
                        PgColumns::TYPES,
                        PgColumns::NAMES
                    ),
                    "fresh AS (SELECT * FROM input)".to_owned(),
                    "marked AS (SELECT 1 WHERE false)".to_owned(),
                    format!(
                        "kept AS (INSERT INTO outbox_attempts ({COLUMNS})
                     SELECT f.event_key, f.id, f.attempt, $15, $12, $13, f.started_at,
                            f.duration_ms, f.status, f.error, f.headers, f.body, f.truncated
                       FROM fresh f WHERE $14 AND {PG_TODAYS_PARTITION} RETURNING 1)"
                    ),
                    counted("SELECT $16::text, count(*) FROM fresh", 17),
                ];
                let sql = pg_statement(&ctes);
                let row = c
                    .bind(sqlx::query(&sql))
                    .bind(lane.lane)
                    .bind(lane.destination)
                    .bind(lane.record)
                    .bind(kind.as_str())
                    .bind(series.name())
                    .bind(lane.shard.number())
                    .fetch_one(pool)
                    .await?;
                counts(&row, &lane)?;
                Ok(row.try_get::<i64, _>(1)? as u64)
            }
            Pool::Sqlite(pool) => {
                let mut tx = begin_immediate(pool).await?;
                let mut recorded = 0;
                if lane.record {
                    for chunk in attempts.chunks(CHUNK / 16) {
                        let kinds = vec![kind; chunk.len()];
                        recorded += sqlite_record(&mut tx, chunk, &kinds, &lane, false).await?;
                    }
                }
                let counts = Counts::of(series, attempts.len());
                add_sqlite(&mut tx, now_ms(), &counts, lane.shard).await?;
                tx.commit().await?;
                Ok(recorded)
            }
        }
    }
}
