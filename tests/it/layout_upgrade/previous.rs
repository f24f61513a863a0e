//! The previous version's database: its migrations (sqlx's runner and history, tables in
//! `public`), an application's table and history row beside them, and rows in every table; and
//! what the tests read of it, through pools opened as the previous version opened them.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use dedup_worker_core::store::{dedup_key, Store};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{PgPool, SqlitePool};

use crate::helpers::{Backend, TestDb};

/// The last migration of the previous version (before the layouts were split).
pub(super) const PREVIOUS: i64 = 20261210000002;
/// The application's own migrations: its first one, then a second added after the upgrade.
pub(super) const USER_FIRST: (&str, &str) = (
    "20270101000001_paid_invoices.sql",
    "CREATE TABLE paid_invoices (invoice_id TEXT PRIMARY KEY, amount BIGINT NOT NULL);",
);
pub(super) const USER_SECOND: (&str, &str) = (
    "20270101000002_currency.sql",
    "ALTER TABLE paid_invoices ADD COLUMN currency TEXT;",
);
pub(super) const QUEUE: &str = "dedup.events";

/// Every table the previous version's migrations created, with the rows [`write_rows`] puts in.
pub(super) const TABLES: &[(&str, i64)] = &[
    ("processed_events_legacy", 100),
    ("processed_events_0", 1_000),
    ("processed_events_4", 50),
    ("processed_events", 1_150),
    ("dedup_generations", 2),
    ("outbox", 10),
    ("dead_letters", 4),
    ("dead_letter_redrives", 1),
    ("queue_messages", 6),
    ("event_ledger", 3),
    ("object_versions", 2),
    ("stale_events", 2),
];

/// A pool as the previous version, or an application, opens it: no `after_connect`, the
/// session's default `search_path`.
#[derive(Clone)]
pub(super) enum Raw {
    Pg(PgPool),
    Lite(SqlitePool),
}

impl Raw {
    pub(super) async fn connect(db: &TestDb, backend: Backend) -> Raw {
        match backend {
            Backend::Postgres => Raw::Pg(PgPool::connect(&db.url).await.expect("connect")),
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(&db.url)
                    .unwrap()
                    .create_if_missing(true);
                Raw::Lite(SqlitePool::connect_with(options).await.expect("connect"))
            }
        }
    }

    pub(super) async fn exec(&self, sql: &str) {
        match self {
            Raw::Pg(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            Raw::Lite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub(super) async fn scalar(&self, sql: &str) -> i64 {
        match self {
            Raw::Pg(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Raw::Lite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `(version, checksum)` of each row of `table`.
    pub(super) async fn history(&self, table: &str) -> Vec<(i64, Vec<u8>)> {
        let sql = format!("SELECT version, checksum FROM {table} ORDER BY version");
        match self {
            Raw::Pg(pool) => sqlx::query_as(&sql).fetch_all(pool).await,
            Raw::Lite(pool) => sqlx::query_as(&sql).fetch_all(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub(super) async fn run(&self, migrator: &Migrator) -> Result<(), MigrateError> {
        match self {
            Raw::Pg(pool) => migrator.run(pool).await,
            Raw::Lite(pool) => migrator.run(pool).await,
        }
    }
}

pub(super) fn migrations_dir(backend: Backend) -> PathBuf {
    let dir = match backend {
        Backend::Postgres => "crates/dedup-worker-core/migrations/postgres",
        Backend::Sqlite => "crates/dedup-worker-core/migrations/sqlite",
    };
    Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
}

/// Every library migration on `backend`, in version order: on PostgreSQL the pipeline's and
/// the Idempotency-Key layer's (crates/idempotency-key/migrations), which the previous version
/// kept in one folder and ran as one migrator.
async fn library_migrator(backend: Backend) -> Migrator {
    let mut migrator = Migrator::new(migrations_dir(backend)).await.unwrap();
    if backend == Backend::Postgres {
        let layer_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/idempotency-key/migrations/postgres");
        let layer = Migrator::new(layer_dir).await.unwrap();
        let mut all: Vec<_> = migrator.iter().chain(layer.iter()).cloned().collect();
        all.sort_by_key(|m| m.version);
        migrator.migrations = all.into();
    }
    migrator
}

/// The previous version's migrator, exactly as it ran: the files up to [`PREVIOUS`], with
/// sqlx's runner and history.
pub(super) async fn previous_migrator(backend: Backend) -> Migrator {
    let mut migrator = library_migrator(backend).await;
    migrator.migrations = migrator
        .migrations
        .iter()
        .filter(|m| m.version <= PREVIOUS)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    migrator
}

/// The current library migrations of both products (the same files), for their checksums: what
/// the history holds after a previous version's database is upgraded.
pub(super) async fn library_migrations(backend: Backend) -> Vec<(i64, Vec<u8>)> {
    versions_and_checksums(&library_migrator(backend).await)
}

/// The pipeline's own migrations: what the history holds after the pipeline migrates a new
/// database (the layer's are applied by the layer, `idempotency_key::migrate`).
pub(super) async fn pipeline_migrations(backend: Backend) -> Vec<(i64, Vec<u8>)> {
    versions_and_checksums(&Migrator::new(migrations_dir(backend)).await.unwrap())
}

fn versions_and_checksums(migrator: &Migrator) -> Vec<(i64, Vec<u8>)> {
    migrator
        .iter()
        .map(|m| (m.version, m.checksum.to_vec()))
        .collect()
}

/// The application's migrator over `files`, from a folder of its own.
pub(super) async fn user_migrator(dir: &Path, files: &[(&str, &str)]) -> Migrator {
    for (name, sql) in files {
        std::fs::write(dir.join(name), sql).unwrap();
    }
    Migrator::new(dir.to_path_buf()).await.unwrap()
}

/// Ids as the previous version recorded them.
pub(super) fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("evt_{prefix}_{i}")).collect()
}

/// `(key, source, event_id)` rows of a generation table, the key as the consumer computes it.
pub(super) fn generation_rows(raw: &Raw, table: &str, ids: &[String]) -> String {
    let now = chrono::Utc::now().timestamp_millis();
    let rows: Vec<String> = ids
        .iter()
        .map(|id| {
            let key = hex::encode(dedup_key("stripe", id));
            match raw {
                Raw::Pg(_) => format!("('{key}'::uuid, 'stripe', '{id}', 'invoice.paid')"),
                Raw::Lite(_) => format!("(x'{key}', 'stripe', '{id}', 'invoice.paid', {now})"),
            }
        })
        .collect();
    let columns = match raw {
        Raw::Pg(_) => "key, source, event_id, event_type",
        Raw::Lite(_) => "key, source, event_id, event_type, processed_at",
    };
    format!("INSERT INTO {table} ({columns}) VALUES {}", rows.join(", "))
}

/// The previous version's rows: processed ids in the legacy table, the current generation and
/// a sealed one; outbox rows pending, failed and dispatched; dead letters, a redrive, queued
/// messages, the stale guard's rows, the example ledger and (PostgreSQL) idempotency keys.
pub(super) async fn write_rows(raw: &Raw) {
    let pg = matches!(raw, Raw::Pg(_));
    let now = chrono::Utc::now().timestamp_millis();
    // SQLite keeps times as Unix milliseconds; PostgreSQL as timestamptz.
    let (t, old) = if pg {
        ("now()".to_owned(), "now() - interval '15 days'".to_owned())
    } else {
        (now.to_string(), (now - 15 * 86_400_000).to_string())
    };
    let legacy: Vec<String> = ids("legacy", 100)
        .iter()
        .map(|id| format!("('stripe', '{id}', 'invoice.paid', {t})"))
        .collect();
    raw.exec(&format!(
        "INSERT INTO processed_events_legacy (source, event_id, event_type, processed_at) VALUES {}",
        legacy.join(", ")
    ))
    .await;
    raw.exec(&generation_rows(
        raw,
        "processed_events_0",
        &ids("current", 1_000),
    ))
    .await;
    raw.exec(&generation_rows(
        raw,
        "processed_events_4",
        &ids("sealed", 50),
    ))
    .await;
    // Slot 4 sealed before slot 0 (the migration's current generation) started.
    raw.exec(&format!(
        "UPDATE dedup_generations SET started_at = {old} WHERE slot = 0;
         INSERT INTO dedup_generations (slot, started_at, sealed_at) VALUES (4, {old}, {old})"
    ))
    .await;
    let blob = if pg { "'\\x7b7d'::bytea" } else { "x'7b7d'" };
    for (status, n) in [("pending", 3), ("failed", 2), ("dispatched", 5)] {
        for i in 0..n {
            raw.exec(&format!(
                "INSERT INTO outbox (source, event_id, idempotency_key, event_type, payload, status,
                                     attempts, next_attempt_at, last_error, created_at, dispatched_at)
                 VALUES ('stripe', 'evt_{status}_{i}', 'evt_{status}_{i}', 'invoice.paid', {blob},
                         '{status}', 1, {t}, 'sink said 500', {t}, {t})"
            ))
            .await;
        }
    }
    for i in 0..4 {
        raw.exec(&format!(
            "INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts, created_at)
             VALUES ('stripe', 'evt_dead_{i}', 'invoice.paid', '{QUEUE}', {blob}, 'poison', 8, {t})"
        ))
        .await;
    }
    raw.exec(&format!(
        "INSERT INTO dead_letter_redrives (dead_letter_id, source, event_id, event_type, queue,
                                           redriven_to, error, attempts, dead_lettered_at, redriven_at)
         VALUES (99, 'stripe', 'evt_redriven', 'invoice.paid', '{QUEUE}', '{QUEUE}', 'poison', 8, {t}, {t})"
    ))
    .await;
    for i in 0..6 {
        raw.exec(&format!(
            "INSERT INTO queue_messages (queue, source, message_id, message_type, payload, visible_at, enqueued_at)
             VALUES ('{QUEUE}', 'stripe', 'evt_queued_{i}', 'invoice.paid', {blob}, {t}, {t})"
        ))
        .await;
    }
    raw.exec(&format!(
        "INSERT INTO event_ledger (source, event_id, event_type, recorded_at) VALUES
             ('stripe', 'evt_current_0', 'invoice.paid', {t}),
             ('stripe', 'evt_current_1', 'invoice.paid', {t}),
             ('stripe', 'evt_current_2', 'invoice.paid', {t});
         INSERT INTO object_versions (source, object_id, version, event_id) VALUES
             ('stripe', 'in_1', 7, 'evt_current_3'), ('stripe', 'in_2', 3, 'evt_current_4');
         INSERT INTO stale_events (source, event_id, event_type, object_id, version,
                                   newer_event_id, newer_version, recorded_at) VALUES
             ('stripe', 'evt_stale_0', 'invoice.updated', 'in_1', 5, 'evt_current_3', 7, {t}),
             ('stripe', 'evt_stale_1', 'invoice.updated', 'in_2', 1, 'evt_current_4', 3, {t})"
    ))
    .await;
    if pg {
        raw.exec(
            "INSERT INTO idempotency_keys (account, key, fingerprint, status, expires_at) VALUES
                 ('acct', 'k1', '\\x00'::bytea, 'completed', now() + interval '1 day'),
                 ('acct', 'k2', '\\x00'::bytea, 'in_progress', now() + interval '1 day')",
        )
        .await;
        raw.exec(
            "INSERT INTO duplicate_deliveries (slot, key) SELECT 0, key FROM processed_events_0 LIMIT 10",
        )
        .await;
    } else {
        raw.exec(&format!(
            "INSERT INTO duplicate_deliveries_0 (key, seen_at) SELECT key, {now} FROM processed_events_0 LIMIT 10"
        ))
        .await;
    }
    raw.exec("INSERT INTO paid_invoices (invoice_id, amount) VALUES ('in_user', 4200)")
        .await;
}

/// Per-table counts through the store's own connections (unqualified names: the store's
/// search_path on PostgreSQL), then the PostgreSQL-only tables.
pub(super) async fn counts(store: &Store, pg: bool) -> Vec<(String, i64)> {
    let mut tables: Vec<(&str, i64)> = TABLES.to_vec();
    if pg {
        tables.extend([("idempotency_keys", 2), ("duplicate_deliveries", 10)]);
    } else {
        tables.push(("duplicate_deliveries_0", 10));
    }
    let mut out = Vec::new();
    for (table, _) in tables {
        let sql = format!("SELECT count(*) FROM {table}");
        let n: i64 = match (store.postgres_pool(), store.sqlite_pool()) {
            (Some(pool), _) => sqlx::query_scalar(&sql).fetch_one(pool).await,
            (_, Some(pool)) => sqlx::query_scalar(&sql).fetch_one(pool).await,
            (None, None) => unreachable!(),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
        out.push((table.to_owned(), n));
    }
    out
}

pub(super) fn expected_counts(pg: bool) -> Vec<(String, i64)> {
    let mut tables: Vec<(String, i64)> = TABLES.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    if pg {
        tables.extend([
            ("idempotency_keys".into(), 2),
            ("duplicate_deliveries".into(), 10),
        ]);
    } else {
        tables.push(("duplicate_deliveries_0".into(), 10));
    }
    tables
}

/// The previous version's database: its migrations on a raw pool, the application's first
/// migration beside them in the same history (sqlx's `set_ignore_missing`, the only way the two
/// could share it), then rows in every table.
pub(super) async fn previous_version_database(
    db: &TestDb,
    backend: Backend,
    user_dir: &Path,
) -> Raw {
    let raw = Raw::connect(db, backend).await;
    raw.run(&previous_migrator(backend).await).await.unwrap();
    let mut user = user_migrator(user_dir, &[USER_FIRST]).await;
    user.set_ignore_missing(true);
    raw.run(&user).await.unwrap();
    write_rows(&raw).await;
    raw
}

/// `(name, relkind)` of every relation in schema public.
pub(super) async fn public_relations(raw: &Raw) -> Vec<(String, String)> {
    let Raw::Pg(pool) = raw else {
        unreachable!("PostgreSQL only")
    };
    sqlx::query_as(
        "SELECT c.relname::text, c.relkind::text FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'public' ORDER BY c.relname",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}
