//! Retention's statements: the purge of expired rows (legacy dedup ids, dispatched outbox rows,
//! redrive records) and the dedup generations' maintenance (in [`super::dedup`]), and the
//! backfill's question of which ids are processed. The purge is here once per store: the method,
//! then its PostgreSQL and its SQLite form below.

use std::time::Duration;

use super::dedup::{self, RingMaintenance, Seal};
use super::{Pool, Store, StoreError};

impl Store {
    /// Deletes at most `batch` ids of the legacy dedup table (see [`dedup`]) older than
    /// `older_than`, at most `batch` dispatched outbox rows older than `outbox_older_than`,
    /// and at most `batch` records of redriven dead letters older than `older_than`. On
    /// PostgreSQL only one worker at a time does this (an advisory lock); the others return 0
    /// at once.
    pub async fn purge_expired(
        &self,
        older_than: Duration,
        outbox_older_than: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        on_pool!(self, purge_expired(older_than, outbox_older_than, batch))
    }

    /// One maintenance pass of the dedup generations (see [`dedup`]): empties those sealed
    /// longer ago than `window`, and seals the current one once it is a third of the window
    /// old. On PostgreSQL one process at a time (the others return at once, doing nothing).
    pub async fn maintain_dedup_generations(
        &self,
        window: Duration,
    ) -> Result<RingMaintenance, StoreError> {
        self.maintain_generations(window, Seal::WhenDue).await
    }

    /// Seals the current dedup generation now and starts the next one, if the next slot is free
    /// (an operator's or a test's rotation; retention does it when due). Expired generations
    /// are emptied first, as in [`Store::maintain_dedup_generations`].
    pub async fn seal_dedup_generation(
        &self,
        window: Duration,
    ) -> Result<RingMaintenance, StoreError> {
        self.maintain_generations(window, Seal::Now).await
    }

    async fn maintain_generations(
        &self,
        window: Duration,
        seal: Seal,
    ) -> Result<RingMaintenance, StoreError> {
        match &self.0 {
            Pool::Postgres(pool) => dedup::maintain_generations_pg(pool, window, seal).await,
            Pool::Sqlite(pool) => dedup::maintain_generations_sqlite(pool, window, seal).await,
        }
    }

    /// Which of `ids` (events of `source`) are recorded as processed (handled, or dead-lettered
    /// as handled): a backfill enqueues only the others.
    pub async fn processed_among(
        &self,
        source: &str,
        ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        match &self.0 {
            Pool::Postgres(pool) => dedup::processed_among_pg(pool, source, ids).await,
            Pool::Sqlite(pool) => dedup::processed_among_sqlite(pool, source, ids).await,
        }
    }
}

/// The PostgreSQL forms.
pub(super) mod postgres {
    use std::time::Duration;

    use sqlx::PgPool;

    use crate::store::postgres::{begin, secs, RETENTION_LOCK};
    use crate::store::StoreError;

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
}

/// The SQLite forms.
pub(super) mod sqlite {
    use std::time::Duration;

    use sqlx::SqlitePool;

    use crate::store::{millis, now_ms, StoreError};

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
}
