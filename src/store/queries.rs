//! The pipeline's statements on the pool, one method each: the database queue, the outbox
//! relay, retention and dead letters. Each calls the backend module's function of the same name
//! ([`super::postgres`] or [`super::sqlite`]), where the SQL lives.

use std::time::Duration;

use super::dedup::{self, RingMaintenance, Seal};
use super::{
    new_claim_token, postgres, sqlite, DeadLetter, NewQueueMessage, OutboxClaim, OutboxCounts,
    OutboxRow, Pool, QueuedMessage, StaleEvent, Store, StoreError,
};

/// Calls the backend module's function of the same name with the pool.
macro_rules! on_pool {
    ($store:expr, $func:ident($($arg:expr),*)) => {
        match &$store.0 {
            Pool::Postgres(pool) => postgres::$func(pool, $($arg),*).await,
            Pool::Sqlite(pool) => sqlite::$func(pool, $($arg),*).await,
        }
    };
}

impl Store {
    // --- database queue -------------------------------------------------------------------

    /// Writes all messages in one transaction (one commit for the whole group).
    pub async fn enqueue(
        &self,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        on_pool!(self, enqueue(queue, messages))
    }

    /// Leases up to `max` visible messages for `lease`, under a fresh claim token.
    pub async fn claim_messages(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        on_pool!(self, claim_messages(queue, max, lease, new_claim_token()))
    }

    /// Deletes acknowledged messages, whoever holds their lease now. Unlike a release this
    /// needs no claim token: a consumer acks only after committing the event's outcome (its
    /// processed id, or its dead letter), so the event is safe whatever becomes of the message.
    /// A consumer that re-claimed it after this one's lease expired would find the processed id
    /// (its dedup insert waits for, then yields to, this one's) and ack it as a duplicate, or
    /// dead-letter it a second time; deleting it under that consumer loses nothing and spares
    /// that work.
    pub async fn ack_messages(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        on_pool!(self, ack_messages(ids))
    }

    /// Makes a message visible again after `delay` (redelivery with backoff), if it is still
    /// under the claim `claim_token`. Returns the rows released: 0 when another consumer has
    /// claimed the message since (it holds the lease now; moving its visibility would let a
    /// third consumer take it early, or delay it by a backoff it did not earn), or it was acked.
    pub async fn release_message(
        &self,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        on_pool!(self, release_message(id, claim_token, delay))
    }

    /// Extends the lease of messages `ids` still under the claim `claim_token` to `lease` from
    /// now (the consumer's heartbeat while it works on them). Returns the ids extended: one
    /// missing was claimed by another consumer since (its lease had run out), or was acked.
    pub async fn extend_message_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        on_pool!(self, extend_message_leases(claim_token, ids, lease))
    }

    /// Messages on `queue`, leased or not.
    pub async fn queue_depth(&self, queue: &str) -> Result<i64, StoreError> {
        on_pool!(self, queue_depth(queue))
    }

    // --- outbox relay ---------------------------------------------------------------------

    /// Leases up to `max` due pending rows for `lease` (FOR UPDATE SKIP LOCKED on PostgreSQL),
    /// under a fresh claim token.
    pub async fn claim_outbox(
        &self,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        on_pool!(self, claim_outbox(max, lease, new_claim_token()))
    }

    /// Marks rows dispatched, each only if it still carries the token of `claims`. Returns how
    /// many are marked; the others were claimed by another relay since (see [`OutboxClaim`]).
    /// Marking again under the same claim counts the row again and changes nothing, so a mark
    /// retried after an outage that hid its commit is not mistaken for a lost lease.
    pub async fn mark_dispatched(&self, claims: &[OutboxClaim]) -> Result<u64, StoreError> {
        if claims.is_empty() {
            return Ok(0);
        }
        on_pool!(self, mark_dispatched(claims))
    }

    /// Extends the lease of pending rows `ids` still under the claim `claim_token` to `lease`
    /// from now (the relay's heartbeat while it delivers them). Returns the ids extended: one
    /// missing was claimed by another relay since (its lease had run out), or is marked already.
    pub async fn extend_outbox_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        on_pool!(self, extend_outbox_leases(claim_token, ids, lease))
    }

    /// Makes pending rows `ids` still under the claim `claim_token` due now: a relay that stops
    /// before delivering them gives them back, so the next relay need not wait out the lease.
    /// Returns the rows released (rows marked meanwhile, or claimed by another relay, are not).
    pub async fn release_outbox_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        on_pool!(self, release_outbox_leases(claim_token, ids))
    }

    /// Records a failed delivery under `claim`: retried after `delay`, or marked failed once
    /// `attempts` reached `max_attempts`. Returns 1, or 0 if another relay claimed the row since
    /// (its own delivery decides the row's fate) or it is no longer pending.
    pub async fn mark_delivery_failed(
        &self,
        claim: OutboxClaim,
        error: &str,
        delay: Duration,
        max_attempts: u32,
    ) -> Result<u64, StoreError> {
        on_pool!(
            self,
            mark_delivery_failed(claim, error, delay, max_attempts)
        )
    }

    pub async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        on_pool!(self, outbox_counts())
    }

    /// Rows that exhausted their delivery attempts.
    pub async fn failed_outbox(&self, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
        on_pool!(self, failed_outbox(limit))
    }

    // --- retention ------------------------------------------------------------------------

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

    /// The newest `limit` events the stale-event guard held back.
    pub async fn stale_events(&self, limit: i64) -> Result<Vec<StaleEvent>, StoreError> {
        const SQL: &str = "SELECT source, event_id, event_type, object_id, version,
                                  newer_event_id, newer_version
                             FROM stale_events ORDER BY id DESC LIMIT $1";
        Ok(match &self.0 {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }

    // --- dead letters ---------------------------------------------------------------------

    pub async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
        on_pool!(self, dead_letters(limit))
    }

    /// Up to `limit` dead letters with an id above `after`, in id order: those in `ids`, or
    /// all when `ids` is empty (a redrive pages through them).
    pub async fn dead_letters_selected(
        &self,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        on_pool!(self, dead_letters_selected(ids, after, limit))
    }

    /// Deletes one dead letter (after its redrive was published); returns the rows deleted.
    pub async fn delete_dead_letter(&self, id: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM dead_letters WHERE id = $1";
        Ok(match &self.0 {
            Pool::Postgres(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }
}
