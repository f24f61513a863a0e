//! The store's migrations, kept apart from an application's own.
//!
//! An application that embeds dedup-worker has tables and sqlx migrations of its own, in the same
//! database. sqlx's history table (`_sqlx_migrations`) refuses any applied version its migrator
//! does not know (`VersionMissing`), so two migrators cannot share one. Hence:
//! * PostgreSQL ([`postgres`]): every library table and the library's sqlx history live in schema
//!   [`SCHEMA`]; the application's stay in its own schemas (`public` by default). The store's
//!   connections put [`SCHEMA`] first in their `search_path`, so the pipeline's unqualified SQL
//!   finds the library's tables and a handler's SQL still finds the application's.
//! * SQLite ([`sqlite`]): no schemas within one file (an attached file would break the one
//!   transaction a batch commits in), so the tables stay in `main` and the library's history goes
//!   into a table of its own, `_dedup_worker_migrations`, written by a small runner.
//!
//! Both upgrade an existing database (library tables in `public` and history in
//! `_sqlx_migrations`, as written by earlier versions) in place, keeping every row.

mod postgres;
mod sqlite;

use sqlx::migrate::{MigrateError, Migrator};

use super::{Pool, Store, StoreError};

pub(super) use postgres::put_schema_first;
pub(crate) use postgres::run_user_postgres;
pub use postgres::{migrate_postgres, SCHEMA};

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

impl Store {
    /// Applies the library's pending migrations, first moving an earlier version's layout into
    /// the current one (see the module documentation). On PostgreSQL they run on a connection
    /// of their own with the statement and transaction timeouts lifted: a migration that
    /// rewrites a large table may rightly take longer than any pipeline statement. Several
    /// processes may call it at once: they take turns.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.0 {
            Pool::Postgres(pool) => migrate_postgres(pool).await,
            Pool::Sqlite(pool) => sqlite::migrate(pool).await,
        }
    }

    /// Runs an application's own sqlx migrator on this store's database, with sqlx's own
    /// history (`_sqlx_migrations`) apart from the library's. On PostgreSQL it runs on a
    /// connection with the application's `search_path` (the role's, database's or URL's
    /// default, without [`SCHEMA`] in front), so both its tables and its history land where a
    /// plain `migrator.run(&pool)` on the application's own pool puts them (`public` by
    /// default). A `migrator.run(store.postgres_pool())` would not: the store's connections
    /// resolve and create unqualified names in [`SCHEMA`] first.
    pub async fn run_user_migrator(&self, migrator: &Migrator) -> Result<(), MigrateError> {
        match &self.0 {
            Pool::Postgres(pool) => run_user_postgres(pool, migrator).await,
            Pool::Sqlite(pool) => migrator.run(pool).await,
        }
    }
}
