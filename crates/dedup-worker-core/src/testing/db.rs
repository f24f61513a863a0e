//! [`TestDb`]: a database that exists for one test, on either store.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::store::{Backend, Migrations, Store};

/// The variable naming the PostgreSQL server [`TestDb`] creates its databases on.
pub const POSTGRES_VAR: &str = "DEDUP_TEST_POSTGRES";

/// The PostgreSQL server [`TestDb`] uses when [`POSTGRES_VAR`] is not set: a local one with
/// trust authentication.
pub const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The PostgreSQL server for tests: `DEDUP_TEST_POSTGRES`, else [`DEFAULT_POSTGRES`]. Its role
/// must be allowed to create and drop databases.
pub fn pg_admin_url() -> String {
    std::env::var(POSTGRES_VAR).unwrap_or_else(|_| DEFAULT_POSTGRES.into())
}

/// A database that exists for one test and is removed after it: a PostgreSQL database
/// `dw_test_<uuid>` on [`pg_admin_url`]'s server, or an SQLite file in a directory of its own
/// under the system's temporary directory.
///
/// It is removed by [`TestDb::remove`] or, failing that, when dropped (also when the test
/// panics).
///
/// ```no_run
/// # async fn example() {
/// use dedup_worker_core::testing::{Backend, TestDb};
///
/// let db = TestDb::new(Backend::Sqlite).await;
/// let store = db.store().await; // connected, the library's migrations applied
/// # drop(store);
/// db.remove().await;
/// # }
/// ```
#[derive(Debug)]
pub struct TestDb {
    /// The database's URL, as `database_url` takes it.
    pub url: String,
    /// The PostgreSQL database to drop.
    pg_name: Option<String>,
    /// The SQLite database's directory, to delete.
    dir: Option<PathBuf>,
}

impl TestDb {
    /// Creates an empty database on `backend`.
    ///
    /// # Panics
    ///
    /// When the PostgreSQL server cannot be reached or refuses `CREATE DATABASE`, or the
    /// temporary directory cannot be created: a test cannot go on without its database.
    pub async fn new(backend: Backend) -> Self {
        let unique = uuid::Uuid::new_v4().simple();
        match backend {
            Backend::Postgres => {
                let name = format!("dw_test_{unique}");
                let base = pg_admin_url();
                let mut admin = PgConnection::connect(&base)
                    .await
                    .unwrap_or_else(|e| panic!("connect to PostgreSQL ({POSTGRES_VAR}): {e}"));
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .expect("create the test database");
                admin.close().await.ok();
                let url = match base.rsplit_once('/') {
                    Some((prefix, _)) => format!("{prefix}/{name}"),
                    None => panic!("{POSTGRES_VAR} is not a postgres:// URL: {base}"),
                };
                TestDb {
                    url,
                    pg_name: Some(name),
                    dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("dedup-worker-test-{unique}"));
                std::fs::create_dir_all(&dir).expect("create the test database's directory");
                let url = format!("sqlite://{}", dir.join("dedup.db").display());
                TestDb {
                    url,
                    pg_name: None,
                    dir: Some(dir),
                }
            }
        }
    }

    /// A store on this database, connected (8 connections, 5 s to acquire one) and with the
    /// library's migrations applied.
    pub async fn store(&self) -> Store {
        self.store_with(&Migrations::NONE).await
    }

    /// As [`TestDb::store`], with the application's `migrations` applied after the library's,
    /// as the `migrate` command and `Application::build` apply them.
    pub async fn store_with(&self, migrations: &Migrations) -> Store {
        let store = Store::connect_url(&self.url, 8, Duration::from_secs(5))
            .await
            .expect("connect the store");
        store.migrate_with(migrations).await.expect("migrate");
        store
    }

    /// Removes the database now, on the test's runtime (dropping does it from a thread of its
    /// own). Close the stores on it first: a PostgreSQL database is dropped `WITH (FORCE)`.
    pub async fn remove(mut self) {
        if let Some(name) = self.pg_name.take() {
            drop_database(&name).await;
        }
        self.remove_dir();
    }

    fn remove_dir(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        self.remove_dir();
        if let Some(name) = self.pg_name.take() {
            // Drop runs outside any runtime guarantee (the test's may be unwinding): use a
            // thread with its own runtime.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(drop_database(&name));
                Some(())
            })
            .join();
        }
    }
}

async fn drop_database(name: &str) {
    if let Ok(mut admin) = PgConnection::connect(&pg_admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
    }
}
