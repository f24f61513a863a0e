//! The two products migrate one schema with one history (`dedup_db::schema`), each applying its
//! own files: the Idempotency-Key layer (`idempotency_key::migrate`, on an application's own
//! pool) and the pipeline (`Store::migrate`). Whichever runs first, alone or both at once, on a
//! new database or on the previous version's, ends with every migration of both applied once,
//! every row kept, and a second run of either a no-op. PostgreSQL only: the layer has no SQLite
//! store.

use std::time::Duration;

use dedup_worker_core::store::Store;
use sqlx::PgPool;

use super::previous::{
    counts, expected_counts, library_migrations, pipeline_migrations, previous_version_database,
    Raw, PREVIOUS,
};
use crate::helpers::{Backend, TestDb};

const HISTORY: &str = "dedup_worker._sqlx_migrations";

/// Which product migrates first.
#[derive(Clone, Copy, Debug)]
enum Order {
    LayerThenPipeline,
    PipelineThenLayer,
    AtOnce,
}

/// A database (new, or the previous version's with rows in every table), migrated by both
/// products in `order`, then by each once more.
async fn both_products_migrate(order: Order, previous: bool) {
    let db = TestDb::new(Backend::Postgres).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = if previous {
        previous_version_database(&db, Backend::Postgres, user_dir.path()).await
    } else {
        Raw::connect(&db, Backend::Postgres).await
    };
    let Raw::Pg(app_pool) = raw.clone() else {
        unreachable!("PostgreSQL")
    };
    let store = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    match order {
        Order::LayerThenPipeline => {
            layer(&app_pool).await;
            store.migrate().await.expect("the pipeline after the layer");
        }
        Order::PipelineThenLayer => {
            store.migrate().await.expect("the pipeline");
            layer(&app_pool).await;
        }
        Order::AtOnce => {
            let (l, p) = tokio::join!(idempotency_key::migrate(&app_pool), store.migrate());
            l.expect("the layer, beside the pipeline");
            p.expect("the pipeline, beside the layer");
        }
    }
    let history = raw.history(HISTORY).await;
    assert_eq!(
        history,
        library_migrations(Backend::Postgres).await,
        "{order:?}: every migration of both products, once, with its checksum"
    );
    layer(&app_pool).await;
    store.migrate().await.expect("the pipeline again");
    assert_eq!(
        raw.history(HISTORY).await,
        history,
        "{order:?}: second runs"
    );
    if previous {
        assert_eq!(
            counts(&store, true).await,
            expected_counts(true),
            "{order:?}"
        );
        // The application's history kept its own row only.
        assert_eq!(raw.history("_sqlx_migrations").await.len(), 1);
    }
    // The layer's table is where the layer names it, whichever product created or moved it.
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_worker.idempotency_keys")
        .fetch_one(&app_pool)
        .await
        .unwrap();
    assert_eq!(keys, if previous { 2 } else { 0 });
    store.close().await;
    app_pool.close().await;
    db.remove().await;
}

async fn layer(pool: &PgPool) {
    idempotency_key::migrate(pool).await.expect("the layer");
}

/// The layer alone on the previous version's database: it moves both products' tables and
/// history (the move is the layout's, not one product's), applies its own files and leaves the
/// pipeline's later ones to the pipeline, which then finds its tables where it keeps them.
#[tokio::test]
async fn the_layer_alone_upgrades_the_previous_layout_for_both() {
    let db = TestDb::new(Backend::Postgres).await;
    let user_dir = tempfile::tempdir().unwrap();
    let raw = previous_version_database(&db, Backend::Postgres, user_dir.path()).await;
    let Raw::Pg(app_pool) = raw.clone() else {
        unreachable!("PostgreSQL")
    };
    layer(&app_pool).await;

    let pipeline_later: Vec<i64> = pipeline_migrations(Backend::Postgres)
        .await
        .into_iter()
        .map(|(version, _)| version)
        .filter(|version| *version > PREVIOUS)
        .collect();
    let expected: Vec<(i64, Vec<u8>)> = library_migrations(Backend::Postgres)
        .await
        .into_iter()
        .filter(|(version, _)| !pipeline_later.contains(version))
        .collect();
    assert_eq!(
        raw.history(HISTORY).await,
        expected,
        "the previous version's rows moved and the layer's own applied; the pipeline's later \
         ones left to it"
    );
    assert_eq!(raw.history("_sqlx_migrations").await.len(), 1);

    let store = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    store.migrate().await.expect("the pipeline after the layer");
    assert_eq!(
        raw.history(HISTORY).await,
        library_migrations(Backend::Postgres).await
    );
    assert_eq!(counts(&store, true).await, expected_counts(true));
    store.close().await;
    app_pool.close().await;
    db.remove().await;
}

#[tokio::test]
async fn the_layer_then_the_pipeline_on_a_new_database() {
    both_products_migrate(Order::LayerThenPipeline, false).await;
}

#[tokio::test]
async fn the_pipeline_then_the_layer_on_a_new_database() {
    both_products_migrate(Order::PipelineThenLayer, false).await;
}

#[tokio::test]
async fn the_layer_and_the_pipeline_at_once_on_a_new_database() {
    both_products_migrate(Order::AtOnce, false).await;
}

#[tokio::test]
async fn the_layer_then_the_pipeline_on_the_previous_layout() {
    both_products_migrate(Order::LayerThenPipeline, true).await;
}

#[tokio::test]
async fn the_layer_and_the_pipeline_at_once_on_the_previous_layout() {
    both_products_migrate(Order::AtOnce, true).await;
}
