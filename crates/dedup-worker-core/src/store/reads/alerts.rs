//! The rows an alert watches, which the gauges of `/metrics` read every few seconds in every
//! process (sampled in the background by `crate::gauges`, each call under a timeout; the
//! database queue's backlog, which they sample too, is `store.queue().backlog`). One statement
//! over the outbox's partial indexes on pending and failed rows; dead letters are few by nature.

use sqlx::Row;

use super::Reads;
use crate::store::{count, Pool, StoreError};

/// Rows an operator is paged for, counted now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlertCounts {
    /// `dead_letters` rows: events that need a person (`dlq list`, `dlq redrive`).
    pub dead_letters: u64,
    /// Outbox rows not delivered yet (due or backing off).
    pub outbox_pending: u64,
    /// Outbox rows that exhausted their delivery attempts (`outbox failed`).
    pub outbox_failed: u64,
}

impl Reads<'_> {
    /// Dead letters, pending and failed outbox rows. One statement.
    pub async fn alert_counts(self) -> Result<AlertCounts, StoreError> {
        const SQL: &str = "SELECT (SELECT count(*) FROM dead_letters),
                                  (SELECT count(*) FROM outbox WHERE status = 'pending'),
                                  (SELECT count(*) FROM outbox WHERE status = 'failed')";
        let row = match self.pool {
            Pool::Postgres(pool) => {
                let row = sqlx::query(SQL).fetch_one(pool).await?;
                [row.try_get(0)?, row.try_get(1)?, row.try_get(2)?]
            }
            Pool::Sqlite(pool) => {
                let row = sqlx::query(SQL).fetch_one(pool).await?;
                [row.try_get(0)?, row.try_get(1)?, row.try_get(2)?]
            }
        };
        let [dead_letters, outbox_pending, outbox_failed] = row.map(count);
        Ok(AlertCounts {
            dead_letters,
            outbox_pending,
            outbox_failed,
        })
    }
}
