//! The store's migrations, kept apart from an application's own.
//!
//! An application that embeds dedup-worker has tables and sqlx migrations of its own, in the same
//! database. sqlx's history table (`_sqlx_migrations`) refuses any applied version its migrator
//! does not know (`VersionMissing`), so an application's migrator cannot share the library's.
//! (The library's own two, the pipeline's and the Idempotency-Key layer's, do share one, each
//! run with `ignore_missing`: see `dedup_db::schema`.) Hence:
//! * PostgreSQL (`dedup_db::schema`): every library table and the library's sqlx history live in schema
//!   [`SCHEMA`]; the application's stay in its own schemas (`public` by default). The store's
//!   connections put [`SCHEMA`] first in their `search_path`, so the pipeline's unqualified SQL
//!   finds the library's tables and a handler's SQL still finds the application's.
//! * SQLite ([`sqlite`]): no schemas within one file (an attached file would break the one
//!   transaction a batch commits in), so the tables stay in `main` and the library's history goes
//!   into a table of its own, `_dedup_worker_migrations`, written by a small runner.
//!
//! Both upgrade an existing database (library tables in `public` and history in
//! `_sqlx_migrations`, as written by earlier versions) in place, keeping every row.

mod sqlite;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::PgPool;

use super::{Pool, Store, StoreError};

pub(super) use dedup_db::schema::put_schema_first;
pub use dedup_db::schema::{LayoutError, SCHEMA};

/// Applies the pipeline's pending PostgreSQL migrations on a connection of `pool`, in schema
/// [`SCHEMA`] (upgrading an earlier version's layout first; see `dedup_db::schema`, which the
/// Idempotency-Key layer's migrations share).
pub async fn migrate_postgres(pool: &PgPool) -> Result<(), StoreError> {
    dedup_db::schema::migrate(pool, sqlx::migrate!("migrations/postgres"))
        .await
        .map_err(StoreError::from)
}

impl Store {
    /// Applies the library's pending migrations, first moving an earlier version's layout into
    /// the current one (see the module documentation). On PostgreSQL they run on a connection
    /// of their own with the statement and transaction timeouts lifted: a migration that
    /// rewrites a large table may rightly take longer than any pipeline statement. Several
    /// processes may call it at once: they take turns.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.0 {
            Pool::Postgres(pool) => {
                migrate_postgres(pool).await?;
                // The history tables' days ahead (their migration made only the days it ran on).
                self.partitions().ensure_all().await.map(drop)
            }
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
            Pool::Postgres(pool) => {
                dedup_db::schema::run_application_migrator(pool, migrator).await
            }
            Pool::Sqlite(pool) => migrator.run(pool).await,
        }
    }
}
