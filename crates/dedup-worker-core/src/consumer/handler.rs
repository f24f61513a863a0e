//! The public [`Handler`] trait and the two built-in handlers.
//!
//! A handler runs once per *new* event, inside the consumer's batch transaction (in a savepoint
//! of its own when needed), and must do all its work through the connection it is given: its
//! writes commit together with the dedup row and the outbox rows, or not at all. Effects outside
//! the database belong in the outbox ([`OutboxMessage`]), which the relay delivers after commit.
//!
//! # Example: a handler that writes its own table
//!
//! ```
//! use async_trait::async_trait;
//! use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
//! use dedup_worker_core::event::Event;
//! use dedup_worker_core::store::DbTx;
//!
//! /// Credits an account for each `payment_intent.succeeded`, exactly once.
//! struct CreditAccount;
//!
//! #[async_trait]
//! impl Handler for CreditAccount {
//!     async fn handle(&self, event: &Event, tx: &mut DbTx<'_>) -> Result<Vec<OutboxMessage>, HandlerError> {
//!         if event.event_type != "payment_intent.succeeded" {
//!             return Ok(Vec::new());
//!         }
//!         // Same transaction as the dedup row: a redelivered event never credits twice, and
//!         // a crash before commit leaves neither the credit nor the "processed" mark.
//!         // Written once, run on whichever store this is (PostgreSQL or SQLite).
//!         dedup_worker_core::with_connection!(tx, |conn| {
//!             sqlx::query("INSERT INTO credits (event_id) VALUES ($1)")
//!                 .bind(&event.id)
//!                 .execute(&mut **conn)
//!                 .await
//!                 .map(|done| done.rows_affected()) // the same type on both stores
//!         })?;
//!         // And tell the rest of the world through the outbox, delivered after commit.
//!         Ok(vec![OutboxMessage::forward(event)])
//!     }
//! }
//! ```
//! [`LedgerHandler`] is the same pattern, shipped and tested (`consumer.handler = "ledger"`).

use async_trait::async_trait;

pub use super::error::{HandlerError, HandlerResultExt};
use crate::event::Event;
use crate::outbox::OutboxMessage;
use crate::store::{Backend, DbTx};

/// Business logic run once per new event.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `event` inside the batch transaction `tx`; returns what to deliver after commit.
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError>;

    /// The stores this handler's SQL runs on. [`Application::build`] refuses to start on any
    /// other, so a handler written for PostgreSQL alone (through [`DbTx::postgres`]) fails at
    /// start on SQLite instead of dead-lettering every event.
    ///
    /// [`Application::build`]: crate::startup::Application::build
    fn backends(&self) -> &'static [Backend] {
        Backend::ALL
    }
}

/// A shared handler is a handler: a service (or a test) keeps an `Arc` of its own to read the
/// handler's state while the consumer runs it.
#[async_trait]
impl<H: Handler + ?Sized> Handler for std::sync::Arc<H> {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        (**self).handle(event, tx).await
    }

    fn backends(&self) -> &'static [Backend] {
        (**self).backends()
    }
}

/// The built-in handler: forward every new event to the sink.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForwardHandler;

#[async_trait]
impl Handler for ForwardHandler {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        Ok(vec![OutboxMessage::forward(event)])
    }
}

/// The documented example: records each event in `event_ledger` (which deliberately has no
/// unique key, so a double effect would show as two rows), then forwards it.
#[derive(Debug, Default, Clone, Copy)]
pub struct LedgerHandler;

#[async_trait]
impl Handler for LedgerHandler {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        const SQL: &str =
            "INSERT INTO event_ledger (source, event_id, event_type) VALUES ($1, $2, $3)";
        crate::with_connection!(tx, |conn| {
            sqlx::query(SQL)
                .bind(&event.source)
                .bind(&event.id)
                .bind(&event.event_type)
                .execute(&mut **conn)
                .await
                .map(|done| done.rows_affected())
        })?;
        Ok(vec![OutboxMessage::forward(event)])
    }
}
