//! The transactions the layer opens for handlers ([`IdempotentTx`](crate::IdempotentTx), phases),
//! on connections of the store's pool that the store keeps between transactions.
//!
//! Why not `pool.begin()`: sqlx pings every connection given back to its pool (one more round
//! trip, and a task), and by default every connection it lends. A transactional request is
//! otherwise four round trips (`BEGIN`, the handler's statement, the completion, `COMMIT`), so the
//! pings were a fifth of its PostgreSQL work on a CPU-bound machine. Here a finished transaction's
//! connection stays checked out of the pool, idle in [`KeptConnections`], and the next
//! transaction takes it from there: no ping either way.
//!
//! What keeps this safe:
//! - `BEGIN`, `COMMIT` and `ROLLBACK` go through sqlx's own transaction manager, so the
//!   connection knows its depth: a handler that begins a transaction of its own on it gets a
//!   savepoint, as on a sqlx `Transaction`, and its commit cannot end the request's;
//! - a connection goes back to the kept set only after a `COMMIT` or `ROLLBACK` that PostgreSQL
//!   answered, at depth 0; a transaction dropped while open or while beginning (a panic, a
//!   cancelled future, a failed or timed-out commit) closes its connection, so no later
//!   transaction or statement can run inside it;
//! - a kept connection may have died while idle (PostgreSQL restarted, a proxy cut it), or its
//!   session reset may fail: its `BEGIN` fails having done nothing, the connection is closed,
//!   and the transaction begins on a connection from the pool (and once more on another if that
//!   one died idle in the pool, which lends without a ping when built so);
//! - what [`KeptConnections`] guarantees of a kept connection: its session is reset to the one
//!   the pool lent before it serves another transaction (and so is a pool connection's, which
//!   may have served a request before it went back), no waiter on the pool goes without a
//!   connection while one is kept, and none is kept for more than a minute.

use std::borrow::Cow;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{PgConnection, PgPool, Postgres, TransactionManager};

use super::kept::{Kept, KeptConnections};

/// A transaction on a kept or pooled connection. Use it as a connection; end it with
/// [`commit`](Self::commit) or [`rollback`](Self::rollback). Dropped while open, it closes its
/// connection and PostgreSQL rolls back.
#[derive(Debug)]
pub(crate) struct RequestTx {
    /// `Some` until the transaction ends.
    conn: Option<PoolConnection<Postgres>>,
    /// When the connection left the pool (see [`KeptConnections`]).
    out_since: Instant,
    /// Where the connection goes when the transaction has ended cleanly.
    kept: Arc<KeptConnections>,
}

impl RequestTx {
    /// Begins on a kept connection (its session reset in the same round trip), or on one from
    /// `pool`; a kept connection that fails its `BEGIN` (it died idle, or its reset failed) is
    /// closed and costs one more `BEGIN` on a connection from the pool, not the request.
    pub(crate) async fn begin(
        pool: &PgPool,
        kept: &Arc<KeptConnections>,
    ) -> Result<Self, sqlx::Error> {
        if pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        if let Some((conn, reset_and_begin)) = kept.take() {
            match Self::begin_on(conn, kept, Some(reset_and_begin)).await {
                Ok(tx) => return Ok(tx),
                // Logged: a reset that keeps failing would cost a connection each time.
                Err(e) => tracing::warn!(error = %e, "a kept connection failed its BEGIN; closed"),
            }
        }
        match Self::begin_fresh(pool, kept).await {
            Err(e) if connection_lost(&e) => Self::begin_fresh(pool, kept).await,
            begun => begun,
        }
    }

    /// Begins on a connection from the pool, its session reset as a kept one's is; the first such
    /// connection of the store tells what every request transaction's session goes back to.
    async fn begin_fresh(pool: &PgPool, kept: &Arc<KeptConnections>) -> Result<Self, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        if let Err(e) = kept.learn_session(&mut conn).await {
            if connection_lost(&e) {
                return Err(e);
            }
            tracing::warn!(
                error = %e,
                "reading the session a pool connection is lent with failed; not keeping connections yet"
            );
        }
        // Reset like a kept one: it may have served a request before it went back to the pool.
        let reset = kept.reset_and_begin();
        Self::begin_on((conn, Instant::now()), kept, reset).await
    }

    async fn begin_on(
        (conn, out_since): Kept,
        kept: &Arc<KeptConnections>,
        statement: Option<Cow<'static, str>>,
    ) -> Result<Self, sqlx::Error> {
        // Held by the transaction before `BEGIN` is sent: if this future is dropped mid-way, or
        // `BEGIN` fails, dropping it closes the connection, whatever state it was left in.
        let mut tx = RequestTx {
            conn: Some(conn),
            out_since,
            kept: kept.clone(),
        };
        PgTransactionManager::begin(&mut tx, statement).await?;
        Ok(tx)
    }

    /// Commits; the connection is kept for the next transaction. Only at depth 1: at depth 2 or
    /// more a handler left a transaction of its own open (a sqlx `Transaction` forgotten, not
    /// dropped), and `COMMIT` would only release its savepoint, leaving the request's
    /// transaction to be rolled back when the connection closes. Then every level is rolled back
    /// and the answer is [`CommitError::Depth`]. On a database error the outcome is
    /// PostgreSQL's to tell (the connection is closed, as by dropping an open transaction).
    pub(crate) async fn commit(mut self) -> Result<(), CommitError> {
        let depth = PgTransactionManager::get_transaction_depth(&self);
        if depth != 1 {
            while PgTransactionManager::get_transaction_depth(&self) > 0 {
                PgTransactionManager::rollback(&mut self).await?;
            }
            self.release();
            return Err(CommitError::Depth(depth));
        }
        PgTransactionManager::commit(&mut self).await?;
        self.release();
        Ok(())
    }

    /// Fails if the transaction is aborted (a statement in it failed, and the handler went on):
    /// PostgreSQL would answer its `COMMIT` with `ROLLBACK`, which sqlx reports as success. One
    /// statement, for transactions that have no statement of the layer's own before the commit
    /// (a keyless request's: a keyed one's completion fails in an aborted transaction).
    pub(crate) async fn check_not_aborted(&mut self) -> Result<(), CommitError> {
        match sqlx::query("SELECT 1").execute(&mut **self).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some(IN_FAILED_TRANSACTION) =>
            {
                Err(CommitError::Aborted(sqlx::Error::Database(db)))
            }
            Err(e) => Err(CommitError::Database(e)),
        }
    }

    /// Rolls back; the connection is kept for the next transaction.
    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        PgTransactionManager::rollback(&mut self).await?;
        self.release();
        Ok(())
    }

    /// After an answered `COMMIT` or `ROLLBACK`: kept if it is outside any transaction (a
    /// savepoint a handler left open would make it not), else closed by `drop`. A cancelled or
    /// failed end never gets here, and `drop` closes the connection too.
    fn release(&mut self) {
        if PgTransactionManager::get_transaction_depth(self) == 0 {
            if let Some(conn) = self.conn.take() {
                self.kept.put((conn, self.out_since));
            }
        }
    }
}

impl Deref for RequestTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_deref()
            .expect("an open RequestTx holds its connection")
    }
}

impl DerefMut for RequestTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("an open RequestTx holds its connection")
    }
}

impl Drop for RequestTx {
    fn drop(&mut self) {
        // Still open: closing the connection is the rollback, and keeps it from serving anyone
        // inside this transaction.
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// SQLSTATE 25P02: a statement in the transaction failed; every later one is refused.
const IN_FAILED_TRANSACTION: &str = "25P02";

/// Why a request's transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitError {
    /// PostgreSQL refused or did not answer (the outcome is its to tell).
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A handler left a transaction of its own open on the request's: nothing was committed.
    #[error("the request's transaction was at depth {0} at its commit, not 1 (a handler left its own transaction open); rolled back")]
    Depth(usize),
    /// A statement in the transaction failed and the handler went on: nothing was committed.
    #[error("the request's transaction had failed (a handler went on after an error in it); rolled back")]
    Aborted(#[source] sqlx::Error),
}

impl CommitError {
    /// The handler misused its transaction: a retry runs into the same, so the answer is 500
    /// rather than 503.
    pub(crate) fn handlers_fault(&self) -> bool {
        matches!(self, CommitError::Depth(_) | CommitError::Aborted(_))
    }
}

/// The connection is gone, not the statement refused: the socket failed, or the server said it
/// is ending the session (SQLSTATE class 08, connection exception, or 57P, operator
/// intervention: `pg_terminate_backend`, a shutdown).
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}
