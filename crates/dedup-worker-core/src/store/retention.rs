//! Retention's purge of expired rows (legacy dedup ids, dispatched outbox rows, redrive
//! records, the stale guard's records, kept bodies on SQLite, the action log): [`Retention`], reached as `store.retention()`, its PostgreSQL and its SQLite form
//! side by side. The dedup generations' maintenance is the ring's own (`store.dedup()`).

use std::time::Duration;

use super::postgres::{begin, secs, RETENTION_LOCK};
use super::{millis, now_ms, Pool, StoreError};

/// What retention deletes once it is old enough, across the tables that only grow otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Retention<'a> {
    pub(super) pool: &'a Pool,
}

impl Retention<'_> {
    /// Deletes at most `batch` ids of the legacy dedup table (see [`super::dedup`]) older than
    /// `older_than`, at most `batch` dispatched outbox rows older than `outbox_older_than`,
    /// at most `batch` records of redriven dead letters older than `older_than`, and at most
    /// `batch` of the stale guard's records older than `older_than` (they name ids the dedup
    /// record no longer knows past the window). On
    /// PostgreSQL only one worker at a time does this (an advisory lock); the others return 0
    /// at once.
    pub async fn purge_expired(
        self,
        older_than: Duration,
        outbox_older_than: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
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
                let stale = sqlx::query(
                    "DELETE FROM stale_events WHERE id IN (
                 SELECT id FROM stale_events
                  WHERE recorded_at < now() - make_interval(secs => $1)
                  ORDER BY recorded_at, id LIMIT $2)",
                )
                .bind(secs(older_than))
                .bind(batch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(processed + outbox + redrives + stale)
            }
            Pool::Sqlite(pool) => {
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
                let stale = sqlx::query(
                    "DELETE FROM stale_events WHERE id IN (
                 SELECT id FROM stale_events WHERE recorded_at < $1
                  ORDER BY recorded_at, id LIMIT $2)",
                )
                .bind(now - millis(older_than))
                .bind(batch)
                .execute(pool)
                .await?
                .rows_affected();
                Ok(processed + outbox + redrives + stale)
            }
        }
    }

    /// Deletes at most `batch` of the oldest kept bodies and at most `batch` of the oldest
    /// delivery attempts older than `older_than` (SQLite; on PostgreSQL a day's partition of
    /// each is dropped whole instead: `store.partitions()`, and this deletes nothing). Insert
    /// order is time order, so the oldest ids go first without a time index; each statement is
    /// its own short transaction, so a consumer's `BEGIN IMMEDIATE` waits at most for one batch.
    pub async fn purge_bodies(self, older_than: Duration, batch: i64) -> Result<u64, StoreError> {
        let Pool::Sqlite(pool) = self.pool else {
            return Ok(0);
        };
        let before = now_ms() - millis(older_than);
        let mut deleted = 0;
        for statement in [
            "DELETE FROM event_bodies WHERE id IN (
             SELECT id FROM event_bodies WHERE kept_at < $1 ORDER BY id LIMIT $2)",
            "DELETE FROM outbox_attempts WHERE id IN (
             SELECT id FROM outbox_attempts WHERE at < $1 ORDER BY id LIMIT $2)",
        ] {
            deleted += sqlx::query(statement)
                .bind(before)
                .bind(batch)
                .execute(pool)
                .await?
                .rows_affected();
        }
        Ok(deleted)
    }

    /// Deletes at most `batch` of the oldest recorded operator actions (`admin_actions`) older
    /// than `older_than` (`retention.history_days`). Ids grow with time: the oldest come first
    /// in the primary key.
    pub async fn purge_admin_actions(
        self,
        older_than: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "DELETE FROM admin_actions WHERE id IN (
                 SELECT id FROM admin_actions WHERE at < now() - make_interval(secs => $1)
                  ORDER BY id LIMIT $2)",
            )
            .bind(secs(older_than))
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(
                "DELETE FROM admin_actions WHERE id IN (
                 SELECT id FROM admin_actions WHERE at < $1 ORDER BY id LIMIT $2)",
            )
            .bind(now_ms() - millis(older_than))
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected(),
        })
    }
}
