//! The test kit (`dedup_worker::testing`, the `testing` feature) as a handler crate's own tests
//! use it: a handler with a table of its own (migrations beside the library's), run alone by
//! `testing::handle` on both stores (committed when it succeeds, rolled back with its error),
//! and run by the whole application through signed Stripe events.

use std::time::Duration;

use dedup_worker::testing::{
    self, post_signed_until_not_503, stripe_event_with, test_settings, Backend, TestApp, TestDb,
    TEST_SECRET,
};
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::{DbTx, Migrations, Store};
use serde_json::json;
use sqlx::migrate::Migrator;

// A handler crate's plain `sqlx::migrate!`: the library keeps its own history apart.
static POSTGRES: Migrator = sqlx::migrate!("tests/it/testing_kit/postgres");
static SQLITE: Migrator = sqlx::migrate!("tests/it/testing_kit/sqlite");
const MIGRATIONS: Migrations = Migrations::new(&POSTGRES, &SQLITE);

/// Credits `data.object.amount` once per event; a negative amount is refused (fatal) after the
/// row is written, so only a rollback keeps it out.
struct Credit;

#[async_trait::async_trait]
impl Handler for Credit {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let body: serde_json::Value = event.json()?;
        let amount = body["data"]["object"]["amount"]
            .as_i64()
            .unwrap_or_default();
        dedup_worker::execute!(
            tx,
            "INSERT INTO kit_credits (event_id, amount) VALUES ($1, $2)",
            &event.id,
            amount
        )?;
        if amount < 0 {
            return Err(HandlerError::Fatal(
                format!("negative amount {amount}").into(),
            ));
        }
        Ok(vec![OutboxMessage::json(
            "credit.recorded",
            &event.id,
            &json!({ "amount": amount }),
        )?])
    }
}

/// `kit_credits`, ordered by event id.
async fn credits(store: &Store) -> Vec<(String, i64)> {
    let sql = "SELECT event_id, amount FROM kit_credits ORDER BY event_id";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("kit_credits")
}

fn invoice(id: &str, amount: i64) -> Event {
    let body = stripe_event_with(
        id,
        "invoice.paid",
        json!({ "id": "in_1", "amount": amount }),
    );
    testing::event("stripe", id, "invoice.paid", &body)
}

#[tokio::test]
async fn handle_commits_what_succeeds_and_rolls_back_what_fails_on_postgres() {
    handle_commits_what_succeeds_and_rolls_back_what_fails(Backend::Postgres).await;
}

#[tokio::test]
async fn handle_commits_what_succeeds_and_rolls_back_what_fails_on_sqlite() {
    handle_commits_what_succeeds_and_rolls_back_what_fails(Backend::Sqlite).await;
}

async fn handle_commits_what_succeeds_and_rolls_back_what_fails(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store_with(&MIGRATIONS).await;
    assert_eq!(store.backend(), backend);

    let sent = testing::handle(&store, &Credit, &invoice("evt_paid", 500))
        .await
        .expect("handled");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].event_type, "credit.recorded");
    assert_eq!(sent[0].idempotency_key, "evt_paid");
    assert_eq!(credits(&store).await, [("evt_paid".to_owned(), 500)]);

    let refused = testing::handle(&store, &Credit, &invoice("evt_refund", -5)).await;
    assert!(
        matches!(&refused, Err(e) if e.is_fatal()),
        "the handler's own error: {refused:?}"
    );
    // The row it wrote before failing went with its transaction.
    assert_eq!(credits(&store).await, [("evt_paid".to_owned(), 500)]);

    // A database error the handler met is classified as the consumer classifies it: the same
    // event again violates the primary key, which no retry cures.
    let again = testing::handle(&store, &Credit, &invoice("evt_paid", 500)).await;
    assert!(matches!(&again, Err(e) if e.is_fatal()), "{again:?}");
    store.close().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_runs_the_handler_once_per_event_with_its_migrations() {
    let db = TestDb::new(Backend::Sqlite).await;
    let settings = test_settings(&db.url, &[("consumer.poll_interval", json!("20ms"))]);
    let app = TestApp::spawn(
        settings,
        Service::new().handler(Credit).migrations(MIGRATIONS),
    )
    .await;
    let client = reqwest::Client::new();
    let webhook = app.url("/webhooks/stripe");
    for (id, amount) in [
        ("evt_1", 100),
        ("evt_2", 250),
        ("evt_1", 100),
        ("evt_bad", -1),
    ] {
        let body = stripe_event_with(id, "invoice.paid", json!({ "amount": amount }));
        let response = post_signed_until_not_503(&client, &webhook, TEST_SECRET, body).await;
        assert!(
            response.status().is_success(),
            "{id}: {}",
            response.status()
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let dead = app
            .store
            .dead_letters()
            .list(10)
            .await
            .expect("dead letters");
        if dead.len() == 1 && credits(&app.store).await.len() == 2 {
            assert_eq!(dead[0].event_id, "evt_bad");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not drained: {dead:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        credits(&app.store).await,
        [("evt_1".to_owned(), 100), ("evt_2".to_owned(), 250)]
    );
    app.stop().await;
    db.remove().await;
}
