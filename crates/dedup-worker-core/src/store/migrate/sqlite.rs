//! SQLite: the library's history in `_dedup_worker_migrations`, written by a runner of our own.
//!
//! sqlx 0.8.6 hard-codes its history table's name (`_sqlx_migrations`), and SQLite has no
//! schema to put a second one in, so the library cannot use sqlx's runner without sharing
//! the application's history. This runner reads the same `Migrator` (`sqlx::migrate!`: the
//! files and checksums are unchanged), keeps sqlx's table shape under another name, and
//! validates as sqlx does, with the same `MigrateError` variants:
//! `Dirty` (a row with `success = false`), `VersionMissing` (an applied version the library
//! no longer has) and `VersionMismatch` (an applied migration whose file changed).
//!
//! Why not sqlx's own runner (issue 38, checked against sqlx 0.9.1, released 2026-11-17):
//! * sqlx 0.9 can name the table (`Migrator::dangerous_set_table_name`, or `[migrate]
//!   table-name` in `sqlx.toml` with the `sqlx-toml` feature), and creates it in the shape
//!   above, so `_dedup_worker_migrations` would be read as it is. 0.8.x (0.8.6 is the last)
//!   cannot.
//! * Its SQLite `Migrate` (sqlx-sqlite 0.9.1, as 0.8.6) has a no-op `lock` and applies each
//!   migration in a deferred `BEGIN`: two processes starting at once (which this runner
//!   serves, `layout_upgrade::two_processes_migrating_a_fresh_database_at_once_sqlite`) would
//!   both apply the first migration and one would fail. Keeping that means calling
//!   `run_direct` on a connection already in `BEGIN IMMEDIATE` (sqlx nests its transactions
//!   as savepoints): all migrations under one write lock.
//! * The first start after an upgrade moves the library's rows out of `_sqlx_migrations`
//!   ([`adopt_history`]); that stays ours either way.
//! * 0.9 is a breaking upgrade for the whole workspace: every `query*()` takes
//!   `impl SqlSafeStr` (about 80 call sites build their SQL at run time across the root crate,
//!   `dedup-db`, `idempotency-key`, the tests and examples, each to wrap in `AssertSqlSafe`),
//!   `RawSql` gains a database parameter, `SqliteValue` is no longer `Sync`, and the `Migrate`
//!   trait changed; `libsqlite3-sys` links `sqlite3` once per build, so every crate moves
//!   together (four manifests). Not worth it for this file alone; when the workspace moves to
//!   0.9 for its own reasons, this file becomes `adopt_history` plus that `run_direct` call.

use std::collections::BTreeMap;
use std::time::Instant;

use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::SqlitePool;

use super::LayoutError;
use crate::store::sqlite::begin_immediate;
use crate::store::StoreError;

static LIBRARY: Migrator = sqlx::migrate!("migrations/sqlite");

/// sqlx's own history table (sqlx-sqlite 0.8.6, `ensure_migrations_table`) under our name.
const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS _dedup_worker_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
)";

const COLUMNS: &str = "version, description, installed_on, success, checksum, execution_time";

/// Applies the library's pending SQLite migrations.
pub(super) async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    run(pool, &LIBRARY).await
}

async fn run(pool: &SqlitePool, migrator: &Migrator) -> Result<(), StoreError> {
    adopt_history(pool, migrator).await?;
    let applied = applied(pool).await?;
    validate(&applied, migrator)?;
    for migration in up_migrations(migrator) {
        if !applied.contains_key(&migration.version) {
            apply(pool, migration).await?;
        }
    }
    Ok(())
}

fn up_migrations(migrator: &Migrator) -> impl Iterator<Item = &Migration> {
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
}

/// Database errors outside a migration's own statements, as sqlx's runner reports them.
fn execute(e: sqlx::Error) -> StoreError {
    StoreError::from(MigrateError::Execute(e))
}

/// Creates the history table and, the first time, moves the library's rows out of
/// `_sqlx_migrations` (where earlier versions kept them) into it: one `BEGIN IMMEDIATE`
/// transaction, so a second process starting at the same time waits and then finds the move
/// done. The application's rows stay in `_sqlx_migrations` for its own migrator.
async fn adopt_history(pool: &SqlitePool, migrator: &Migrator) -> Result<(), StoreError> {
    let versions = migrator
        .iter()
        .map(|m| m.version.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut tx = begin_immediate(pool).await.map_err(execute)?;
    sqlx::raw_sql(CREATE_HISTORY)
        .execute(&mut *tx)
        .await
        .map_err(execute)?;
    let sqlx_history: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(execute)?;
    if sqlx_history == 0 || versions.is_empty() {
        return tx.commit().await.map_err(execute);
    }
    // The versions are integers of the library's own migrator, never input.
    let old: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM _sqlx_migrations WHERE version IN ({versions})"
    ))
    .fetch_one(&mut *tx)
    .await
    .map_err(execute)?;
    if old == 0 {
        return tx.commit().await.map_err(execute);
    }
    let new: i64 = sqlx::query_scalar("SELECT count(*) FROM _dedup_worker_migrations")
        .fetch_one(&mut *tx)
        .await
        .map_err(execute)?;
    if new > 0 {
        return Err(LayoutError::BothLayouts {
            old: "_sqlx_migrations",
            new: "_dedup_worker_migrations",
        }
        .into());
    }
    sqlx::raw_sql(&format!(
        "INSERT INTO _dedup_worker_migrations ({COLUMNS})
         SELECT {COLUMNS} FROM _sqlx_migrations WHERE version IN ({versions});
         DELETE FROM _sqlx_migrations WHERE version IN ({versions});"
    ))
    .execute(&mut *tx)
    .await
    .map_err(execute)?;
    tx.commit().await.map_err(execute)?;
    tracing::info!("moved dedup-worker's migration history into _dedup_worker_migrations");
    Ok(())
}

/// The recorded migrations by version: whether each completed, and the checksum of its file.
type History = BTreeMap<i64, (bool, Vec<u8>)>;

async fn applied(pool: &SqlitePool) -> Result<History, StoreError> {
    let rows: Vec<(i64, bool, Vec<u8>)> =
        sqlx::query_as("SELECT version, success, checksum FROM _dedup_worker_migrations")
            .fetch_all(pool)
            .await
            .map_err(execute)?;
    Ok(rows
        .into_iter()
        .map(|(version, success, checksum)| (version, (success, checksum)))
        .collect())
}

/// sqlx's checks, in sqlx's order (and by version, as sqlx reads them), before anything is
/// applied: a partly applied migration, an applied one the library no longer has, then one
/// whose file changed since.
fn validate(applied: &History, migrator: &Migrator) -> Result<(), MigrateError> {
    if let Some((dirty, _)) = applied.iter().find(|(_, (success, _))| !success) {
        return Err(MigrateError::Dirty(*dirty));
    }
    if let Some(missing) = applied.keys().find(|v| !migrator.version_exists(**v)) {
        return Err(MigrateError::VersionMissing(*missing));
    }
    for migration in up_migrations(migrator) {
        let recorded = applied.get(&migration.version);
        if recorded.is_some_and(|(_, checksum)| **checksum != *migration.checksum) {
            return Err(MigrateError::VersionMismatch(migration.version));
        }
    }
    Ok(())
}

/// Applies one migration and records it, in one `BEGIN IMMEDIATE` transaction (SQLite's DDL is
/// transactional: a failure leaves neither). Another process may have applied it since this
/// one read the history, so it is read again under the write lock first.
async fn apply(pool: &SqlitePool, migration: &Migration) -> Result<(), StoreError> {
    let mut tx = begin_immediate(pool).await.map_err(execute)?;
    let recorded: Option<(bool, Vec<u8>)> =
        sqlx::query_as("SELECT success, checksum FROM _dedup_worker_migrations WHERE version = ?1")
            .bind(migration.version)
            .fetch_optional(&mut *tx)
            .await
            .map_err(execute)?;
    match recorded {
        None => {}
        Some((false, _)) => return Err(MigrateError::Dirty(migration.version).into()),
        Some((true, checksum)) if *checksum == *migration.checksum => return Ok(()),
        Some(_) => return Err(MigrateError::VersionMismatch(migration.version).into()),
    }
    // sqlx's SQLite runner also ignores `-- no-transaction` (no SQLite statement needs it).
    let start = Instant::now();
    sqlx::raw_sql(&migration.sql)
        .execute(&mut *tx)
        .await
        .map_err(|e| MigrateError::ExecuteMigration(e, migration.version))?;
    let elapsed = i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO _dedup_worker_migrations
                (version, description, success, checksum, execution_time)
         VALUES (?1, ?2, TRUE, ?3, ?4)",
    )
    .bind(migration.version)
    .bind(&*migration.description)
    .bind(&*migration.checksum)
    .bind(elapsed)
    .execute(&mut *tx)
    .await
    .map_err(execute)?;
    tx.commit().await.map_err(execute)
}
