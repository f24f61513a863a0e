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
//! - a kept connection may have died while idle (PostgreSQL restarted, a proxy cut it): its
//!   `BEGIN` fails having done nothing, and the transaction begins once more on a connection from
//!   the pool;
//! - a store keeps at most a quarter of its pool's connections, and none while the pool has no
//!   idle connection and no room for another: whoever waits on the pool (the store's own
//!   single-row statements, the application) gets the next connection a transaction ends with;
//! - a connection is kept for at most [`KEEP_AT_MOST`] after it left the pool, then given back:
//!   the pool's own checks (its ping, `max_lifetime`) see every connection at least that often,
//!   so one that still answers but should not be used (a primary turned read-only replica
//!   behind a proxy) is not reused for ever; idle ones are given back on that clock too.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{PgConnection, PgPool, Postgres, TransactionManager};

/// The longest a connection stays out of the pool between request transactions.
pub(crate) const KEEP_AT_MOST: Duration = Duration::from_secs(60);

/// A connection out of the pool, and when it left it.
type Kept = (PoolConnection<Postgres>, Instant);

/// Connections checked out of the pool and kept between request transactions.
pub(crate) struct KeptConnections {
    /// Idle connections, each outside any transaction.
    idle: Mutex<Vec<Kept>>,
    /// At most this many are kept idle (a quarter of the pool); more go back to the pool.
    cap: usize,
    /// The pool they are checked out of. `Pool::close` waits for every checked-out connection,
    /// kept ones included, so they are given back once it is closing.
    pool: PgPool,
    /// The task that gives them back when the pool closes, started with the first kept
    /// connection (inside the runtime).
    watching: Once,
}

impl std::fmt::Debug for KeptConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnections")
            .field("idle", &self.idle().len())
            .field("cap", &self.cap)
            .finish()
    }
}

impl KeptConnections {
    pub(crate) fn for_pool(pool: &PgPool) -> Self {
        KeptConnections {
            idle: Mutex::new(Vec::new()),
            cap: pool.options().get_max_connections() as usize / 4,
            pool: pool.clone(),
            watching: Once::new(),
        }
    }

    /// Gives kept connections back to the pool: those out of it for [`KEEP_AT_MOST`], every
    /// [`KEEP_AT_MOST`], and all of them once the pool is closing. One task per store, started
    /// in the runtime of the first transaction; it holds only a weak reference, so a store
    /// dropped first ends it at its next tick.
    fn watch(self: &Arc<Self>) {
        self.watching.call_once(|| {
            let closing = self.pool.close_event();
            let kept = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::pin!(closing);
                let mut tick = tokio::time::interval(KEEP_AT_MOST);
                loop {
                    tokio::select! {
                        _ = &mut closing => {
                            if let Some(kept) = kept.upgrade() {
                                kept.idle().clear();
                            }
                            return;
                        }
                        _ = tick.tick() => match kept.upgrade() {
                            Some(kept) => kept.idle().retain(|(_, out)| out.elapsed() < KEEP_AT_MOST),
                            None => return,
                        },
                    }
                }
            });
        });
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // A poisoned lock only means a panic elsewhere while it was held; the list is still a
        // list of idle connections.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently kept connection still within [`KEEP_AT_MOST`]; older ones go back.
    fn take(&self) -> Option<Kept> {
        let mut idle = self.idle();
        while let Some(kept) = idle.pop() {
            if kept.1.elapsed() < KEEP_AT_MOST {
                return Some(kept);
            }
        }
        None
    }

    /// The pool could lend no connection now: none idle, and no room to open one.
    fn pool_exhausted(&self) -> bool {
        self.pool.num_idle() == 0 && self.pool.size() >= self.pool.options().get_max_connections()
    }

    /// Keeps `conn` (outside any transaction) for the next transaction, or gives it back to the
    /// pool: when the set is full, the connection has been out for [`KEEP_AT_MOST`], or the pool
    /// has nothing to lend to whoever may be waiting on it.
    fn put(self: &Arc<Self>, conn: Kept) {
        if self.cap == 0 || conn.1.elapsed() >= KEEP_AT_MOST || self.pool_exhausted() {
            return;
        }
        self.watch();
        let mut idle = self.idle();
        if idle.len() < self.cap {
            idle.push(conn);
        }
        // Closing began after the watcher cleared the set, or before it runs: either way
        // nothing stays kept (`close` marks the pool closed before it wakes the watcher).
        if self.pool.is_closed() {
            idle.clear();
        }
        // Otherwise `conn` is dropped: back to the pool, with sqlx's ping.
    }
}

/// A transaction on a kept or pooled connection. Use it as a connection; end it with
/// [`commit`](Self::commit) or [`rollback`](Self::rollback). Dropped while open, it closes its
/// connection and PostgreSQL rolls back.
#[derive(Debug)]
pub(crate) struct RequestTx {
    /// `Some` until the transaction ends.
    conn: Option<PoolConnection<Postgres>>,
    /// When the connection left the pool (see [`KEEP_AT_MOST`]).
    out_since: Instant,
    /// Where the connection goes when the transaction has ended cleanly.
    kept: Arc<KeptConnections>,
}

impl RequestTx {
    /// Begins on a kept connection, or on one from `pool`; a connection found dead costs one more
    /// `BEGIN` on a connection from the pool, not the request.
    pub(crate) async fn begin(
        pool: &PgPool,
        kept: &Arc<KeptConnections>,
    ) -> Result<Self, sqlx::Error> {
        if pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        let first = match kept.take() {
            Some(kept) => kept,
            None => (pool.acquire().await?, Instant::now()),
        };
        match Self::begin_on(first, kept).await {
            Err(e) if connection_lost(&e) => {
                Self::begin_on((pool.acquire().await?, Instant::now()), kept).await
            }
            begun => begun,
        }
    }

    async fn begin_on(
        (conn, out_since): Kept,
        kept: &Arc<KeptConnections>,
    ) -> Result<Self, sqlx::Error> {
        // Held by the transaction before `BEGIN` is sent: if this future is dropped mid-way, or
        // `BEGIN` fails, dropping it closes the connection, whatever state it was left in.
        let mut tx = RequestTx {
            conn: Some(conn),
            out_since,
            kept: kept.clone(),
        };
        PgTransactionManager::begin(&mut tx, None).await?;
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
