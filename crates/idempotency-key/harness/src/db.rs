//! [`TestDb`]: a PostgreSQL database that exists for one test (`dw_test_<uuid>` on the server
//! `DEDUP_TEST_POSTGRES` names, the same variable and default as dedup-worker's test kit).

use sqlx::{Connection, PgConnection};

/// The variable naming the PostgreSQL server the databases are created on; its role must be
/// allowed to create and drop databases.
const POSTGRES_VAR: &str = "DEDUP_TEST_POSTGRES";

/// The server used when [`POSTGRES_VAR`] is not set: a local one with trust authentication.
const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn pg_admin_url() -> String {
    std::env::var(POSTGRES_VAR).unwrap_or_else(|_| DEFAULT_POSTGRES.into())
}

/// A database removed by [`TestDb::remove`] or, failing that, when dropped (also when the test
/// panics).
#[derive(Debug)]
pub struct TestDb {
    /// The database's URL.
    pub url: String,
    /// The database to drop; `None` once dropped.
    name: Option<String>,
}

impl TestDb {
    /// Creates an empty database; panics if the server cannot be reached or refuses, since a
    /// test cannot go on without it.
    pub async fn new() -> Self {
        let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
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
            name: Some(name),
        }
    }

    /// Removes the database now, on the test's runtime. Close the pools on it first: it is
    /// dropped `WITH (FORCE)`.
    pub async fn remove(mut self) {
        if let Some(name) = self.name.take() {
            drop_database(&name).await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            // The test's runtime may be unwinding: a thread with a runtime of its own.
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
