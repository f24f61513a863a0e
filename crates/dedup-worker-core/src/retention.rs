//! Retention: processed ids are kept for the dedup window (`consumer.dedup_retention_days`),
//! dispatched outbox rows for `outbox.retention_hours`.
//!
//! Processed ids live in generations ([`crate::store::dedup`]): each pass seals the current
//! generation once it is a third of the window old and empties, whole, every generation sealed
//! longer ago than the window, in one short transaction whose lock waits are bounded. Nothing
//! deletes processed ids row by row, so the consumer never competes with a large delete. Rows of
//! the legacy dedup table (from before the generations) and dispatched outbox rows are deleted in
//! bounded batches (one statement deletes at most `retention_batch` rows), so a purge never
//! holds long locks or one huge transaction.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{bounded, Store};

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
    pub interval: Duration,
    pub batch: i64,
    /// The longest one purge statement may wait for the store (`database.statement_timeout`).
    pub statement_timeout: Duration,
}

/// Deletes expired processed ids and dispatched outbox rows in bounded batches, every
/// `interval`, until shutdown.
pub async fn run_retention(store: Store, options: RetentionOptions, shutdown: CancellationToken) {
    loop {
        match bounded(
            options.statement_timeout,
            store.dedup().maintain(options.dedup_window),
        )
        .await
        {
            Ok(done) => {
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
            Err(error) => {
                tracing::warn!(%error, "dedup generation maintenance failed; will try again")
            }
        }
        loop {
            let purge = store.retention().purge_expired(
                options.dedup_window,
                options.outbox_window,
                options.batch,
            );
            match bounded(options.statement_timeout, purge).await {
                Ok(n) if n > 0 && !shutdown.is_cancelled() => {
                    tracing::debug!(deleted = n, "retention");
                    continue;
                }
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, "retention failed; will try again");
                    break;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(options.interval) => {}
        }
    }
}
