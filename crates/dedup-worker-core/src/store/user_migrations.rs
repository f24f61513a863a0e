//! The application's own migrations, applied after the library's.
//!
//! A service built on dedup-worker keeps its tables (what its handler writes) in migrations of
//! its own, made with `sqlx::migrate!`. They are applied by [`Application::build`] (when
//! `database.migrate_on_start`) and by the `migrate` command, after the library's, in version
//! order, each once. The two histories are kept apart: the library's lives in schema
//! `dedup_worker` on PostgreSQL and in `_dedup_worker_migrations` on SQLite, so the
//! application's `_sqlx_migrations` holds only its own versions and its stock
//! `sqlx::migrate!().run(&pool)` keeps working beside ours.
//!
//! [`Application::build`]: crate::startup::Application::build

use sqlx::migrate::Migrator;

use super::{Backend, Store, StoreError};

/// Whose history a migration failure is in, as [`StoreError::Migrate`] names it.
pub(crate) const LIBRARY_HISTORY: &str = "dedup-worker's";
pub(crate) const APPLICATION_HISTORY: &str = "the application's";

/// The application's migrations, one set per store (their SQL usually differs). A set left out
/// is an error only when the service runs on that store.
///
/// ```no_run
/// use dedup_worker_core::store::Migrations;
/// use sqlx::migrate::Migrator;
///
/// static POSTGRES: Migrator = sqlx::migrate!("migrations/postgres");
/// static SQLITE: Migrator = sqlx::migrate!("migrations/sqlite");
///
/// let migrations = Migrations::new(&POSTGRES, &SQLITE);
/// # let _ = migrations;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrations {
    /// Applied when the store is PostgreSQL.
    pub postgres: Option<&'static Migrator>,
    /// Applied when the store is SQLite.
    pub sqlite: Option<&'static Migrator>,
}

impl Migrations {
    /// No migrations of the application's own (the stock binary).
    pub const NONE: Migrations = Migrations {
        postgres: None,
        sqlite: None,
    };

    pub const fn new(postgres: &'static Migrator, sqlite: &'static Migrator) -> Self {
        Migrations {
            postgres: Some(postgres),
            sqlite: Some(sqlite),
        }
    }

    /// For a service that runs only on PostgreSQL; starting it on SQLite is an error.
    pub const fn postgres_only(postgres: &'static Migrator) -> Self {
        Migrations {
            postgres: Some(postgres),
            sqlite: None,
        }
    }

    /// For a service that runs only on SQLite; starting it on PostgreSQL is an error.
    pub const fn sqlite_only(sqlite: &'static Migrator) -> Self {
        Migrations {
            postgres: None,
            sqlite: Some(sqlite),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.postgres.is_none() && self.sqlite.is_none()
    }

    /// The set for `backend`: `Ok(None)` when the application has no migrations at all.
    fn for_backend(&self, backend: Backend) -> Result<Option<&'static Migrator>, StoreError> {
        if self.is_empty() {
            return Ok(None);
        }
        match backend {
            Backend::Postgres => self.postgres,
            Backend::Sqlite => self.sqlite,
        }
        .map(Some)
        .ok_or(StoreError::NoMigrationsFor(backend.name()))
    }
}

impl Store {
    /// Applies the library's pending migrations, then the application's (`user`). Safe to run
    /// from several processes at once: each history is applied under a lock.
    pub async fn migrate_with(&self, user: &Migrations) -> Result<(), StoreError> {
        // Checked first, so a service started on the wrong store changes nothing.
        let user = user.for_backend(self.backend())?;
        self.migrate().await?;
        let Some(migrator) = user else {
            return Ok(());
        };
        // At the application's own search_path on PostgreSQL, where its tables and its
        // `_sqlx_migrations` live (see `run_user_migrator`).
        self.run_user_migrator(migrator)
            .await
            .map_err(|source| StoreError::Migrate {
                history: APPLICATION_HISTORY,
                source,
            })
    }
}
