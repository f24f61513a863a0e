//! The console's front page: what happened per minute lately, read from the counts written
//! with what they count (`activity_minutes`, `store/activity.rs`): a primary-key range, the
//! same few rows per minute whatever the rate, and no later retry, redrive or retention
//! changes a past minute.

use sqlx::Row;

use super::Reads;
use crate::store::{Pool, StoreError};

/// The migration that made `activity_minutes`: minutes before it have no counts.
const COUNTS_MIGRATION: i64 = 20270102000140;

/// How many of one series were counted in one minute (all writers' shards summed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteCount {
    /// The series' name (`store::Series::name`: `handled`, `duplicates`, …).
    pub series: String,
    /// The minute's start, Unix milliseconds.
    pub minute_ms: i64,
    /// What the transactions that began in that minute counted.
    pub count: i64,
}

impl Reads<'_> {
    /// Per-minute counts of each series since `since_ms` (Unix ms), oldest minute first, series
    /// by name within a minute. A minute is final once every transaction that began in it has
    /// ended (at most `consumer.step_timeout` after it).
    pub async fn minute_counts(self, since_ms: i64) -> Result<Vec<MinuteCount>, StoreError> {
        let rows = match self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "SELECT series, (extract(epoch FROM minute) * 1000)::int8, sum(n)::int8
                       FROM activity_minutes WHERE minute >= to_timestamp($1::float8 / 1000)
                      GROUP BY minute, series ORDER BY minute, series",
            )
            .bind(since_ms)
            .fetch_all(pool)
            .await?
            .iter()
            .map(minute_count)
            .collect::<Result<Vec<_>, sqlx::Error>>(),
            Pool::Sqlite(pool) => sqlx::query(
                "SELECT series, minute, sum(n) FROM activity_minutes WHERE minute >= $1
                  GROUP BY minute, series ORDER BY minute, series",
            )
            .bind(since_ms)
            .fetch_all(pool)
            .await?
            .iter()
            .map(minute_count)
            .collect::<Result<Vec<_>, sqlx::Error>>(),
        };
        Ok(rows?)
    }

    /// Since when the counts are kept (Unix ms): when the migration that made their table was
    /// applied, from the library's migration history. `None` if the history does not say.
    pub async fn counting_since(self) -> Result<Option<i64>, StoreError> {
        Ok(match self.pool {
            // The store's connections find the library's own history first (schema
            // dedup_worker), not an application's `public._sqlx_migrations`.
            Pool::Postgres(pool) => sqlx::query_scalar::<_, Option<i64>>(
                "SELECT (extract(epoch FROM installed_on) * 1000)::int8
                   FROM _sqlx_migrations WHERE version = $1",
            )
            .bind(COUNTS_MIGRATION)
            .fetch_optional(pool)
            .await?
            .flatten(),
            // `installed_on` is SQLite's CURRENT_TIMESTAMP: UTC text.
            Pool::Sqlite(pool) => sqlx::query_scalar::<_, Option<i64>>(
                "SELECT CAST(strftime('%s', installed_on) AS INTEGER) * 1000
                   FROM _dedup_worker_migrations WHERE version = $1",
            )
            .bind(COUNTS_MIGRATION)
            .fetch_optional(pool)
            .await?
            .flatten(),
        })
    }
}

/// A `(series, minute, count)` row of either store.
fn minute_count<R: Row>(row: &R) -> Result<MinuteCount, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(MinuteCount {
        series: row.try_get(0)?,
        minute_ms: row.try_get(1)?,
        count: row.try_get(2)?,
    })
}
