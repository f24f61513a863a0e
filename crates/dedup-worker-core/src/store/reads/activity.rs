//! The console's front page: what happened per minute lately, from each outcome's table by its
//! time index (migrations `20261230…_console*`), so the last hour reads the last hour's rows
//! only.

use sqlx::Row;

use super::Reads;
use crate::store::dedup::RING_SLOTS;
use crate::store::{Pool, StoreError};

/// Each series the front page charts, and the table and time it counts.
const SERIES: &[(&str, &str, &str, &str)] = &[
    // (series, table, time column, condition)
    ("duplicates", "duplicate_deliveries", "seen_at", ""),
    ("dead_letters", "dead_letters", "created_at", ""),
    ("stale", "stale_events", "recorded_at", ""),
    (
        "outbox_dispatched",
        "outbox",
        "dispatched_at",
        "AND status = 'dispatched'",
    ),
    (
        "outbox_pending",
        "outbox",
        "created_at",
        "AND status = 'pending'",
    ),
    (
        "outbox_failed",
        "outbox",
        "created_at",
        "AND status = 'failed'",
    ),
];

/// How many rows of one series fell in one minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteCount {
    pub series: String,
    /// The minute's start, Unix milliseconds.
    pub minute_ms: i64,
    pub count: i64,
}

impl Reads<'_> {
    /// Per-minute counts of each series since `since_ms` (handled ids, duplicates, dead
    /// letters, stale events, outbox rows dispatched, still pending and failed by when they were
    /// written).
    pub async fn minute_counts(self, since_ms: i64) -> Result<Vec<MinuteCount>, StoreError> {
        let postgres = matches!(self.pool, Pool::Postgres(_));
        let minute = |column: &str| {
            if postgres {
                format!("(floor(extract(epoch FROM {column}) / 60) * 60000)::int8")
            } else {
                format!("(({column} / 60000) * 60000)")
            }
        };
        let since = if postgres {
            "to_timestamp($1::float8 / 1000)"
        } else {
            "$1"
        };
        let mut branches: Vec<String> = (0..RING_SLOTS)
            .map(|slot| {
                format!(
                    "SELECT 'handled' AS series, {} AS minute FROM processed_events_{slot}
                      WHERE processed_at >= {since}",
                    minute("processed_at")
                )
            })
            .collect();
        for (series, table, time, condition) in SERIES {
            let tables: Vec<String> = if !postgres && *table == "duplicate_deliveries" {
                (0..RING_SLOTS)
                    .map(|slot| format!("{table}_{slot}"))
                    .collect()
            } else {
                vec![(*table).to_owned()]
            };
            for table in tables {
                branches.push(format!(
                    "SELECT '{series}' AS series, {} AS minute FROM {table}
                      WHERE {time} >= {since} {condition}",
                    minute(time)
                ));
            }
        }
        let sql = format!(
            "SELECT series, minute, count(*) AS n FROM ({}) u GROUP BY series, minute",
            branches.join(" UNION ALL ")
        );
        let rows = match self.pool {
            Pool::Postgres(pool) => sqlx::query(&sql).bind(since_ms).fetch_all(pool).await?,
            Pool::Sqlite(pool) => {
                let rows = sqlx::query(&sql).bind(since_ms).fetch_all(pool).await?;
                return rows
                    .iter()
                    .map(|row| {
                        Ok(MinuteCount {
                            series: row.try_get(0)?,
                            minute_ms: row.try_get(1)?,
                            count: row.try_get(2)?,
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(StoreError::from);
            }
        };
        rows.iter()
            .map(|row| {
                Ok(MinuteCount {
                    series: row.try_get(0)?,
                    minute_ms: row.try_get(1)?,
                    count: row.try_get(2)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}
