//! A database written by the previous version (library tables in `public` and the library's
//! history in `_sqlx_migrations`, beside an application's own table and history row) upgrades
//! in place to the current layout (PostgreSQL: schema `dedup_worker`; SQLite: history in
//! `_dedup_worker_migrations`), keeping every row, on both stores; the previous version's
//! migrations cannot start a second pipeline in `public` afterwards; two processes upgrading
//! at once end with one layout; the SQLite runner refuses what sqlx's refuses.

use std::time::Duration;

use dedup_worker_core::store::{Store, StoreError};
use sqlx::migrate::MigrateError;

use crate::helpers::{Backend, TestDb};

mod layer_order;
mod previous;

use previous::{
    counts, expected_counts, ids, library_migrations, pipeline_migrations, previous_migrator,
    previous_version_database, public_relations, user_migrator, Raw, PREVIOUS, QUEUE, USER_FIRST,
    USER_SECOND,
};

/// The previous version's database, then `Store::migrate` twice: the library's history moved
/// (checksums and all) and the second run a no-op; every table's rows there and every
/// processed id a duplicate; dead letters, failed outbox rows and the queue as before; the
/// application's history row and table untouched, its stock migrator running without a
/// workaround, a later migration of its own landing in its history; nothing of the library in
/// public but the sentinel view.
async fn todays_database_upgrades_keeping_every_row(backend: Backend) {
    let pg = backend == Backend::Postgres;
    let db = TestDb::new(backend).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = previous_version_database(&db, backend, user_dir.path()).await;
    let user_history = raw.history("_sqlx_migrations").await;
    // The previous version's migrations: those up to PREVIOUS (later ones are this version's).
    let library = library_migrations(backend)
        .await
        .iter()
        .filter(|(version, _)| *version <= PREVIOUS)
        .count();
    assert_eq!(
        user_history.len(),
        library + 1,
        "the library's rows and the user's"
    );

    let store = Store::connect_url(&db.url, 4, Duration::from_secs(10))
        .await
        .unwrap();
    store.migrate().await.expect("the upgrade");
    let new_history = if pg {
        "dedup_worker._sqlx_migrations"
    } else {
        "_dedup_worker_migrations"
    };
    let after_first = raw.history(new_history).await;
    store.migrate().await.expect("a second migrate");

    // The library's history moved, checksums and all, and the second run changed nothing.
    assert_eq!(after_first, library_migrations(backend).await);
    assert_eq!(raw.history(new_history).await, after_first, "a no-op");
    // Every row is still there, read through the store.
    assert_eq!(counts(&store, pg).await, expected_counts(pg));
    // Every id recorded before is a duplicate after, in the current, sealed and legacy tables.
    for prefix in [("current", 1_000), ("sealed", 50), ("legacy", 100)] {
        let pairs: Vec<(String, String)> = ids(prefix.0, prefix.1)
            .into_iter()
            .map(|id| (id, "invoice.paid".to_owned()))
            .collect();
        let mut tx = store.begin().await.unwrap();
        let new = tx.insert_processed("stripe", &pairs).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(new, Vec::<String>::new(), "{} ids are duplicates", prefix.0);
    }
    // What operators read goes on: dead letters, failed outbox rows, the queue's depth.
    let dead: Vec<String> = store
        .dead_letters()
        .list(100)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.event_id)
        .collect();
    assert_eq!(dead.len(), 4);
    assert!((0..4).all(|i| dead.contains(&format!("evt_dead_{i}"))));
    let mut failed: Vec<String> = store
        .outbox()
        .failed(100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.event_id)
        .collect();
    failed.sort();
    assert_eq!(failed, ["evt_failed_0", "evt_failed_1"]);
    let outbox = store.outbox().counts().await.unwrap();
    assert_eq!(
        (outbox.pending, outbox.failed, outbox.dispatched),
        (3, 2, 5)
    );
    assert_eq!(store.queue().depth(QUEUE).await.unwrap(), 6);

    // The application's history row and table are untouched, and its own stock migrator, the
    // one that refused to run beside the library's rows, runs without a workaround.
    let user_rows = raw.history("_sqlx_migrations").await;
    assert_eq!(user_rows.len(), 1, "only the application's row is left");
    assert!(user_history.contains(&user_rows[0]));
    assert_eq!(
        raw.scalar("SELECT amount FROM paid_invoices WHERE invoice_id = 'in_user'")
            .await,
        4200
    );
    let user = user_migrator(user_dir.path(), &[USER_FIRST]).await;
    raw.run(&user).await.expect("the application's migrator");
    // A later application migration, run through the store, lands in the application's history
    // and schema (on PostgreSQL: the connection's search_path without dedup_worker in front).
    let user = user_migrator(user_dir.path(), &[USER_FIRST, USER_SECOND]).await;
    store
        .run_user_migrator(&user)
        .await
        .expect("run_user_migrator");
    assert_eq!(raw.history("_sqlx_migrations").await.len(), 2);
    raw.exec("UPDATE paid_invoices SET currency = 'eur'").await;
    assert_eq!(
        raw.history(new_history).await,
        after_first,
        "the library's history holds no application row"
    );

    if pg {
        // Nothing of the library is left in public but the sentinel view.
        assert_eq!(
            public_relations(&raw).await,
            [
                ("_sqlx_migrations".to_owned(), "r".to_owned()),
                ("_sqlx_migrations_pkey".into(), "i".into()),
                ("paid_invoices".into(), "r".into()),
                ("paid_invoices_pkey".into(), "i".into()),
                ("processed_events".into(), "v".into()),
            ]
        );
        assert_eq!(
            raw.scalar("SELECT count(*) FROM dedup_worker.processed_events")
                .await,
            1_150
        );
    } else {
        let lib = "SELECT count(*) FROM _sqlx_migrations WHERE version < 20270000000000";
        assert_eq!(raw.scalar(lib).await, 0);
    }
    store.close().await;
    db.remove().await;
}

#[tokio::test]
async fn todays_database_upgrades_keeping_every_row_postgres() {
    todays_database_upgrades_keeping_every_row(Backend::Postgres).await;
}

#[tokio::test]
async fn todays_database_upgrades_keeping_every_row_sqlite() {
    todays_database_upgrades_keeping_every_row(Backend::Sqlite).await;
}

/// After the upgrade, a process of the previous version that starts and migrates finds no
/// library row in public's history and re-runs its first migration: the sentinel view makes
/// it fail (and roll back) instead of creating an empty pipeline that forgets every id.
#[tokio::test]
async fn the_old_migrations_cannot_recreate_the_tables_in_public() {
    let db = TestDb::new(Backend::Postgres).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = previous_version_database(&db, Backend::Postgres, user_dir.path()).await;
    let store = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let before = public_relations(&raw).await;

    let mut previous = previous_migrator(Backend::Postgres).await;
    previous.set_ignore_missing(true); // past the application's row, to the library's first
    match raw.run(&previous).await {
        Err(MigrateError::ExecuteMigration(e, 20261129000001)) => {
            assert!(e.to_string().contains("already exists"), "{e}")
        }
        other => panic!("the previous version's first migration must fail: {other:?}"),
    }
    assert_eq!(public_relations(&raw).await, before, "it rolled back");
    assert_eq!(raw.history("_sqlx_migrations").await.len(), 1);
    // The current store goes on, with every id.
    let mut tx = store.begin().await.unwrap();
    let new = tx
        .insert_processed("stripe", &[("evt_current_7".into(), "x".into())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(new.is_empty());
    store.close().await;
    db.remove().await;
}

/// Two processes start on the previous version's database at the same moment and both
/// migrate: one moves and migrates, the other waits for it (without blocking its
/// `CREATE INDEX CONCURRENTLY`) and finds nothing left to do.
async fn two_processes_upgrading_at_once_end_with_one_layout(backend: Backend, previous: bool) {
    let pg = backend == Backend::Postgres;
    let db = TestDb::new(backend).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = if previous {
        Some(previous_version_database(&db, backend, user_dir.path()).await)
    } else {
        None
    };
    let a = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    let b = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    ra.expect("the first process migrates");
    rb.expect("the second process migrates");
    let raw = match raw {
        Some(raw) => raw,
        None => Raw::connect(&db, backend).await,
    };
    let new_history = if pg {
        "dedup_worker._sqlx_migrations"
    } else {
        "_dedup_worker_migrations"
    };
    // Moved from a previous version's history, both products' rows; on a new database, the
    // pipeline's alone.
    let expected = if previous {
        library_migrations(backend).await
    } else {
        pipeline_migrations(backend).await
    };
    assert_eq!(raw.history(new_history).await, expected);
    if previous {
        assert_eq!(counts(&a, pg).await, expected_counts(pg));
        assert_eq!(raw.history("_sqlx_migrations").await.len(), 1);
    }
    if pg {
        let public = public_relations(&raw).await;
        assert!(
            public.iter().all(|(name, kind)| {
                ["_sqlx_migrations", "_sqlx_migrations_pkey", "paid_invoices"]
                    .contains(&name.as_str())
                    || name == "paid_invoices_pkey"
                    || (name == "processed_events" && kind == "v")
            }),
            "{public:?}"
        );
    }
    a.close().await;
    b.close().await;
    db.remove().await;
}

#[tokio::test]
async fn two_processes_upgrading_at_once_end_with_one_layout_postgres() {
    two_processes_upgrading_at_once_end_with_one_layout(Backend::Postgres, true).await;
}

#[tokio::test]
async fn two_processes_upgrading_at_once_end_with_one_layout_sqlite() {
    two_processes_upgrading_at_once_end_with_one_layout(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn two_processes_migrating_a_fresh_database_at_once_postgres() {
    two_processes_upgrading_at_once_end_with_one_layout(Backend::Postgres, false).await;
}

#[tokio::test]
async fn two_processes_migrating_a_fresh_database_at_once_sqlite() {
    two_processes_upgrading_at_once_end_with_one_layout(Backend::Sqlite, false).await;
}

/// The SQLite runner validates the library's history as sqlx's runner does, with its errors.
#[tokio::test]
async fn the_sqlite_runner_refuses_what_sqlx_refuses() {
    type Expected = fn(MigrateError) -> bool;
    let cases: &[(&str, Expected)] = &[
        (
            "UPDATE _dedup_worker_migrations SET success = FALSE WHERE version = 20261201000001",
            |e| matches!(e, MigrateError::Dirty(20261201000001)),
        ),
        (
            "INSERT INTO _dedup_worker_migrations (version, description, success, checksum, execution_time)
             VALUES (20261111000001, 'gone', TRUE, x'00', 0)",
            |e| matches!(e, MigrateError::VersionMissing(20261111000001)),
        ),
        (
            "UPDATE _dedup_worker_migrations SET checksum = x'00' WHERE version = 20261202000001",
            |e| matches!(e, MigrateError::VersionMismatch(20261202000001)),
        ),
    ];
    for (change, expected) in cases {
        let db = TestDb::new(Backend::Sqlite).await;
        let store = db.store().await;
        crate::helpers::db::execute(&store, change).await;
        match store.migrate().await {
            Err(StoreError::Migrate { source: e, .. }) => assert!(expected(e), "after {change}"),
            other => panic!("after {change}: {other:?}"),
        }
        store.close().await;
    }
}

/// A database whose library history is in both places (the old one written again after the
/// upgrade) is refused, with both tables named, instead of guessing which one is in use.
#[tokio::test]
async fn both_layouts_at_once_are_refused() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let raw = Raw::connect(&db, backend).await;
        raw.exec(
            "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL,
                 installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL,
                 checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
        )
        .await;
        let blob = if backend == Backend::Postgres {
            "'\\x00'::bytea"
        } else {
            "x'00'"
        };
        raw.exec(&format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (20261129000001, 'pipeline', TRUE, {blob}, 0)"
        ))
        .await;
        let error = store.migrate().await.expect_err("two layouts");
        assert!(
            matches!(error, StoreError::Layout(_)) && error.to_string().contains("both"),
            "{error}"
        );
        store.close().await;
        db.remove().await;
    }
}

/// A process of the previous version still at work holds locks on the tables: the upgrade gives
/// up after its lock timeout with what to do, moves nothing, and succeeds once it is gone.
#[tokio::test]
async fn a_previous_version_still_at_work_makes_the_upgrade_give_up_saying_what_to_do() {
    let db = TestDb::new(Backend::Postgres).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = previous_version_database(&db, Backend::Postgres, user_dir.path()).await;
    let Raw::Pg(pool) = &raw else { unreachable!() };
    let mut at_work = pool.begin().await.unwrap();
    sqlx::query("SELECT count(*) FROM outbox")
        .execute(&mut *at_work)
        .await
        .unwrap();
    let store = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    let error = store.migrate().await.expect_err("a lock held");
    let chain = format!("{:#}", anyhow::Error::from(error));
    assert!(
        chain.contains("stop every process of the previous version") && chain.contains("lock"),
        "{chain}"
    );
    let public = public_relations(&raw).await;
    assert!(
        public.iter().any(|(name, _)| name == "outbox"),
        "nothing moved"
    );
    at_work.rollback().await.unwrap();
    store
        .migrate()
        .await
        .expect("the upgrade, once the old process is gone");
    assert_eq!(counts(&store, true).await, expected_counts(true));
    store.close().await;
    db.remove().await;
}
