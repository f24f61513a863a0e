//! Retention: processed ids are kept for the dedup window (`consumer.dedup_retention_days`),
//! dispatched outbox rows for `outbox.retention_hours`, kept bodies for
//! `retention.payload_days`, the action log for `retention.history_days`.
//!
//! Processed ids live in generations ([`crate::store::dedup`]): each pass seals the current
//! generation once it is a third of the window old and empties, whole, every generation sealed
//! longer ago than the window, in one short transaction whose lock waits are bounded. Nothing
//! deletes processed ids row by row, so the consumer never competes with a large delete. Rows of
//! the legacy dedup table (from before the generations), dispatched outbox rows, redrive and
//! stale-guard records and the action log are deleted in bounded batches (one statement deletes
//! at most `retention_batch` rows), so a purge never holds long locks or one huge transaction.
//!
//! Kept bodies: on PostgreSQL a day's partition is detached and dropped whole once the day is
//! past the window, and the days ahead are made (`store.partitions()`); on SQLite the oldest are
//! deleted 500 at a time, each delete its own transaction, with a short pause between so the
//! consumer's writes interleave.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::store::{bounded, Dropped, Store, StoreError, DROP_STATEMENT_TIMEOUT, PARTITIONED};

/// Rows one SQLite body purge deletes: a consumer's `BEGIN IMMEDIATE` waits at most this long
/// a delete (~5–20 ms).
const BODY_BATCH: i64 = 500;

/// The pause between two SQLite body purges, for the consumer's writes.
const BODY_PAUSE: Duration = Duration::from_millis(10);

/// Retention options.
#[derive(Debug, Clone, Copy)]
pub struct RetentionOptions {
    /// Processed ids younger than this are kept (the dedup window). A duplicate arriving after
    /// its id was purged is handled again, so this must outlast every redelivery: the
    /// configuration refuses less than [`crate::config::MIN_DEDUP_RETENTION_DAYS`] (Stripe's
    /// 3-day retries plus margin) unless `consumer.allow_short_dedup_retention` is set.
    pub dedup_window: Duration,
    /// Dispatched outbox rows younger than this are kept. Only a record: nothing deduplicates
    /// against them, so even zero is safe.
    pub outbox_window: Duration,
    /// How often a pass runs.
    pub interval: Duration,
    /// The most rows one purge statement deletes.
    pub batch: i64,
    /// The longest one purge statement may wait for the store (`database.statement_timeout`).
    pub statement_timeout: Duration,
    /// Days kept bodies are kept (`retention.payload_days`).
    pub payload_days: u32,
    /// Days the action log is kept (`retention.history_days`).
    pub history_days: u32,
}

impl RetentionOptions {
    /// The options `settings` give (`consumer.*` for the dedup window and purge, `outbox.
    /// retention_hours`, `[retention]`).
    pub fn from_settings(settings: &Settings) -> Self {
        let c = &settings.consumer;
        RetentionOptions {
            dedup_window: c.dedup_window(),
            outbox_window: settings.outbox.retention(),
            interval: c.retention_interval.max(Duration::from_secs(1)),
            batch: c.retention_batch,
            statement_timeout: settings.database.statement_timeout,
            payload_days: settings.retention.payload_days,
            history_days: settings.retention.history_days,
        }
    }
}

/// What one pass did (`dedup-worker retention run` prints it as JSON).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RetentionPass {
    /// The current dedup generation was sealed.
    pub generation_sealed: bool,
    /// Dedup generations emptied.
    pub generations_emptied: usize,
    /// Rows deleted by the bounded purges (legacy ids, dispatched outbox rows, redrive and
    /// stale-guard records).
    pub rows_purged: u64,
    /// Kept bodies deleted (SQLite).
    pub bodies_purged: u64,
    /// Action log rows deleted.
    pub admin_actions_purged: u64,
    /// Day partitions made ahead (PostgreSQL).
    pub partitions_made: u64,
    /// Per history table, the partitions finished, detached and dropped (PostgreSQL).
    pub partitions: Vec<(String, Dropped)>,
    /// What failed (each is tried again next pass).
    pub errors: Vec<String>,
}

/// Runs [`retention_pass`] every `interval` until shutdown.
pub async fn run_retention(store: Store, options: RetentionOptions, shutdown: CancellationToken) {
    loop {
        retention_pass(&store, &options, &shutdown).await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(options.interval) => {}
        }
    }
}

/// One pass of every purge, each failure logged and recorded, none stopping the others.
pub async fn retention_pass(
    store: &Store,
    options: &RetentionOptions,
    shutdown: &CancellationToken,
) -> RetentionPass {
    let mut pass = RetentionPass::default();
    let within = options.statement_timeout;
    match bounded(within, store.dedup().maintain(options.dedup_window)).await {
        Ok(done) => {
            pass.generation_sealed = done.sealed;
            pass.generations_emptied = done.expired;
            if done.sealed || done.expired > 0 {
                tracing::info!(
                    sealed = done.sealed,
                    expired = done.expired,
                    "dedup generations rotated"
                );
            }
            if done.next_slot_busy {
                tracing::warn!(
                    "the current dedup generation is due to be sealed, but the next one still \
                     holds ids inside the window (was the window lengthened?); it keeps growing"
                );
            }
        }
        Err(error) => failed(&mut pass, "dedup generation maintenance", &error),
    }
    pass.rows_purged = drain(store, options, Purge::Expired, &mut pass.errors, shutdown).await;
    pass.admin_actions_purged = drain(
        store,
        options,
        Purge::AdminActions,
        &mut pass.errors,
        shutdown,
    )
    .await;
    history_partitions(store, options, &mut pass).await;
    pass.bodies_purged = drain(store, options, Purge::Bodies, &mut pass.errors, shutdown).await;
    pass
}

/// PostgreSQL: each history table's days ahead made, its days past `payload_days` dropped.
async fn history_partitions(store: &Store, options: &RetentionOptions, pass: &mut RetentionPass) {
    let partitions = store.partitions();
    match bounded(options.statement_timeout, partitions.ensure_all()).await {
        Ok(made) => pass.partitions_made = made,
        Err(error) => failed(pass, "making history partitions", &error),
    }
    for parent in PARTITIONED {
        let dropped = partitions.drop_expired(parent, options.payload_days, DROP_STATEMENT_TIMEOUT);
        match dropped.await {
            Ok(done) if done == Dropped::default() => {}
            Ok(done) => pass.partitions.push(((*parent).to_owned(), done)),
            Err(error) => failed(pass, "dropping expired history partitions", &error),
        }
    }
}

/// The bounded purges a pass repeats until each deletes nothing.
#[derive(Debug, Clone, Copy)]
enum Purge {
    /// Legacy ids, dispatched outbox rows, redrive and stale-guard records.
    Expired,
    /// The action log and the per-minute counts, past `history_days`.
    AdminActions,
    /// Kept bodies past `payload_days` (SQLite), with a pause after each batch.
    Bodies,
}

impl Purge {
    fn what(self) -> &'static str {
        match self {
            Purge::Expired => "retention",
            Purge::AdminActions => "action log and counts retention",
            Purge::Bodies => "body retention",
        }
    }

    async fn once(self, store: &Store, options: &RetentionOptions) -> Result<u64, StoreError> {
        let retention = store.retention();
        match self {
            Purge::Expired => {
                let (ids, outbox) = (options.dedup_window, options.outbox_window);
                retention.purge_expired(ids, outbox, options.batch).await
            }
            Purge::AdminActions => {
                let older_than = days(options.history_days);
                let actions = retention
                    .purge_admin_actions(older_than, options.batch)
                    .await?;
                // The per-minute counts are kept as long as the action log.
                let before_ms = chrono::Utc::now().timestamp_millis()
                    - i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
                let counts = store
                    .activity()
                    .purge_before(before_ms, options.batch)
                    .await?;
                Ok(actions + counts)
            }
            Purge::Bodies => {
                let older_than = days(options.payload_days);
                let deleted = retention.purge_bodies(older_than, BODY_BATCH).await;
                if matches!(deleted, Ok(n) if n > 0) {
                    tokio::time::sleep(BODY_PAUSE).await;
                }
                deleted
            }
        }
    }
}

/// Runs `purge` until it deletes nothing (or shutdown, or a failure); the rows deleted.
async fn drain(
    store: &Store,
    options: &RetentionOptions,
    purge: Purge,
    errors: &mut Vec<String>,
    shutdown: &CancellationToken,
) -> u64 {
    let mut total = 0;
    loop {
        match bounded(options.statement_timeout, purge.once(store, options)).await {
            Ok(n) if n > 0 && !shutdown.is_cancelled() => {
                tracing::debug!(deleted = n, "{}", purge.what());
                total += n;
            }
            Ok(n) => return total + n,
            Err(error) => {
                tracing::warn!(%error, "{} failed; will try again", purge.what());
                errors.push(format!("{}: {error}", purge.what()));
                return total;
            }
        }
    }
}

fn failed(pass: &mut RetentionPass, what: &str, error: &StoreError) {
    tracing::warn!(%error, "{what} failed; will try again");
    pass.errors.push(format!("{what}: {error}"));
}

/// `n` days.
fn days(n: u32) -> Duration {
    Duration::from_secs(u64::from(n) * 86_400)
}
