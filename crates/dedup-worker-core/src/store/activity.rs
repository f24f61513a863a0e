//! Per-minute counts (`activity_minutes`), written in the same transaction as what they count,
//! so no later retry, redrive or retention changes a past minute: [`Activity`], reached as
//! `store.activity()` (retention's purge), and the writes other statements embed or run in
//! their own transactions.
//!
//! A counter row is `(minute, series, shard)`: the minute of the writing transaction's start
//! (PostgreSQL's `now()`, SQLite's `StoreTx` start, as `processed_at` is), what is counted
//! ([`Series`]), and the writer's [`Shard`]. A row is locked from its upsert until its
//! transaction ends, so each writer (a consumer worker loop, a relay lane) takes a random shard
//! at start and rarely shares a row with another; writers that do share one lock their series
//! in one order (sorted in the statement), so they wait for each other, never deadlock. The
//! upsert is meant as a transaction's last statement: its locks are then held for the commit
//! only.
//!
//! Three ways to write, one statement shape:
//! * [`count_cte`] / [`count_cte_from`] (PostgreSQL): a `WITH` item another statement embeds,
//!   adding no round trip (the relay's marks, a redrive);
//! * [`StoreTx::add_counts`]: one statement in the consumer's batch transaction;
//! * [`add_sqlite`]: in any SQLite transaction (SQLite has no data-modifying `WITH`).

use std::collections::BTreeMap;

use super::{Pool, StoreError, StoreTx};

/// How many shards a series' minute is spread over (the plan's 64; raise it if `pg_locks`
/// shows writers waiting on counter rows).
pub const SHARDS: i16 = 64;

/// What a counter row counts. Its name ([`Series::name`]) is what the table keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Series {
    /// Events whose handler ran and committed (the consumer's batch).
    Handled,
    /// Deliveries acked as duplicates of an event handled before (the consumer's batch).
    Duplicates,
    /// Deliveries the consumer dead-lettered (the consumer's batch).
    DeadLettered,
    /// Events the stale-event guard held back (the consumer's batch).
    Stale,
    /// Outbox rows the handlers wrote (the consumer's batch).
    OutboxWritten,
    /// Deliveries a sink accepted (the relay's delivered mark).
    Delivered,
    /// Failed delivery attempts that will be tried again (the relay's failure mark).
    DeliveryFailed,
    /// Deliveries failed for good: their last attempt failed (the relay's failure mark).
    GaveUp,
    /// Deliveries the receiver throttled (429, `Retry-After`; the relay's defer).
    Throttled,
    /// Dead letters redriven by an operator.
    Redriven,
    /// Dead letters discarded by an operator.
    Discarded,
    /// Failed deliveries an operator retried.
    Retried,
    /// Delivered rows an operator sent again.
    Resent,
}

impl Series {
    /// Every series, in the order the overview lists them.
    pub const ALL: [Series; 13] = [
        Series::Handled,
        Series::Duplicates,
        Series::DeadLettered,
        Series::Stale,
        Series::OutboxWritten,
        Series::Delivered,
        Series::DeliveryFailed,
        Series::GaveUp,
        Series::Throttled,
        Series::Redriven,
        Series::Discarded,
        Series::Retried,
        Series::Resent,
    ];

    /// The name the table keeps (and a SQL literal may name: `'delivered'`).
    pub const fn name(self) -> &'static str {
        match self {
            Series::Handled => "handled",
            Series::Duplicates => "duplicates",
            Series::DeadLettered => "dead_lettered",
            Series::Stale => "stale",
            Series::OutboxWritten => "outbox_written",
            Series::Delivered => "delivered",
            Series::DeliveryFailed => "delivery_failed",
            Series::GaveUp => "gave_up",
            Series::Throttled => "throttled",
            Series::Redriven => "redriven",
            Series::Discarded => "discarded",
            Series::Retried => "retried",
            Series::Resent => "resent",
        }
    }

    /// The series named `name`, if any.
    pub fn from_name(name: &str) -> Option<Series> {
        Series::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A writer's shard: which of the [`SHARDS`] counter rows of a series' minute it adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard(i16);

impl Shard {
    /// Shard 0: for writers that count too rarely to need their own (a mark that records
    /// nothing, made by tests and old callers).
    pub const ZERO: Shard = Shard(0);

    /// A random shard, taken once by each writer at its start.
    pub fn random() -> Shard {
        Shard::of(rand::random())
    }

    /// Shard `n` (modulo [`SHARDS`]): for tests that make two writers share one.
    pub fn of(n: u16) -> Shard {
        Shard((n % SHARDS as u16) as i16)
    }

    /// The number the table keeps.
    pub fn number(self) -> i16 {
        self.0
    }
}

/// What one transaction adds: a count per series (zero counts are not written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Each series' count; a `BTreeMap` so a series is written once per statement (an upsert
    /// may not touch one row twice).
    by_series: BTreeMap<Series, i64>,
}

impl Counts {
    /// Adds `n` to `series`.
    pub fn add(&mut self, series: Series, n: usize) -> &mut Self {
        *self.by_series.entry(series).or_default() += i64::try_from(n).unwrap_or(i64::MAX);
        self
    }

    /// `series` counted `n` times.
    pub fn of(series: Series, n: usize) -> Counts {
        let mut counts = Counts::default();
        counts.add(series, n);
        counts
    }

    /// Whether nothing is counted (no statement to run).
    pub fn is_empty(&self) -> bool {
        self.by_series.values().all(|n| *n == 0)
    }

    /// The series' names and their counts, zeros left out: the two arrays the PostgreSQL
    /// upsert binds (`count_cte`).
    pub fn columns(&self) -> (Vec<&'static str>, Vec<i64>) {
        self.by_series
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(series, n)| (series.name(), *n))
            .unzip()
    }
}

/// The upsert as a `WITH` item named `name` (PostgreSQL), adding the rows `(series TEXT, n
/// INT8)` that the query `counts` gives to the minute of the statement's transaction, under
/// the shard bound at `$shard_param` (`int2`). Rows of one series are summed, zero counts left
/// out, and the series locked in one order (`COLLATE "C"`, the same for every writer). A
/// data-modifying `WITH` item runs whether or not the statement reads it. E.g. a relay mark:
/// `count_cte_from("counted", "SELECT 'delivered', count(*) FROM fresh", 13)`.
pub(crate) fn count_cte_from(name: &str, counts: &str, shard_param: usize) -> String {
    count_cte_at(name, counts, &format!("${shard_param}"))
}

/// [`count_cte_from`] with the shard written into the statement (for statements built with a
/// `QueryBuilder`, whose parameters are not numbered by hand): a number of ours, never input.
pub(crate) fn count_cte_for(name: &str, counts: &str, shard: Shard) -> String {
    count_cte_at(name, counts, &shard.number().to_string())
}

/// The upsert with the shard given as SQL (a parameter or a literal).
fn count_cte_at(name: &str, counts: &str, shard: &str) -> String {
    format!(
        "{name} AS (
           INSERT INTO activity_minutes AS a (minute, series, shard, n)
           SELECT date_trunc('minute', now(), 'UTC'), c.series, {shard}::int2,
                  sum(c.n)::int8
             FROM ({counts}) AS c(series, n)
            WHERE c.n > 0
            GROUP BY c.series
            ORDER BY c.series COLLATE \"C\"
           ON CONFLICT (minute, series, shard) DO UPDATE SET n = a.n + EXCLUDED.n
           RETURNING 1)"
    )
}

/// [`count_cte_from`] for counts the caller binds: the series' names at `$first_param`
/// (`text[]`), their counts at `$first_param + 1` (`int8[]`: [`Counts::columns`]), the shard
/// at `$first_param + 2`.
pub(crate) fn count_cte(name: &str, first_param: usize) -> String {
    let counts = format!(
        "SELECT * FROM unnest(${first_param}::text[], ${}::int8[])",
        first_param + 1
    );
    count_cte_from(name, &counts, first_param + 2)
}

/// The upsert in an SQLite transaction that began at `began_ms` (Unix ms: the minute counted
/// is that start's, as a batch's `processed_at` is). One statement; nothing when `counts` is
/// empty.
pub(crate) async fn add_sqlite(
    conn: &mut sqlx::SqliteConnection,
    began_ms: i64,
    counts: &Counts,
    shard: Shard,
) -> Result<(), StoreError> {
    let (series, n) = counts.columns();
    if series.is_empty() {
        return Ok(());
    }
    // ($1 minute, $2 shard), then a (series, n) pair per series.
    let rows: Vec<String> = (0..series.len())
        .map(|i| format!("($1, ${}, $2, ${})", 3 + 2 * i, 4 + 2 * i))
        .collect();
    let sql = format!(
        "INSERT INTO activity_minutes (minute, series, shard, n) VALUES {}
         ON CONFLICT (minute, series, shard) DO UPDATE
            SET n = activity_minutes.n + excluded.n",
        rows.join(", ")
    );
    let mut query = sqlx::query(&sql)
        .bind(began_ms - began_ms.rem_euclid(60_000))
        .bind(shard.number());
    for (series, n) in series.into_iter().zip(n) {
        query = query.bind(series).bind(n);
    }
    query.execute(conn).await?;
    Ok(())
}

/// The upsert on a PostgreSQL connection inside a transaction (the minute is its `now()`).
pub(crate) async fn add_postgres(
    conn: &mut sqlx::PgConnection,
    counts: &Counts,
    shard: Shard,
) -> Result<(), StoreError> {
    let (series, n) = counts.columns();
    if series.is_empty() {
        return Ok(());
    }
    let sql = format!("WITH {} SELECT 1", count_cte("counted", 1));
    sqlx::query(&sql)
        .bind(series)
        .bind(n)
        .bind(shard.number())
        .execute(conn)
        .await?;
    Ok(())
}

impl StoreTx {
    /// Adds `counts` to this transaction's minute under `shard`: one statement (none when
    /// `counts` is empty), best run last, so its counter rows stay locked for the commit only.
    /// Kept here with the table's other writes rather than in `transaction.rs`.
    pub async fn add_counts(&mut self, counts: &Counts, shard: Shard) -> Result<(), StoreError> {
        match self {
            StoreTx::Postgres(tx) => add_postgres(tx, counts, shard).await,
            StoreTx::Sqlite(tx, began) => add_sqlite(tx, *began, counts, shard).await,
        }
    }
}

/// The per-minute counts' own upkeep: retention's purge. (The overview reads them through
/// `store.reads().minute_counts`.)
#[derive(Debug, Clone, Copy)]
pub struct Activity<'a> {
    pub(super) pool: &'a Pool,
}

impl Activity<'_> {
    /// Deletes at most `batch` counter rows of minutes before `before_ms` (Unix ms), oldest
    /// first; returns how many. Retention calls it until it returns less than `batch`, each
    /// call its own short statement (the rows are a primary-key range: no scan).
    pub async fn purge_before(self, before_ms: i64, batch: i64) -> Result<u64, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "DELETE FROM activity_minutes WHERE (minute, series, shard) IN (
                   SELECT minute, series, shard FROM activity_minutes
                    WHERE minute < to_timestamp($1::float8 / 1000) ORDER BY minute LIMIT $2)",
            )
            .bind(before_ms)
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(
                "DELETE FROM activity_minutes WHERE (minute, series, shard) IN (
                   SELECT minute, series, shard FROM activity_minutes
                    WHERE minute < $1 ORDER BY minute LIMIT $2)",
            )
            .bind(before_ms)
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_leave_zeros_out_and_add_up_per_series() {
        let mut counts = Counts::default();
        counts
            .add(Series::Stale, 0)
            .add(Series::Handled, 2)
            .add(Series::Duplicates, 1)
            .add(Series::Handled, 3);
        assert_eq!(
            counts.columns(),
            (vec!["handled", "duplicates"], vec![5, 1])
        );
        assert!(!counts.is_empty());
        assert!(Counts::of(Series::Redriven, 0).is_empty());
    }

    #[test]
    fn every_series_is_named_once_and_read_back() {
        let mut names: Vec<&str> = Series::ALL.iter().map(|s| s.name()).collect();
        for series in Series::ALL {
            assert_eq!(Series::from_name(series.name()), Some(series));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Series::ALL.len());
        assert_eq!(Series::from_name("outbox_pending"), None);
    }

    #[test]
    fn shards_stay_in_range() {
        for _ in 0..1000 {
            assert!((0..SHARDS).contains(&Shard::random().number()));
        }
        assert_eq!(Shard::of(65).number(), 1);
    }

    #[test]
    fn the_cte_binds_from_its_first_parameter() {
        let cte = count_cte("counted", 4);
        assert!(cte.starts_with("counted AS ("), "{cte}");
        assert!(cte.contains("unnest($4::text[], $5::int8[])"), "{cte}");
        assert!(cte.contains("$6::int2"), "{cte}");
    }
}
