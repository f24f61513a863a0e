//! An application's own migrations beside the library's (issue 16): applied by
//! `Application::build` on every start and by `migrate`, in order and once each, with the two
//! histories apart, so the application's stock `sqlx::migrate!().run(&pool)` keeps working
//! beside ours; a changed migration is reported once, naming whose history it is in; a handler
//! or a migration set for the other store is refused before anything changes.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::startup::{Application, Service};
use dedup_worker_core::store::{Backend as StoreBackend, DbTx, Migrations, Store, StoreError};
use sqlx::migrate::Migrator;

use crate::helpers::{test_settings, Backend, TestDb};

static APP_POSTGRES: Migrator = sqlx::migrate!("tests/it/fixtures/app_migrations/postgres");
static APP_SQLITE: Migrator = sqlx::migrate!("tests/it/fixtures/app_migrations/sqlite");
static LIBRARY_POSTGRES: Migrator = sqlx::migrate!("crates/dedup-worker-core/migrations/postgres");
static LIBRARY_SQLITE: Migrator = sqlx::migrate!("crates/dedup-worker-core/migrations/sqlite");

fn app_migrations() -> Migrations {
    Migrations::new(&APP_POSTGRES, &APP_SQLITE)
}

fn versions(migrator: &Migrator) -> BTreeSet<i64> {
    migrator.iter().map(|m| m.version).collect()
}

/// A pool of the application's own, as its code would open one: the URL alone, the server's
/// default search_path.
enum AppPool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl AppPool {
    async fn connect(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(url)
                .expect("sqlite url")
                .create_if_missing(true);
            AppPool::Sqlite(
                sqlx::SqlitePool::connect_with(options)
                    .await
                    .expect("sqlite pool"),
            )
        } else {
            AppPool::Postgres(sqlx::PgPool::connect(url).await.expect("pg pool"))
        }
    }

    /// The application's stock migration call, as its own code makes it.
    async fn run_stock_migrator(&self) -> Result<(), sqlx::migrate::MigrateError> {
        match self {
            AppPool::Postgres(pool) => APP_POSTGRES.run(pool).await,
            AppPool::Sqlite(pool) => APP_SQLITE.run(pool).await,
        }
    }

    /// Versions in the history table an unqualified `_sqlx_migrations` names on this pool.
    async fn sqlx_history(&self) -> BTreeSet<i64> {
        const SQL: &str = "SELECT version FROM _sqlx_migrations WHERE success";
        let rows: Vec<i64> = match self {
            AppPool::Postgres(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
            AppPool::Sqlite(pool) => sqlx::query_scalar(SQL).fetch_all(pool).await,
        }
        .expect("read the application's history");
        rows.into_iter().collect()
    }

    /// Versions in the library's own history.
    async fn library_history(&self) -> BTreeSet<i64> {
        let rows: Vec<i64> = match self {
            AppPool::Postgres(pool) => {
                sqlx::query_scalar("SELECT version FROM dedup_worker._sqlx_migrations")
                    .fetch_all(pool)
                    .await
            }
            AppPool::Sqlite(pool) => {
                sqlx::query_scalar("SELECT version FROM _dedup_worker_migrations")
                    .fetch_all(pool)
                    .await
            }
        }
        .expect("read the library's history");
        rows.into_iter().collect()
    }

    /// Writes a widget with the second migration's column, then reads the colours back.
    async fn widgets(&self, id: &str) -> Vec<String> {
        const INSERT: &str = "INSERT INTO widgets (id, colour) VALUES ($1, 'red')";
        const SELECT: &str = "SELECT colour FROM widgets ORDER BY id";
        match self {
            AppPool::Postgres(pool) => {
                sqlx::query(INSERT)
                    .bind(id)
                    .execute(pool)
                    .await
                    .expect("insert");
                sqlx::query_scalar(SELECT).fetch_all(pool).await
            }
            AppPool::Sqlite(pool) => {
                sqlx::query(INSERT)
                    .bind(id)
                    .execute(pool)
                    .await
                    .expect("insert");
                sqlx::query_scalar(SELECT).fetch_all(pool).await
            }
        }
        .expect("read widgets")
    }

    async fn close(self) {
        match self {
            AppPool::Postgres(pool) => pool.close().await,
            AppPool::Sqlite(pool) => pool.close().await,
        }
    }
}

async fn build(db: &TestDb, service: Service) -> Result<Application, String> {
    Application::build(test_settings(&db.url, &[]), service)
        .await
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
}

async fn application_migrations_apply_on_every_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app_pool = AppPool::connect(&db.url).await;
    let library = match backend {
        Backend::Postgres => versions(&LIBRARY_POSTGRES),
        Backend::Sqlite => versions(&LIBRARY_SQLITE),
    };
    let own = match backend {
        Backend::Postgres => versions(&APP_POSTGRES),
        Backend::Sqlite => versions(&APP_SQLITE),
    };
    for start in 1..=3 {
        let app = build(&db, Service::new().migrations(app_migrations()))
            .await
            .unwrap_or_else(|e| panic!("start {start}: {e}"));
        app.store().close().await;
        drop(app);
        // The first failure: the application's own migrator, between two starts,
        // found the library's versions in "its" history and refused.
        app_pool
            .run_stock_migrator()
            .await
            .unwrap_or_else(|e| panic!("the stock migrator after start {start}: {e}"));
        assert_eq!(app_pool.sqlx_history().await, own, "start {start}");
        assert_eq!(app_pool.library_history().await, library, "start {start}");
    }
    // Both of the application's migrations ran, in order: the column the second adds exists.
    assert_eq!(app_pool.widgets("w1").await, vec!["red"]);
    if backend == Backend::Postgres {
        // The application's `outbox` is its own; the library's is in schema dedup_worker.
        let AppPool::Postgres(pool) = &app_pool else {
            unreachable!()
        };
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = 'outbox'",
        )
        .fetch_all(pool)
        .await
        .expect("columns");
        assert_eq!(columns, vec!["note"]);
    }
    app_pool.close().await;
    db.remove().await;
}

#[tokio::test]
async fn application_migrations_apply_on_every_start_on_postgres() {
    application_migrations_apply_on_every_start(Backend::Postgres).await;
}

#[tokio::test]
async fn application_migrations_apply_on_every_start_on_sqlite() {
    application_migrations_apply_on_every_start(Backend::Sqlite).await;
}

/// The application's migrations from a folder of this test's own, as a `&'static Migrator`.
async fn migrator_from(dir: &std::path::Path) -> &'static Migrator {
    let migrator = Migrator::new(dir).await.expect("read migrations");
    Box::leak(Box::new(migrator))
}

async fn a_changed_application_migration_is_reported_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let source = match backend {
        Backend::Postgres => "tests/it/fixtures/app_migrations/postgres",
        Backend::Sqlite => "tests/it/fixtures/app_migrations/sqlite",
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(source).expect("fixtures") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).expect("copy");
    }
    let first = migrator_from(dir.path()).await;
    let store = Store::connect_url(&db.url, 4, Duration::from_secs(5))
        .await
        .expect("connect");
    let migrations = Migrations::new(first, first);
    store.migrate_with(&migrations).await.expect("first run");

    let changed = dir.path().join("20270101000001_widgets.sql");
    let mut sql = std::fs::read_to_string(&changed).expect("read");
    sql.push_str("\n-- changed after it was applied\n");
    std::fs::write(&changed, sql).expect("write");
    let second = migrator_from(dir.path()).await;
    let error = store
        .migrate_with(&Migrations::new(second, second))
        .await
        .expect_err("a changed migration is refused");
    assert!(matches!(error, StoreError::Migrate { .. }), "{error:?}");
    let text = format!("{:#}", anyhow::Error::from(error));
    assert!(text.contains("the application's migrations"), "{text}");
    assert_eq!(
        text.matches("20270101000001").count(),
        1,
        "the cause once: {text}"
    );
    store.close().await;
    db.remove().await;
}

#[tokio::test]
async fn a_changed_application_migration_is_reported_once_on_postgres() {
    a_changed_application_migration_is_reported_once(Backend::Postgres).await;
}

#[tokio::test]
async fn a_changed_application_migration_is_reported_once_on_sqlite() {
    a_changed_application_migration_is_reported_once(Backend::Sqlite).await;
}

/// A handler written for PostgreSQL alone.
struct PostgresOnly;

#[async_trait]
impl Handler for PostgresOnly {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        Ok(vec![OutboxMessage::forward(event)])
    }

    fn backends(&self) -> &'static [StoreBackend] {
        &[StoreBackend::Postgres]
    }
}

#[tokio::test]
async fn a_handler_for_postgres_alone_is_refused_on_sqlite_before_migrating() {
    let db = TestDb::new(Backend::Sqlite).await;
    let error = build(&db, Service::new().handler(PostgresOnly))
        .await
        .err()
        .expect("refused");
    assert_eq!(
        error,
        "the handler runs on postgres only, and database_url is sqlite"
    );
    assert!(nothing_migrated(&db).await);
    // The same handler starts on PostgreSQL.
    let pg = TestDb::new(Backend::Postgres).await;
    let app = build(&pg, Service::new().handler(PostgresOnly))
        .await
        .expect("starts on postgres");
    app.store().close().await;
    drop(app);
    pg.remove().await;
    db.remove().await;
}

#[tokio::test]
async fn migrations_for_postgres_alone_are_refused_on_sqlite_before_migrating() {
    let db = TestDb::new(Backend::Sqlite).await;
    let error = build(
        &db,
        Service::new().migrations(Migrations::postgres_only(&APP_POSTGRES)),
    )
    .await
    .err()
    .expect("refused");
    assert!(error.contains("no set for sqlite"), "{error}");
    assert!(nothing_migrated(&db).await);
    db.remove().await;
}

/// Whether the SQLite database holds no table at all yet.
async fn nothing_migrated(db: &TestDb) -> bool {
    let pool = sqlx::SqlitePool::connect(&db.url).await.expect("pool");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
        .fetch_one(&pool)
        .await
        .expect("count tables");
    pool.close().await;
    tables == 0
}
