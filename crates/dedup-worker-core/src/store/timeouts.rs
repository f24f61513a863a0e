//! Bounds on every wait for the database, on both sides of the connection: the client's own
//! ([`bounded`]), for a server that stops answering altogether, and the server's
//! ([`ServerTimeouts`]), which free its locks when the client cannot.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::StoreError;
use crate::config::Settings;

/// Awaits one store call for at most `limit`: a database that stops answering mid-statement (a
/// partition, a hung host: the connection stays open and nothing comes back) is an error after
/// `limit`, not a wait until TCP gives up. Whether a write that timed out took effect is
/// unknown; callers treat it like a lost connection.
pub async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or(Err(StoreError::TimedOut(limit)))
}

/// PostgreSQL's own bounds on the service's sessions. They free the server when the client
/// cannot: a statement stuck behind a lock is cancelled, and a transaction whose client
/// vanished mid-way (a partition, a process paused or cut off by a black-holed network) is
/// ended with its session, releasing its row locks, which would otherwise hold every other
/// worker's insert of the same event ids until TCP gave up, hours later.
#[derive(Debug, Clone, Copy)]
pub struct ServerTimeouts {
    /// `statement_timeout`: `database.statement_timeout`.
    pub statement: Duration,
    /// `idle_in_transaction_session_timeout`: the consumer's step timeout, by which the client
    /// has given the transaction up itself.
    pub idle_in_transaction: Duration,
}

impl ServerTimeouts {
    pub fn from_settings(settings: &Settings) -> Self {
        ServerTimeouts {
            statement: settings.database.statement_timeout,
            idle_in_transaction: settings.consumer.step_timeout,
        }
    }

    pub(super) fn apply(self, options: PgConnectOptions) -> PgConnectOptions {
        options.options([
            ("statement_timeout", pg_millis(self.statement)),
            (
                "idle_in_transaction_session_timeout",
                pg_millis(self.idle_in_transaction),
            ),
        ])
    }
}

/// A duration as PostgreSQL reads a bare number for these settings: milliseconds, at least 1
/// (0 would mean no limit).
fn pg_millis(duration: Duration) -> String {
    duration.as_millis().max(1).to_string()
}
