//! A test kit for a handler crate's own tests (the `testing` feature): what dedup-worker's
//! integration suite uses to test the pipeline, for testing a service built on it.
//!
//! Enable it for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! dedup-worker = { version = "0.1", features = ["testing"] }
//! ```
//!
//! * a fresh database per test on either store ([`TestDb`], [`Backend`]);
//! * the handler alone, in one store transaction as the consumer runs it ([`handle`], with an
//!   [`event`] built as the consumer would), so a unit test sees the rows it wrote;
//! * the whole application in the test's process on port 0 ([`TestApp`], [`test_settings`]),
//!   and Stripe events signed as Stripe sends them ([`stripe_event`], [`post_signed`]);
//! * a TCP proxy between the application and a dependency that black-holes, refuses, cuts or
//!   slows it ([`fault_proxy::FaultProxy`]).
//!
//! ```
//! use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
//! use dedup_worker_core::event::Event;
//! use dedup_worker_core::store::DbTx;
//! use dedup_worker_core::testing::{self, Backend, TestDb};
//!
//! /// Records each event's id; fails (fatally) on `charge.failed`, after writing.
//! struct Record;
//!
//! #[dedup_worker_core::async_trait]
//! impl Handler for Record {
//!     async fn handle(&self, event: &Event, tx: &mut DbTx<'_>) -> Result<Vec<OutboxMessage>, HandlerError> {
//!         dedup_worker_core::execute!(tx, "INSERT INTO seen (event_id) VALUES ($1)", &event.id)?;
//!         if event.event_type == "charge.failed" {
//!             return Err(HandlerError::Fatal("declined".into()));
//!         }
//!         Ok(vec![OutboxMessage::forward(event)])
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let db = TestDb::new(Backend::Sqlite).await;
//! let store = db.store().await;
//! // (a real handler crate's table comes from its migrations: `db.store_with(&MIGRATIONS)`)
//! let pool = store.sqlite_pool().unwrap();
//! sqlx::query("CREATE TABLE seen (event_id TEXT)").execute(pool).await.unwrap();
//!
//! let paid = testing::event("stripe", "evt_1", "invoice.paid", b"{}");
//! let sent = testing::handle(&store, &Record, &paid).await.unwrap();
//! assert_eq!(sent, [OutboxMessage::forward(&paid)]);
//!
//! let failed = testing::event("stripe", "evt_2", "charge.failed", b"{}");
//! assert!(testing::handle(&store, &Record, &failed).await.unwrap_err().is_fatal());
//!
//! // The first committed; the second rolled back with its error.
//! let seen: Vec<String> = sqlx::query_scalar("SELECT event_id FROM seen")
//!     .fetch_all(pool)
//!     .await
//!     .unwrap();
//! assert_eq!(seen, ["evt_1"]);
//! # drop(store);
//! db.remove().await;
//! # }
//! ```

mod app;
mod db;
pub mod fault_proxy;
mod signing;

pub use app::{test_settings, TestApp, TEST_SECRET};
pub use db::{pg_admin_url, TestDb, DEFAULT_POSTGRES, POSTGRES_VAR};
pub use signing::{post_signed, post_signed_until_not_503, stripe_event, stripe_event_with};

/// What the kit hands out and takes, nameable where the kit is (`dedup_worker::testing::…`) without
/// reaching into the engine: the store a test database opens ([`TestDb::store`], its pools for
/// the handler's own tables) and the settings an application runs on ([`test_settings`],
/// [`TestApp::spawn`]).
pub use crate::config::Settings;
use crate::consumer::{Handler, HandlerError};
use crate::event::{check_event_field, Event, EventField};
use crate::outbox::OutboxMessage;
/// Which store a test runs on (the store's own [`crate::store::Backend`]).
pub use crate::store::Backend;
pub use crate::store::Store;

/// An event as the consumer hands it to a handler: `source` and `id` its dedup key,
/// `event_type`, `payload` the body as received, on its first delivery.
///
/// # Panics
///
/// When a field is one the consumer would refuse (empty source or id, over 255 bytes, a NUL):
/// such an event is dead-lettered before any handler sees it.
pub fn event(source: &str, id: &str, event_type: &str, payload: &[u8]) -> Event {
    for (field, value) in [
        (EventField::Source, source),
        (EventField::Id, id),
        (EventField::Type, event_type),
    ] {
        if let Err(refused) = check_event_field(field, value) {
            panic!("the consumer would refuse this event: {refused}");
        }
    }
    Event {
        source: source.to_owned(),
        id: id.to_owned(),
        event_type: event_type.to_owned(),
        payload: bytes::Bytes::copy_from_slice(payload),
        delivery_attempt: 1,
        alias: None,
        headers: crate::event::SenderHeaders::default(),
    }
}

/// Runs `handler` on `event` in one transaction of `store`, through the connection the
/// consumer gives it ([`Store::begin`], [`StoreTx::conn`](crate::store::StoreTx::conn)):
/// committed when it returns `Ok`, rolled back when it returns `Err`, so a test reads afterwards
/// exactly what the consumer would have left. Returns what the handler returned: the messages
/// the consumer would write to the outbox, or its error (whose variant decides between a retry
/// and the dead letters).
///
/// Only the handler runs: no dedup row is written (a second call handles the event again;
/// [`TestApp`] shows redeliveries absorbed), no outbox row, and a panic is the test's. A
/// failure to begin or commit is returned as the consumer classifies it (retryable).
///
/// # Panics
///
/// When `handler` does not run on `store`'s backend ([`Handler::backends`]), which
/// `Application::build` refuses at start.
pub async fn handle(
    store: &Store,
    handler: &dyn Handler,
    event: &Event,
) -> Result<Vec<OutboxMessage>, HandlerError> {
    let backend = store.backend();
    assert!(
        handler.backends().contains(&backend),
        "the handler runs on {:?} only (Handler::backends), and this store is {backend}",
        handler.backends()
    );
    let mut tx = store.begin().await?;
    let handled = handler.handle(event, &mut tx.conn()).await;
    match &handled {
        Ok(_) => tx.commit().await?,
        Err(_) => tx.rollback().await?,
    }
    handled
}

#[cfg(test)]
mod tests {
    #[test]
    #[should_panic(expected = "the consumer would refuse this event")]
    fn an_event_the_consumer_refuses_is_not_built() {
        super::event("stripe", "", "invoice.paid", b"{}");
    }

    #[test]
    fn an_event_is_on_its_first_delivery() {
        let event = super::event("stripe", "evt_1", "invoice.paid", b"{\"id\":\"evt_1\"}");
        assert_eq!(
            (
                event.source.as_str(),
                event.id.as_str(),
                event.delivery_attempt
            ),
            ("stripe", "evt_1", 1)
        );
        assert_eq!(&event.payload[..], b"{\"id\":\"evt_1\"}");
    }
}
