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
//! use dedup_worker::consumer::{Handler, HandlerError, OutboxMessage};
//! use dedup_worker::event::Event;
//! use dedup_worker::store::DbTx;
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
//!         dedup_worker::with_connection!(tx, |conn| {
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

use crate::error::Cause;
use crate::event::Event;
use crate::outbox::OutboxMessage;
use crate::store::{DbTx, StoreError};

/// Why a handler failed. The consumer decides what happens next from the variant.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth trying again later (a lock timeout, a dependency down): redelivered with backoff
    /// until `consumer.max_attempts`, then dead-lettered.
    #[error("retryable: {0}")]
    Retryable(#[source] Cause),
    /// Will never succeed (malformed payload, unknown account): dead-lettered at once.
    #[error("fatal: {0}")]
    Fatal(#[source] Cause),
}

/// A statement the database refused for the values it carried fails again on every retry, so
/// it is fatal (dead-lettered at once); anything else (a lost connection, a deadlock, a lock
/// timeout) is retryable.
impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        let fatal = crate::retry::refused_for_its_data(&e);
        let cause = Cause::new(e.to_string(), e);
        if fatal {
            HandlerError::Fatal(cause)
        } else {
            HandlerError::Retryable(cause)
        }
    }
}

impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        let fatal = e.refused_for_its_data();
        let cause = Cause::new(e.to_string(), e);
        if fatal {
            HandlerError::Fatal(cause)
        } else {
            HandlerError::Retryable(cause)
        }
    }
}

/// Business logic run once per new event.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `event` inside the batch transaction `tx`; returns what to deliver after commit.
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError>;
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
