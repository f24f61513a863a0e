//! The history tables' day partitions (PostgreSQL): made ahead of need, dropped whole once past
//! retention, so keeping a fortnight of bodies never means deleting rows (dead tuples, index
//! bloat, vacuum on the consumer's path). [`Partitions`], reached as `store.partitions()`;
//! every call is a no-op on SQLite, whose tables are plain (retention deletes there in small
//! batches: `retention.rs`).
//!
//! A parent's partitions are named `<parent>_pYYYYMMDD`, one per UTC day, bounds written with
//! `+00` (a bare date would be read in the session's `TimeZone`); the insert guard of each
//! history table looks for today's by that name.
//!
//! * **Made** ([`Partitions::ensure`]) as a standalone table (`CREATE TABLE … (LIKE parent …)`)
//!   then `ATTACH PARTITION`, which takes SHARE UPDATE EXCLUSIVE on the parent: inserts and
//!   reads go on (`CREATE TABLE … PARTITION OF` would take ACCESS EXCLUSIVE). The table is empty,
//!   so there is no validation scan, and the parent's indexes are built on it at once. Under a
//!   transaction advisory lock (two processes starting at once make each day once) and
//!   `lock_timeout = '2s'` (a maintenance step never queues the pipeline behind it for long).
//!   Run by `migrate`, at every role's start and on every retention pass, for today to
//!   today + `DAYS_AHEAD` (3).
//! * **Dropped** ([`Partitions::drop_expired`]) on a connection of its own, since
//!   `DETACH PARTITION … CONCURRENTLY` cannot run in a transaction block and waits for every
//!   older snapshot (longer than a pooled connection's statement timeout allows), one process
//!   at a time (a session advisory lock): first `DETACH … FINALIZE` of a detach an earlier pass
//!   left pending (interrupted by its timeout; at most one may be pending per parent), then, for
//!   each day wholly past the window, `DETACH … CONCURRENTLY` (SHARE UPDATE EXCLUSIVE: no
//!   conflict with inserts) and `DROP TABLE` of the table, standalone by then. A plain `DROP`
//!   of a partition would take ACCESS EXCLUSIVE on the parent, queue behind every consumer
//!   transaction inserting and block every one after it. There is no DEFAULT partition: a
//!   concurrent detach refuses to run when there is one.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{Days, NaiveDate};
use sqlx::{Connection, PgConnection, PgPool};

use super::postgres::begin;
use super::{Pool, StoreError};

/// The parents whose day partitions are maintained: `bodies/`'s `event_bodies` and the delivery
/// attempts' `outbox_attempts` (`outbox/attempts.rs`), both kept `retention.payload_days`.
pub const PARTITIONED: &[&str] = &["event_bodies", "outbox_attempts"];

/// How many days past today are made ahead (today to today + 3): three failed days of
/// maintenance before an insert finds no partition.
pub const DAYS_AHEAD: u64 = 3;

/// The longest one statement of [`Partitions::drop_expired`] may take by default: a concurrent
/// detach waits for every transaction older than it (a stuck console read, a long export);
/// past this it is left pending, and the next pass finishes it.
pub const DROP_STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The session advisory lock of [`Partitions::drop_expired`]: one process at a time.
const PARTITION_LOCK: i64 = 0x6465_6475_7061_7274;

/// The transaction advisory lock of [`Partitions::ensure`]: each day made once.
const ENSURE_LOCK: i64 = 0x6465_6475_656e_7375;

/// What one [`Partitions::drop_expired`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// Partitions whose pending detach (an interrupted earlier pass) was finished.
    pub finalized: Vec<String>,
    /// Partitions detached and dropped (tables of days past the window).
    pub dropped: Vec<String>,
    /// What each of `dropped` took, in its order: the figure an operator (and the benchmark)
    /// compares with the consumer's lock waits.
    pub timings: Vec<DropTiming>,
    /// Another process held the lock: nothing was done.
    pub busy: bool,
}

/// How long one partition's removal took, in microseconds: `DETACH … CONCURRENTLY` (which waits
/// for the transactions older than it) and `DROP TABLE` (its files).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DropTiming {
    /// `ALTER TABLE … DETACH PARTITION … CONCURRENTLY` (nothing when it was detached already).
    pub detach_micros: u64,
    /// `DROP TABLE` of the detached table.
    pub drop_micros: u64,
}

/// One partition of a parent, as the catalog lists it.
#[derive(Debug, sqlx::FromRow)]
struct Listed {
    /// The table's name (`<parent>_pYYYYMMDD`).
    name: String,
    /// Attached to the parent (pending detach included).
    attached: bool,
    /// A detach was interrupted: `FINALIZE` finishes it.
    pending: bool,
}

/// The partitions of `$1` (a parent, by name) in its schema, attached or left standalone.
const LIST_SQL: &str = "
    SELECT c.relname::text AS name, i.inhrelid IS NOT NULL AS attached,
           coalesce(i.inhdetachpending, false) AS pending
      FROM pg_class c
      LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = $1::text::regclass
     WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::text::regclass)
       AND c.relkind = 'r' AND c.relname ~ ('^' || $1 || '_p[0-9]{8}$')
     ORDER BY c.relname";

/// The database's current UTC day (partitions follow the database's clock, never a process's).
const TODAY_SQL: &str = "SELECT (now() AT TIME ZONE 'UTC')::date";

/// The day partitions of the history tables.
#[derive(Debug, Clone, Copy)]
pub struct Partitions<'a> {
    pub(super) pool: &'a Pool,
}

impl Partitions<'_> {
    /// Makes every missing day of every maintained parent from today to today + `DAYS_AHEAD` (3);
    /// returns how many were made.
    pub async fn ensure_all(self) -> Result<u64, StoreError> {
        let mut made = 0;
        for parent in PARTITIONED {
            made += self.ensure(parent, None).await?;
        }
        Ok(made)
    }

    /// Makes each missing day of `parent` from today (UTC, the database's) to `through_day`
    /// (default today + `DAYS_AHEAD` (3)); returns how many were made. Idempotent, also when
    /// several processes run it at once.
    pub async fn ensure(
        self,
        parent: &str,
        through_day: Option<NaiveDate>,
    ) -> Result<u64, StoreError> {
        let Pool::Postgres(pool) = self.pool else {
            return Ok(0);
        };
        let today: NaiveDate = sqlx::query_scalar(TODAY_SQL).fetch_one(pool).await?;
        let last = through_day.unwrap_or(today + Days::new(DAYS_AHEAD));
        ensure_days(pool, parent, today, last).await
    }

    /// Makes each missing day of `parent` from `first` to `last` (any days: tests use days in
    /// the past); returns how many were made.
    pub async fn ensure_days(
        self,
        parent: &str,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<u64, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => ensure_days(pool, parent, first, last).await,
            Pool::Sqlite(_) => Ok(0),
        }
    }

    /// Detaches and drops `parent`'s partitions of days wholly older than `keep_days` before
    /// today (kept at least `keep_days`, at most one day more), after finishing any detach left
    /// pending; on a connection of its own whose statements may take `statement_timeout`
    /// ([`DROP_STATEMENT_TIMEOUT`] in service). A failure leaves at most one detach pending,
    /// finished by the next call.
    pub async fn drop_expired(
        self,
        parent: &str,
        keep_days: u32,
        statement_timeout: Duration,
    ) -> Result<Dropped, StoreError> {
        let Pool::Postgres(pool) = self.pool else {
            return Ok(Dropped::default());
        };
        let mut conn = maintenance_connection(pool, statement_timeout).await?;
        let result = drop_on(&mut conn, parent, keep_days).await;
        // Closing the session releases its advisory lock, whatever happened.
        let _ = conn.close().await;
        result
    }

    /// How many days past today `parent` has partitions for, without a gap (3 after a fresh
    /// `ensure`); -1 when today's is missing, so inserts are being skipped. `None` on SQLite.
    pub async fn days_ahead(self, parent: &str) -> Result<Option<i64>, StoreError> {
        let Pool::Postgres(pool) = self.pool else {
            return Ok(None);
        };
        let today: NaiveDate = sqlx::query_scalar(TODAY_SQL).fetch_one(pool).await?;
        let days = attached_days(pool, parent).await?;
        let mut ahead = -1;
        let mut day = today;
        while days.contains(&day) {
            ahead += 1;
            day = day + Days::new(1);
        }
        Ok(Some(ahead))
    }
}

/// The day a partition's name says, if it is `<parent>_pYYYYMMDD`.
fn day_of(parent: &str, name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix(parent)?.strip_prefix("_p")?;
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

/// The name of `parent`'s partition for `day`.
fn partition_name(parent: &str, day: NaiveDate) -> String {
    format!("{parent}_p{}", day.format("%Y%m%d"))
}

/// An identifier quoted for SQL. The names are this module's own (a parent from
/// [`PARTITIONED`] or a test, and a date), but quoted all the same.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn listed(conn: &mut PgConnection, parent: &str) -> Result<Vec<Listed>, StoreError> {
    Ok(sqlx::query_as(LIST_SQL)
        .bind(parent)
        .fetch_all(conn)
        .await?)
}

/// The days `parent` has an attached partition for.
async fn attached_days(pool: &PgPool, parent: &str) -> Result<Vec<NaiveDate>, StoreError> {
    let mut conn = pool.acquire().await?;
    Ok(listed(&mut conn, parent)
        .await?
        .into_iter()
        .filter(|p| p.attached)
        .filter_map(|p| day_of(parent, &p.name))
        .collect())
}

async fn ensure_days(
    pool: &PgPool,
    parent: &str,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<u64, StoreError> {
    let mut tx = begin(pool).await?;
    sqlx::query("SET LOCAL lock_timeout = '2s'")
        .execute(&mut *tx)
        .await?;
    // Two processes starting at once: the second waits here, then finds the days made.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ENSURE_LOCK)
        .execute(&mut *tx)
        .await?;
    let present: Vec<NaiveDate> = listed(&mut tx, parent)
        .await?
        .into_iter()
        .filter(|p| p.attached)
        .filter_map(|p| day_of(parent, &p.name))
        .collect();
    let mut made = 0;
    let mut day = first;
    while day <= last {
        if !present.contains(&day) {
            let name = quoted(&partition_name(parent, day));
            let next = day + Days::new(1);
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {name} (LIKE {p} INCLUDING DEFAULTS \
                 INCLUDING CONSTRAINTS INCLUDING STORAGE)",
                p = quoted(parent)
            ))
            .execute(&mut *tx)
            .await?;
            sqlx::query(&format!(
                "ALTER TABLE {p} ATTACH PARTITION {name} \
                 FOR VALUES FROM ('{day} 00:00:00+00') TO ('{next} 00:00:00+00')",
                p = quoted(parent)
            ))
            .execute(&mut *tx)
            .await?;
            made += 1;
        }
        day = day + Days::new(1);
    }
    tx.commit().await?;
    if made > 0 {
        tracing::info!(table = parent, made, through = %last, "history partitions made");
    }
    Ok(made)
}

/// A connection of its own, with the pool's options (its search_path put first) and
/// `statement_timeout`, lock waits bounded at 30 s.
async fn maintenance_connection(
    pool: &PgPool,
    statement_timeout: Duration,
) -> Result<PgConnection, StoreError> {
    let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
    super::migrate::put_schema_first(&mut conn).await?;
    let ms = statement_timeout.as_millis().max(1);
    simple(&mut conn, &format!("SET statement_timeout = {ms}")).await?;
    simple(&mut conn, "SET lock_timeout = '30s'").await?;
    Ok(conn)
}

/// Runs `sql` by the simple query protocol, outside any transaction block (`DETACH …
/// CONCURRENTLY` refuses to run in one).
async fn simple(conn: &mut PgConnection, sql: &str) -> Result<(), StoreError> {
    use sqlx::Executor;
    conn.execute(sql).await?;
    Ok(())
}

async fn drop_on(
    conn: &mut PgConnection,
    parent: &str,
    keep_days: u32,
) -> Result<Dropped, StoreError> {
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PARTITION_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Ok(Dropped {
            busy: true,
            ..Dropped::default()
        });
    }
    let today: NaiveDate = sqlx::query_scalar(TODAY_SQL).fetch_one(&mut *conn).await?;
    let cutoff = today - Days::new(u64::from(keep_days));
    let mut done = Dropped::default();
    let p = quoted(parent);
    // A pending detach first: while one is, no other detach of the parent may start.
    let all = listed(conn, parent).await?;
    for part in all.into_iter().filter(|p| p.pending) {
        let sql = format!(
            "ALTER TABLE {p} DETACH PARTITION {} FINALIZE",
            quoted(&part.name)
        );
        simple(conn, &sql).await?;
        tracing::info!(table = parent, partition = %part.name, "pending partition detach finished");
        done.finalized.push(part.name);
    }
    let all = listed(conn, parent).await?;
    for part in all {
        let Some(day) = day_of(parent, &part.name) else {
            continue;
        };
        if day >= cutoff {
            continue;
        }
        let started = Instant::now();
        let name = quoted(&part.name);
        if part.attached {
            let sql = format!("ALTER TABLE {p} DETACH PARTITION {name} CONCURRENTLY");
            simple(conn, &sql).await?;
        }
        let detached = started.elapsed();
        simple(conn, &format!("DROP TABLE {name}")).await?;
        let seconds = started.elapsed().as_secs_f64();
        done.timings.push(DropTiming {
            detach_micros: detached.as_micros() as u64,
            drop_micros: (started.elapsed() - detached).as_micros() as u64,
        });
        metrics::histogram!("dedup_retention_partition_seconds", "table" => parent.to_owned())
            .record(seconds);
        tracing::info!(table = parent, partition = %part.name, seconds, "expired history partition dropped");
        done.dropped.push(part.name);
    }
    Ok(done)
}

/// When the last "not kept" warning was logged (Unix seconds), so it is logged at most once a
/// minute whatever the rate of batches.
static LAST_NOT_KEPT_WARNING: AtomicI64 = AtomicI64::new(0);

/// Counts `n` history rows of `table` that an insert guard skipped (today's partition missing:
/// maintenance has failed for days), and warns at most once a minute.
pub(crate) fn history_not_kept(table: &'static str, n: u64) {
    if n == 0 {
        return;
    }
    metrics::counter!("dedup_history_not_kept_total", "table" => table).increment(n);
    let now = chrono::Utc::now().timestamp();
    let last = LAST_NOT_KEPT_WARNING.load(Ordering::Relaxed);
    if now - last >= 60
        && LAST_NOT_KEPT_WARNING
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            table,
            skipped = n,
            "today's history partition is missing: rows are not kept (the batch commits); \
             is retention running? `dedup-worker retention run` makes the partitions"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_are_the_parent_and_the_utc_day() {
        let day = NaiveDate::from_ymd_opt(2027, 1, 2).unwrap();
        assert_eq!(
            partition_name("event_bodies", day),
            "event_bodies_p20270102"
        );
        assert_eq!(day_of("event_bodies", "event_bodies_p20270102"), Some(day));
        assert_eq!(day_of("event_bodies", "event_bodies_p2027010"), None);
        assert_eq!(day_of("event_bodies", "outbox_attempts_p20270102"), None);
        assert_eq!(quoted("a\"b"), "\"a\"\"b\"");
    }
}
