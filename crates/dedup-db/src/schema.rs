//! PostgreSQL: both products' tables and their one sqlx history in schema [`SCHEMA`].
//!
//! sqlx's migrator names its history `_sqlx_migrations`, unqualified, so it resolves through
//! `search_path`: run with `search_path = dedup_worker`, it keeps `dedup_worker._sqlx_migrations`
//! and creates every table of the (unchanged, checksummed) migration files in that schema.
//! An application's own migrator, run with its own `search_path`, keeps `public._sqlx_migrations`.
//!
//! Two migrators share that history: the pipeline's (crate `dedup-worker`) and the
//! Idempotency-Key layer's (crate `idempotency-key`), each applying only its own files.
//! [`migrate`] runs either with `ignore_missing`, so each finds the other's rows applied and
//! unknown to it without refusing them (sqlx's `VersionMissing`); the versions of the two sets
//! never collide (a unit test below reads both folders), and each still refuses a changed file
//! of its own (`VersionMismatch`). The price, on PostgreSQL only: an older build of either
//! product no longer refuses to start on a database a newer one migrated (that refusal was
//! sqlx's `VersionMissing`), and a migration file deleted from a product goes unnoticed.
//!
//! Databases written by earlier versions hold the library's tables in `public` and its history
//! rows in `public._sqlx_migrations` (beside the application's, if it used the same history).
//! `upgrade_layout` moves both products' tables and rows at once, in one transaction, before
//! the first migrator of either runs.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, PgConnection, PgPool};

/// Why the library's tables could not be moved into, or found in, their place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The database records the library's migrations in both places: the old history (written
    /// before the split) and the new one. Something ran the old migrations again after the
    /// upgrade, or the new ones before it; which tables hold the rows needs a person to decide.
    #[error(
        "dedup-worker's migrations are recorded both in {old} and in {new}: \
         the database holds two layouts; keep the one in use and delete the other's history rows"
    )]
    BothLayouts {
        old: &'static str,
        new: &'static str,
    },
    /// Moving the library's tables into schema `dedup_worker` failed, most likely on a lock a
    /// process of the previous version holds (the move waits at most `lock_timeout`, 10 s).
    /// Nothing was moved: the move is one transaction.
    #[error(
        "cannot move dedup-worker's tables from public into schema dedup_worker \
         (a lock wait that timed out: stop every process of the previous version, then migrate again)"
    )]
    Move {
        #[source]
        source: sqlx::Error,
    },
    /// An index of schema `dedup_worker` left invalid by an interrupted concurrent build could
    /// not be rebuilt (or its leftover dropped); the migration stops rather than record an
    /// index that does nothing.
    #[error("cannot rebuild the invalid index dedup_worker.{index}")]
    InvalidIndex {
        index: String,
        #[source]
        source: sqlx::Error,
    },
}

/// Why [`migrate`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The migrator failed (the cause says which migration and why).
    #[error("applying dedup-worker's migrations failed")]
    Migrate(#[from] MigrateError),
    /// The tables could not be put in their place.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// Lifts the statement and idle-in-transaction timeouts on one session (0: no limit): a
/// migration that rewrites a large table may rightly take longer than any pipeline statement.
pub const LIFT_TIMEOUTS: &str =
    "SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0";

/// The schema of the library's tables and history on PostgreSQL.
pub const SCHEMA: &str = "dedup_worker";

/// Every migration version either product had released when they became two crates. An earlier
/// layout's history (`public._sqlx_migrations`) can hold only these; later versions are only
/// ever applied in [`SCHEMA`].
const OLD_LAYOUT_VERSIONS: &[i64] = &[
    20261129000001,
    20261129000002, // idempotency-key
    20261129000003,
    20261129000004,
    20261201000001,
    20261201000002, // idempotency-key
    20261201000003,
    20261202000001,
    20261210000001,
    20261210000002,
    20261220000001,
];

/// The advisory lock the library's migrations run under (layout move and migrator together),
/// so two processes migrating at once take turns. Not sqlx's own key (derived from the
/// database name), which the application's migrator takes too. ASCII "dw_layou".
const LAYOUT_LOCK: i64 = 0x6477_5f6c_6179_6f75;

/// How often a process waiting for `LAYOUT_LOCK` asks again.
const LOCK_POLL: Duration = Duration::from_millis(100);

/// Every relation the library's migrations ever created in `public`, as earlier versions left
/// them (a name absent from a database is skipped: an older database lacks the later ones).
/// `SET SCHEMA` moves a table with its indexes, constraints and owned sequences (BIGSERIAL),
/// and keeps its OID, so the view `processed_events` stays valid; partitions are tables of
/// their own and move one by one.
const LIBRARY_RELATIONS: &[&str] = &[
    "processed_events",
    "processed_events_legacy",
    "processed_events_0",
    "processed_events_1",
    "processed_events_2",
    "processed_events_3",
    "processed_events_4",
    "dedup_generations",
    "duplicate_deliveries",
    "duplicate_deliveries_0",
    "duplicate_deliveries_1",
    "duplicate_deliveries_2",
    "duplicate_deliveries_3",
    "duplicate_deliveries_4",
    "outbox",
    "dead_letters",
    "dead_letter_redrives",
    "queue_messages",
    "event_ledger",
    "idempotency_keys",
    "object_versions",
    "stale_events",
];

/// Left in `public` after an upgrade, where the library's first table was: a process of the
/// previous version that starts with `migrate_on_start` sees no applied migration in
/// `public._sqlx_migrations` and re-runs the first one, whose `CREATE TABLE processed_events`
/// (not `IF NOT EXISTS`) then fails and rolls back, instead of creating an empty second
/// pipeline in `public` that would forget every processed id.
const SENTINEL: &str = "CREATE VIEW public.processed_events AS \
     SELECT 'dedup-worker keeps its tables in schema dedup_worker; drop this view once no older \
     version can start'::text AS notice";

/// The `after_connect` statement of the store's pools: [`SCHEMA`] first, then whatever
/// `search_path` the role, database or URL gave the session. The pipeline's SQL is unqualified
/// (and shared with SQLite, which has no schemas), so it finds the library's tables; a
/// handler's `public.…` and unqualified names of the application's own tables still resolve.
const PUT_SCHEMA_FIRST: &str = "SELECT set_config('search_path', \
     concat_ws(', ', 'dedup_worker', nullif(current_setting('search_path'), '')), false)";

/// Runs `PUT_SCHEMA_FIRST` on a new pool connection.
pub async fn put_schema_first(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(PUT_SCHEMA_FIRST).execute(conn).await.map(drop)
}

/// Applies `migrator`'s pending migrations (one product's own: `sqlx::migrate!(…)`; run with
/// `ignore_missing`, see the module documentation) in
/// [`SCHEMA`] on a connection of `pool` (any pool: the pipeline store's, or an application's
/// that runs the Idempotency-Key layer), upgrading an earlier version's layout first. Several
/// processes may call it at once: they take turns.
pub async fn migrate(pool: &PgPool, mut migrator: Migrator) -> Result<(), SchemaError> {
    migrator.set_ignore_missing(true);
    // Taken from the pool (so within its acquire timeout) and detached: a session with the
    // limits lifted and its search_path changed must not serve anything afterwards. Dropping it
    // closes the socket, which also frees the advisory lock if a step failed while holding it.
    let mut conn = pool.acquire().await?.detach();
    let migrated = migrate_on(&mut conn, &migrator).await;
    drop(conn);
    migrated
}

async fn migrate_on(conn: &mut PgConnection, migrator: &Migrator) -> Result<(), SchemaError> {
    sqlx::raw_sql(LIFT_TIMEOUTS).execute(&mut *conn).await?;
    lock_layout(conn).await?;
    upgrade_layout(conn).await?;
    create_schema(conn).await?;
    sqlx::raw_sql("SET search_path TO dedup_worker")
        .execute(&mut *conn)
        .await?;
    // Before: so a migration's `CREATE INDEX CONCURRENTLY IF NOT EXISTS` finds the index
    // valid, not skipped over while invalid and recorded as applied. After: for one recorded
    // so by an earlier version.
    repair_invalid_indexes(conn).await?;
    migrator.run(&mut *conn).await?;
    repair_invalid_indexes(conn).await?;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LAYOUT_LOCK)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Takes `LAYOUT_LOCK` by asking until it is free, not with a blocking `pg_advisory_lock`: a
/// session blocked in a statement holds a snapshot, and the holder's `CREATE INDEX
/// CONCURRENTLY` (20261210000001) waits for every older snapshot to go: both would wait for
/// each other until the deadlock detector cancels one.
async fn lock_layout(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mut waiting = false;
    loop {
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LAYOUT_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if taken {
            return Ok(());
        }
        if !waiting {
            tracing::info!("waiting for another process's migration of the dedup-worker schema");
            waiting = true;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// Rebuilds the invalid indexes of [`SCHEMA`] (under `LAYOUT_LOCK`, with the timeouts lifted).
///
/// A `CREATE INDEX CONCURRENTLY` that is cancelled or killed mid-build (a deploy's SIGKILL, a
/// statement or lock timeout, an operator's `pg_cancel_backend`) leaves its index in the
/// catalog marked invalid: never used by queries, yet present, so the migration's
/// `IF NOT EXISTS` skips it on the next run, and sqlx records the migration as applied with an
/// index that does nothing. Such an index is rebuilt with `REINDEX INDEX CONCURRENTLY` (the one
/// form PostgreSQL allows on an invalid index; it blocks no writer). What an interrupted
/// `REINDEX CONCURRENTLY` leaves (`…_ccnew`, `…_ccold`, invalid copies beside the index) is
/// dropped instead, as PostgreSQL's documentation advises. Each repair is logged.
async fn repair_invalid_indexes(conn: &mut PgConnection) -> Result<(), SchemaError> {
    let mut invalid: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indexrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'dedup_worker' AND NOT i.indisvalid \
          ORDER BY c.relname",
    )
    .fetch_all(&mut *conn)
    .await?;
    // Leftovers first: a REINDEX of their index would otherwise leave them beside it.
    invalid.sort_by_key(|name| !is_reindex_leftover(name));
    for index in invalid {
        let quoted = format!("dedup_worker.\"{}\"", index.replace('"', "\"\""));
        let (statement, done) = if is_reindex_leftover(&index) {
            (
                format!("DROP INDEX CONCURRENTLY IF EXISTS {quoted}"),
                "dropped what an interrupted REINDEX CONCURRENTLY left",
            )
        } else {
            (
                format!("REINDEX INDEX CONCURRENTLY {quoted}"),
                "rebuilt an invalid index (its concurrent build had been interrupted)",
            )
        };
        sqlx::raw_sql(&statement)
            .execute(&mut *conn)
            .await
            .map_err(|source| LayoutError::InvalidIndex {
                index: index.clone(),
                source,
            })?;
        tracing::warn!(index = %format!("dedup_worker.{index}"), "{done}");
    }
    Ok(())
}

/// Whether `index` is the copy an interrupted `REINDEX CONCURRENTLY` left (`<name>_ccnew`,
/// `<name>_ccold`, with a digit when the name was taken).
fn is_reindex_leftover(index: &str) -> bool {
    let stem = index.trim_end_matches(|c: char| c.is_ascii_digit());
    stem.ends_with("_ccnew") || stem.ends_with("_ccold")
}

/// Creates [`SCHEMA`] unless it exists: a role without CREATE on the database can then use a
/// schema an administrator created for it (`CREATE SCHEMA dedup_worker AUTHORIZATION role`),
/// where `CREATE SCHEMA IF NOT EXISTS` would still be refused.
async fn create_schema(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let missing: bool = sqlx::query_scalar("SELECT to_regnamespace('dedup_worker') IS NULL")
        .fetch_one(&mut *conn)
        .await?;
    if missing {
        sqlx::raw_sql("CREATE SCHEMA IF NOT EXISTS dedup_worker")
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Moves an earlier version's layout (library tables in `public`, history rows in
/// `public._sqlx_migrations`) into [`SCHEMA`], in one transaction: all of it or nothing.
/// A no-op when `public._sqlx_migrations` holds no library version (a fresh database, or one
/// already moved). The application's history rows and tables stay where they are.
async fn upgrade_layout(conn: &mut PgConnection) -> Result<(), SchemaError> {
    let versions = OLD_LAYOUT_VERSIONS;
    let mut tx = conn.begin().await?;
    let old = library_rows(&mut tx, "public._sqlx_migrations", versions).await?;
    if old == 0 {
        return Ok(()); // nothing written: the transaction rolls back on drop
    }
    if library_rows(&mut tx, "dedup_worker._sqlx_migrations", versions).await? > 0 {
        return Err(LayoutError::BothLayouts {
            old: "public._sqlx_migrations",
            new: "dedup_worker._sqlx_migrations",
        }
        .into());
    }
    let moved = move_into_schema(&mut tx, versions).await;
    moved.map_err(|source| LayoutError::Move { source })?;
    tx.commit().await?;
    tracing::info!("moved dedup-worker's tables and migration history into schema dedup_worker");
    Ok(())
}

/// Rows of `table` (if it exists) whose version is one of the library's.
async fn library_rows(
    conn: &mut PgConnection,
    table: &str,
    versions: &[i64],
) -> Result<i64, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    // `table` is one of two constants of this file, never input.
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE version = ANY($1)"
    ))
    .bind(versions)
    .fetch_one(&mut *conn)
    .await
}

/// The move itself, inside the caller's transaction.
async fn move_into_schema(conn: &mut PgConnection, versions: &[i64]) -> Result<(), sqlx::Error> {
    // Each ALTER takes an ACCESS EXCLUSIVE lock; a process of the previous version still at
    // work holds locks that would make it wait without end. Give up instead, with a message
    // that says what to do (the caller's LayoutError::Move).
    sqlx::raw_sql("SET LOCAL lock_timeout = '10s'")
        .execute(&mut *conn)
        .await?;
    create_schema(conn).await?;
    for name in LIBRARY_RELATIONS {
        let kind: Option<String> = sqlx::query_scalar(
            "SELECT c.relkind::text FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'public' AND c.relname = $1",
        )
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
        let statement = match kind.as_deref() {
            Some("r" | "p") => "TABLE",
            Some("v") => "VIEW",
            _ => continue, // absent (an older database), or not ours (a sequence, an index)
        };
        // `name` comes from LIBRARY_RELATIONS above, never from input.
        sqlx::raw_sql(&format!(
            "ALTER {statement} public.{name} SET SCHEMA dedup_worker"
        ))
        .execute(&mut *conn)
        .await?;
    }
    // The library's history rows go with its tables, checksums and all, so sqlx then finds
    // them applied and unchanged; the application's rows stay in public for its own migrator.
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS dedup_worker._sqlx_migrations \
             (LIKE public._sqlx_migrations INCLUDING ALL)",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO dedup_worker._sqlx_migrations \
                (version, description, installed_on, success, checksum, execution_time) \
         SELECT version, description, installed_on, success, checksum, execution_time \
           FROM public._sqlx_migrations WHERE version = ANY($1)",
    )
    .bind(versions)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM public._sqlx_migrations WHERE version = ANY($1)")
        .bind(versions)
        .execute(&mut *conn)
        .await?;
    let free: bool = sqlx::query_scalar("SELECT to_regclass('public.processed_events') IS NULL")
        .fetch_one(&mut *conn)
        .await?;
    if free {
        sqlx::raw_sql(SENTINEL).execute(&mut *conn).await?;
    }
    Ok(())
}

/// Runs an application's migrator on a connection of `pool` with the session's own
/// `search_path` back (`RESET`: the role's, database's or URL's default, without the store's
/// `PUT_SCHEMA_FIRST`), so its `_sqlx_migrations` and its tables are the application's
/// (`public` by default), never the library's. Detached, like [`migrate`]'s, with
/// the timeouts lifted for the same reason. Under `LAYOUT_LOCK` too, taken by asking: sqlx's
/// own lock blocks, so processes running the application's migrations at once would deadlock
/// on one of its `CREATE INDEX CONCURRENTLY` (see `lock_layout`); with ours taken first,
/// sqlx's never waits for another process of this library.
pub async fn run_application_migrator(
    pool: &PgPool,
    migrator: &Migrator,
) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?.detach();
    sqlx::raw_sql(LIFT_TIMEOUTS).execute(&mut conn).await?;
    sqlx::raw_sql("RESET search_path")
        .execute(&mut conn)
        .await?;
    lock_layout(&mut conn).await?;
    migrator.run(&mut conn).await?;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LAYOUT_LOCK)
        .execute(&mut conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{is_reindex_leftover, OLD_LAYOUT_VERSIONS};

    /// The versions of one product's migration folder, from the file names (`<version>_….sql`).
    fn versions_in(folder: &str) -> Vec<i64> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
        let mut versions: Vec<i64> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                let name = entry.expect("entry").file_name();
                let name = name.to_string_lossy();
                name.split('_')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("a version")
            })
            .collect();
        versions.sort_unstable();
        versions
    }

    /// The two products share one history, each migrator ignoring the other's rows: a version
    /// in both folders would be one product's migration recorded, and refused (checksum), as
    /// the other's. And the upgrade moves every version released in the old layout.
    #[test]
    fn the_products_versions_are_apart_and_the_old_layout_knows_them() {
        let pipeline = versions_in("../dedup-worker-core/migrations/postgres");
        let layer = versions_in("../idempotency-key/migrations/postgres");
        let shared: Vec<&i64> = pipeline.iter().filter(|v| layer.contains(v)).collect();
        assert!(shared.is_empty(), "versions in both products: {shared:?}");
        let last_old = *OLD_LAYOUT_VERSIONS.last().expect("versions");
        let mut released: Vec<i64> = pipeline
            .into_iter()
            .chain(layer)
            .filter(|v| *v <= last_old)
            .collect();
        released.sort_unstable();
        assert_eq!(released, OLD_LAYOUT_VERSIONS);
    }

    #[test]
    fn only_reindex_copies_count_as_leftovers() {
        for leftover in [
            "outbox_failed_ccnew",
            "outbox_failed_ccnew1",
            "x_ccold",
            "x_ccold12",
        ] {
            assert!(is_reindex_leftover(leftover), "{leftover}");
        }
        for index in [
            "outbox_failed",
            "ccnew",
            "outbox_pkey",
            "x_ccnewer",
            "x_cc1",
        ] {
            assert!(!is_reindex_leftover(index), "{index}");
        }
    }
}
