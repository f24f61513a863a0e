//! What the gauges of `/metrics` read of the store, every few seconds in every process
//! (sampled in the background by `crate::gauges`, each call under a timeout): the database
//! queue's backlog, and the rows an alert watches. Each is one statement over an index: the
//! queue's `(queue, visible_at, id)`, the outbox's partial indexes on pending and failed rows;
//! dead letters are few by nature.

use std::time::Duration;

use sqlx::Row;

use super::{now_ms, Pool, Store, StoreError};

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

/// A count as read: never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Store {
    /// Messages on the database queue `queue`, leased or not, and how long the oldest has been
    /// there (`None` when the queue is empty). One statement.
    pub async fn queue_backlog(&self, queue: &str) -> Result<(u64, Option<Duration>), StoreError> {
        match &self.0 {
            Pool::Postgres(pool) => {
                // The server's clock on both sides: `enqueued_at` is its `now()` at the insert.
                let row = sqlx::query(
                    "SELECT count(*), extract(epoch FROM now() - min(enqueued_at))::float8
                       FROM queue_messages WHERE queue = $1",
                )
                .bind(queue)
                .fetch_one(pool)
                .await?;
                let age: Option<f64> = row.try_get(1)?;
                Ok((
                    count(row.try_get(0)?),
                    // A clock stepped back makes the age negative: say 0, never panic.
                    age.and_then(|secs| Duration::try_from_secs_f64(secs.max(0.0)).ok()),
                ))
            }
            Pool::Sqlite(pool) => {
                let row = sqlx::query(
                    "SELECT count(*), min(enqueued_at) FROM queue_messages WHERE queue = $1",
                )
                .bind(queue)
                .fetch_one(pool)
                .await?;
                let oldest: Option<i64> = row.try_get(1)?;
                Ok((
                    count(row.try_get(0)?),
                    oldest.map(|ms| Duration::from_millis(count(now_ms().saturating_sub(ms)))),
                ))
            }
        }
    }

    /// Dead letters, pending and failed outbox rows. One statement.
    pub async fn alert_counts(&self) -> Result<AlertCounts, StoreError> {
        const SQL: &str = "SELECT (SELECT count(*) FROM dead_letters),
                                  (SELECT count(*) FROM outbox WHERE status = 'pending'),
                                  (SELECT count(*) FROM outbox WHERE status = 'failed')";
        let row = match &self.0 {
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
