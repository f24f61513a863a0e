//! The pieces the relay's marks (`marks.rs`) share: an attempt's columns as PostgreSQL arrays,
//! the statement around their CTEs, the per-minute counts they add, and SQLite's recording
//! insert.

use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Row, Sqlite};
use uuid::Uuid;

use super::attempts::{
    report_not_kept, AttemptKind, AttemptLane, AttemptMark, COLUMNS, ERROR_CHARS,
};
use crate::store::activity::count_cte_from;
use crate::store::{now_ms, OutboxClaim, Shard, StoreError};

/// A lane that records nothing: the marks that take bare claims.
pub(super) const UNRECORDED: AttemptLane<'static> = AttemptLane {
    lane: "",
    destination: None,
    record: false,
    shard: Shard::ZERO,
};

/// An attempt of `claim` with nothing known of it (a mark that records nothing).
pub(super) fn unrecorded(claim: OutboxClaim) -> AttemptMark {
    AttemptMark {
        claim,
        event_key: [0; 16],
        attempt: 0,
        started_at: DateTime::<Utc>::UNIX_EPOCH,
        duration_ms: 0,
        status: None,
        error: None,
        headers: None,
        body: None,
        truncated: false,
    }
}

/// One PostgreSQL statement of `ctes` (each `name AS (…)`, at least `marked`, `kept` and
/// `fresh`), answering the rows marked, the attempts kept and those that were to be.
pub(super) fn pg_statement(ctes: &[String]) -> String {
    format!(
        "WITH {}\nSELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM kept), \
         (SELECT count(*) FROM fresh)",
        ctes.join(",\n")
    )
}

/// The rows marked, after reporting attempts that found no partition.
pub(super) fn counts(
    row: &sqlx::postgres::PgRow,
    lane: &AttemptLane<'_>,
) -> Result<u64, StoreError> {
    let marked: i64 = row.try_get(0)?;
    report_not_kept(lane, row.try_get(2)?, row.try_get(1)?);
    Ok(u64::try_from(marked).unwrap_or(0))
}

/// An attempt's columns as PostgreSQL arrays, bound as `$1` … `$11`.
pub(super) struct PgColumns<'a> {
    ids: Vec<i64>,
    tokens: Vec<i64>,
    keys: Vec<Uuid>,
    attempts: Vec<i32>,
    started: Vec<DateTime<Utc>>,
    durations: Vec<i32>,
    statuses: Vec<Option<i16>>,
    errors: Vec<Option<String>>,
    headers: Vec<Option<&'a str>>,
    bodies: Vec<Option<&'a [u8]>>,
    truncated: Vec<bool>,
}

impl<'a> PgColumns<'a> {
    /// The arrays' types, `$1` … `$11`.
    pub(super) const TYPES: &'static str = "$1::int8[], $2::int8[], $3::uuid[], $4::int4[], \
         $5::timestamptz[], $6::int4[], $7::int2[], $8::text[], $9::text[], $10::bytea[], $11::bool[]";
    /// Their names in `input`.
    pub(super) const NAMES: &'static str =
        "id, claim_token, event_key, attempt, started_at, duration_ms, \
         status, error, headers, body, truncated";

    pub(super) fn of(attempts: &'a [AttemptMark]) -> Self {
        PgColumns {
            ids: attempts.iter().map(|a| a.claim.id).collect(),
            tokens: attempts.iter().map(|a| a.claim.claim_token).collect(),
            keys: attempts
                .iter()
                .map(|a| Uuid::from_bytes(a.event_key))
                .collect(),
            attempts: attempts.iter().map(|a| a.attempt).collect(),
            started: attempts.iter().map(|a| a.started_at).collect(),
            durations: attempts.iter().map(|a| a.duration_ms).collect(),
            statuses: attempts.iter().map(|a| a.status).collect(),
            errors: attempts
                .iter()
                .map(|a| a.error.as_deref().map(bounded_error))
                .collect(),
            headers: attempts.iter().map(|a| a.headers.as_deref()).collect(),
            bodies: attempts.iter().map(|a| a.body.as_deref()).collect(),
            truncated: attempts.iter().map(|a| a.truncated).collect(),
        }
    }

    pub(super) fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.tokens)
            .bind(&self.keys)
            .bind(&self.attempts)
            .bind(&self.started)
            .bind(&self.durations)
            .bind(&self.statuses)
            .bind(&self.errors)
            .bind(&self.headers)
            .bind(&self.bodies)
            .bind(&self.truncated)
    }
}

/// A sink's error as kept: printable, at most `ERROR_CHARS` characters.
pub(super) fn bounded_error(error: &str) -> String {
    crate::event::printable(error, ERROR_CHARS).into_owned()
}

/// SQLite: records `attempts` (kinds side by side) in the mark's transaction, before the mark
/// itself. With `skip_marked`, an attempt whose row is already dispatched under the same claim
/// is skipped: the mark that committed (its answer hidden by an outage) recorded it.
pub(super) async fn sqlite_record(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    attempts: &[AttemptMark],
    kinds: &[AttemptKind],
    lane: &AttemptLane<'_>,
    skip_marked: bool,
) -> Result<u64, StoreError> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
        "WITH c(id, claim_token, event_key, attempt, kind, started_at, duration_ms, status, error, \
         headers, body, truncated) AS (",
    );
    qb.push_values(attempts.iter().zip(kinds), |mut b, (a, kind)| {
        b.push_bind(a.claim.id)
            .push_bind(a.claim.claim_token)
            .push_bind(a.event_key.as_slice())
            .push_bind(a.attempt)
            .push_bind(kind.as_str())
            .push_bind(a.started_at.timestamp_millis())
            .push_bind(a.duration_ms)
            .push_bind(a.status)
            .push_bind(a.error.as_deref().map(bounded_error))
            .push_bind(a.headers.as_deref())
            .push_bind(a.body.as_deref())
            .push_bind(a.truncated);
    });
    qb.push(format!(
        ") INSERT INTO outbox_attempts (at, {COLUMNS}) SELECT "
    ))
    .push_bind(now_ms())
    .push(", c.event_key, c.id, c.attempt, c.kind, ")
    .push_bind(lane.lane)
    .push(", ")
    .push_bind(lane.destination)
    .push(
        ", c.started_at, c.duration_ms, c.status, c.error, c.headers, c.body, c.truncated \
             FROM c JOIN outbox o ON o.id = c.id",
    );
    if skip_marked {
        qb.push(" WHERE NOT (o.status = 'dispatched' AND o.claim_token IS c.claim_token)");
    }
    Ok(qb.build().execute(&mut **tx).await?.rows_affected())
}

/// The per-minute counts a mark adds (`activity_minutes`, under the lane's shard bound at
/// `$shard_param`) as a CTE named `counted`: `series_of_fresh` is a query over `fresh` giving
/// `(series, n)` rows, so a mark retried after an outage counts nothing again, as it records
/// nothing again.
pub(super) fn counted(series_of_fresh: &str, shard_param: usize) -> String {
    count_cte_from("counted", series_of_fresh, shard_param)
}

/// SQLite: how many of `attempts` are not yet dispatched under their own claim (what a
/// delivered mark counts: a mark retried after an outage that hid its commit counts nothing
/// again).
pub(super) async fn sqlite_fresh(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    attempts: &[AttemptMark],
) -> Result<usize, StoreError> {
    let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT count(*) FROM outbox WHERE status = 'dispatched' AND (id, claim_token) IN (",
    );
    qb.push_values(attempts, |mut b, a| {
        b.push_bind(a.claim.id).push_bind(a.claim.claim_token);
    });
    qb.push(")");
    let already: i64 = qb.build().fetch_one(&mut **tx).await?.try_get(0)?;
    Ok(attempts
        .len()
        .saturating_sub(usize::try_from(already).unwrap_or(0)))
}
