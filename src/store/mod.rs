//! The store: PostgreSQL in production, SQLite as the embedded default.
//!
//! Owns every SQL statement of the pipeline (dedup record, outbox, dead letters, database queue)
//! and the migrations. Both backends give the same guarantees, checked by one contract test
//! suite (`tests/store_contract.rs`):
//! * `insert_processed` returns only the ids that were not there before, inside the caller's
//!   transaction, so "seen" and "handled" commit together;
//! * queue and outbox claims lease rows; an expired lease makes them claimable again;
//! * each claim writes a fresh claim token on its rows, and outbox marks and queue releases
//!   apply only under the token of the caller's claim: a relay or consumer whose lease expired
//!   and was taken over changes nothing, and is told so (0 rows);
//! * writers that take a transaction never commit it themselves.

mod postgres;
mod rows;
mod sqlite;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use tokio::sync::Notify;

use crate::config::Settings;

pub use rows::{
    DeadLetter, NewDeadLetter, NewOutboxRow, NewQueueMessage, OutboxClaim, OutboxCounts, OutboxRow,
    QueuedMessage,
};

/// A store failure. Every variant is "try again later" for callers: ingress answers 503, the
/// consumer leaves the batch unacked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A statement the caller bounded did not answer in time (a database that stopped
    /// answering); whether it took effect is unknown.
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
    #[error("cannot create the SQLite directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
}

impl StoreError {
    /// The database refused the statement for the values it carried (see
    /// [`crate::retry::refused_for_its_data`]): retrying it unchanged cannot succeed.
    pub fn refused_for_its_data(&self) -> bool {
        matches!(self, StoreError::Database(e) if crate::retry::refused_for_its_data(e))
    }
}

/// In-process wake-ups. PostgreSQL also feeds them from LISTEN/NOTIFY so other processes' writes
/// wake this one; SQLite has only the in-process signal and the polling fallback.
#[derive(Debug, Default)]
pub struct Wakeups {
    /// Something was enqueued on the database queue.
    pub queue: Notify,
    /// Outbox rows were committed.
    pub outbox: Notify,
}

/// Names of the LISTEN/NOTIFY channels.
pub const QUEUE_CHANNEL: &str = "dedup_queue";
pub const OUTBOX_CHANNEL: &str = "dedup_outbox";

/// Calls the backend module's function of the same name with the pool.
macro_rules! on_pool {
    ($store:expr, $func:ident($($arg:expr),*)) => {
        match $store {
            Store::Postgres(pool) => postgres::$func(pool, $($arg),*).await,
            Store::Sqlite(pool) => sqlite::$func(pool, $($arg),*).await,
        }
    };
}

/// Calls the backend module's function of the same name with the open transaction.
macro_rules! on_tx {
    ($tx:expr, $func:ident($($arg:expr),*)) => {
        match $tx {
            StoreTx::Postgres(tx) => postgres::$func(tx, $($arg),*).await,
            StoreTx::Sqlite(tx) => sqlite::$func(tx, $($arg),*).await,
        }
    };
}

/// Runs the same expression on whichever transaction this is (SQL both backends share).
macro_rules! either_tx {
    ($tx:expr, |$conn:ident| $body:expr) => {
        match $tx {
            StoreTx::Postgres($conn) => $body,
            StoreTx::Sqlite($conn) => $body,
        }
    };
}

/// A connection pool to one of the two backends.
#[derive(Debug, Clone)]
pub enum Store {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

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
    /// `statement_timeout`: `database.statement_timeout_ms`.
    pub statement: Duration,
    /// `idle_in_transaction_session_timeout`: the consumer's step timeout, by which the client
    /// has given the transaction up itself.
    pub idle_in_transaction: Duration,
}

impl ServerTimeouts {
    pub fn from_settings(settings: &Settings) -> Self {
        ServerTimeouts {
            statement: Duration::from_millis(settings.database.statement_timeout_ms),
            idle_in_transaction: Duration::from_millis(settings.consumer.step_timeout_ms),
        }
    }

    fn apply(self, options: PgConnectOptions) -> PgConnectOptions {
        options.options([
            ("statement_timeout", pg_millis(self.statement)),
            (
                "idle_in_transaction_session_timeout",
                pg_millis(self.idle_in_transaction),
            ),
        ])
    }

    /// Lifts both on one session (0: no limit).
    const LIFT: &'static str =
        "SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0";
}

/// A duration as PostgreSQL reads a bare number for these settings: milliseconds, at least 1
/// (0 would mean no limit).
fn pg_millis(duration: Duration) -> String {
    duration.as_millis().max(1).to_string()
}

/// An open transaction. Dropping it without [`StoreTx::commit`] rolls back.
#[derive(Debug)]
pub enum StoreTx {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

/// The connection a handler writes through: the batch transaction (inside a savepoint).
#[derive(Debug)]
pub enum DbTx<'a> {
    Postgres(&'a mut sqlx::PgConnection),
    Sqlite(&'a mut sqlx::SqliteConnection),
}

impl Store {
    /// Connects (creating the SQLite file and its directory when needed). On PostgreSQL every
    /// connection carries the server-side bounds of [`ServerTimeouts::from_settings`].
    pub async fn connect(settings: &Settings) -> Result<Self, StoreError> {
        Self::connect_with(
            &settings.database_url,
            settings.database.max_connections,
            Duration::from_millis(settings.database.acquire_timeout_ms),
            Some(ServerTimeouts::from_settings(settings)),
        )
        .await
    }

    /// Connects without server-side timeouts (tests and tools that inspect a store).
    pub async fn connect_url(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, acquire_timeout, None).await
    }

    async fn connect_with(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
        server_timeouts: Option<ServerTimeouts>,
    ) -> Result<Self, StoreError> {
        if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                // WAL lets readers run beside the one writer; NORMAL is durable at each commit
                // in WAL mode except on power loss of the OS, FULL survives that too.
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            let filename = options.get_filename().to_path_buf();
            if let Some(dir) = filename.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                    path: dir.display().to_string(),
                    source,
                })?;
            }
            let pool = PoolOptions::new()
                .max_connections(max_connections.min(8))
                .acquire_timeout(acquire_timeout)
                .connect_with(options)
                .await?;
            Ok(Store::Sqlite(pool))
        } else {
            let mut options = PgConnectOptions::from_str(url)?;
            if let Some(timeouts) = server_timeouts {
                options = timeouts.apply(options);
            }
            let pool = PoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(acquire_timeout)
                .connect_with(options)
                .await?;
            Ok(Store::Postgres(pool))
        }
    }

    /// Applies pending migrations. On PostgreSQL they run on a connection of their own with
    /// the statement and transaction timeouts lifted: a migration that rewrites a large table
    /// may rightly take longer than any pipeline statement.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Postgres(pool) => {
                // Taken from the pool (so within its acquire timeout) and detached: a session
                // with the limits lifted must not serve the pipeline afterwards. Dropping it
                // closes the socket without waiting for the server.
                let mut conn = pool.acquire().await?.detach();
                sqlx::raw_sql(ServerTimeouts::LIFT)
                    .execute(&mut conn)
                    .await?;
                let migrated = sqlx::migrate!("migrations/postgres").run(&mut conn).await;
                drop(conn);
                migrated?
            }
            Store::Sqlite(pool) => sqlx::migrate!("migrations/sqlite").run(pool).await?,
        }
        Ok(())
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgres",
            Store::Sqlite(_) => "sqlite",
        }
    }

    /// One round trip: is the store answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Store::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
            Store::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
        }
        Ok(())
    }

    pub async fn begin(&self) -> Result<StoreTx, StoreError> {
        Ok(match self {
            Store::Postgres(pool) => StoreTx::Postgres(pool.begin().await?),
            Store::Sqlite(pool) => StoreTx::Sqlite(pool.begin().await?),
        })
    }

    /// Forwards PostgreSQL notifications to `wakeups` until the pool closes. A no-op on SQLite.
    pub fn spawn_listener(&self, wakeups: Arc<Wakeups>) -> Option<tokio::task::JoinHandle<()>> {
        match self {
            Store::Postgres(pool) => Some(tokio::spawn(postgres::listen(pool.clone(), wakeups))),
            Store::Sqlite(_) => None,
        }
    }

    // --- database queue -------------------------------------------------------------------

    /// Writes all messages in one transaction (one commit for the whole group).
    pub async fn enqueue(
        &self,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        on_pool!(self, enqueue(queue, messages))
    }

    /// Leases up to `max` visible messages for `lease`, under a fresh claim token.
    pub async fn claim_messages(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        on_pool!(self, claim_messages(queue, max, lease, new_claim_token()))
    }

    /// Deletes acknowledged messages, whoever holds their lease now. Unlike a release this
    /// needs no claim token: a consumer acks only after committing the event's outcome (its
    /// processed id, or its dead letter), so the event is safe whatever becomes of the message.
    /// A consumer that re-claimed it after this one's lease expired would find the processed id
    /// (its dedup insert waits for, then yields to, this one's) and ack it as a duplicate, or
    /// dead-letter it a second time; deleting it under that consumer loses nothing and spares
    /// that work.
    pub async fn ack_messages(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        on_pool!(self, ack_messages(ids))
    }

    /// Makes a message visible again after `delay` (redelivery with backoff), if it is still
    /// under the claim `claim_token`. Returns the rows released: 0 when another consumer has
    /// claimed the message since (it holds the lease now; moving its visibility would let a
    /// third consumer take it early, or delay it by a backoff it did not earn), or it was acked.
    pub async fn release_message(
        &self,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        on_pool!(self, release_message(id, claim_token, delay))
    }

    /// Extends the lease of messages `ids` still under the claim `claim_token` to `lease` from
    /// now (the consumer's heartbeat while it works on them). Returns the ids extended: one
    /// missing was claimed by another consumer since (its lease had run out), or was acked.
    pub async fn extend_message_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        on_pool!(self, extend_message_leases(claim_token, ids, lease))
    }

    /// Messages on `queue`, leased or not.
    pub async fn queue_depth(&self, queue: &str) -> Result<i64, StoreError> {
        on_pool!(self, queue_depth(queue))
    }

    // --- outbox relay ---------------------------------------------------------------------

    /// Leases up to `max` due pending rows for `lease` (FOR UPDATE SKIP LOCKED on PostgreSQL),
    /// under a fresh claim token.
    pub async fn claim_outbox(
        &self,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        on_pool!(self, claim_outbox(max, lease, new_claim_token()))
    }

    /// Marks rows dispatched, each only if it still carries the token of `claims`. Returns how
    /// many are marked; the others were claimed by another relay since (see [`OutboxClaim`]).
    /// Marking again under the same claim counts the row again and changes nothing, so a mark
    /// retried after an outage that hid its commit is not mistaken for a lost lease.
    pub async fn mark_dispatched(&self, claims: &[OutboxClaim]) -> Result<u64, StoreError> {
        if claims.is_empty() {
            return Ok(0);
        }
        on_pool!(self, mark_dispatched(claims))
    }

    /// Extends the lease of pending rows `ids` still under the claim `claim_token` to `lease`
    /// from now (the relay's heartbeat while it delivers them). Returns the ids extended: one
    /// missing was claimed by another relay since (its lease had run out), or is marked already.
    pub async fn extend_outbox_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        on_pool!(self, extend_outbox_leases(claim_token, ids, lease))
    }

    /// Makes pending rows `ids` still under the claim `claim_token` due now: a relay that stops
    /// before delivering them gives them back, so the next relay need not wait out the lease.
    /// Returns the rows released (rows marked meanwhile, or claimed by another relay, are not).
    pub async fn release_outbox_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        on_pool!(self, release_outbox_leases(claim_token, ids))
    }

    /// Records a failed delivery under `claim`: retried after `delay`, or marked failed once
    /// `attempts` reached `max_attempts`. Returns 1, or 0 if another relay claimed the row since
    /// (its own delivery decides the row's fate) or it is no longer pending.
    pub async fn mark_delivery_failed(
        &self,
        claim: OutboxClaim,
        error: &str,
        delay: Duration,
        max_attempts: u32,
    ) -> Result<u64, StoreError> {
        on_pool!(
            self,
            mark_delivery_failed(claim, error, delay, max_attempts)
        )
    }

    pub async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        on_pool!(self, outbox_counts())
    }

    /// Rows that exhausted their delivery attempts.
    pub async fn failed_outbox(&self, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
        on_pool!(self, failed_outbox(limit))
    }

    // --- retention ------------------------------------------------------------------------

    /// Deletes at most `batch` processed ids older than `older_than`, and at most `batch`
    /// dispatched outbox rows older than `outbox_older_than`. On PostgreSQL only one worker at a
    /// time does this (an advisory lock); the others return 0 at once.
    pub async fn purge_expired(
        &self,
        older_than: Duration,
        outbox_older_than: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        on_pool!(self, purge_expired(older_than, outbox_older_than, batch))
    }

    // --- dead letters ---------------------------------------------------------------------

    pub async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
        on_pool!(self, dead_letters(limit))
    }

    /// Up to `limit` dead letters with an id above `after`, in id order: those in `ids`, or
    /// all when `ids` is empty (a redrive pages through them).
    pub async fn dead_letters_selected(
        &self,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        on_pool!(self, dead_letters_selected(ids, after, limit))
    }

    /// Deletes one dead letter (after its redrive was published); returns the rows deleted.
    pub async fn delete_dead_letter(&self, id: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM dead_letters WHERE id = $1";
        Ok(match self {
            Store::Postgres(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
            Store::Sqlite(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }
}

impl StoreTx {
    /// Records `(source, id)` pairs; returns the ids that were new. Duplicates within `events`
    /// count once.
    pub async fn insert_processed(
        &mut self,
        source: &str,
        events: &[(String, String)],
    ) -> Result<Vec<String>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        on_tx!(self, insert_processed(source, events))
    }

    /// Undoes `insert_processed` for one event whose handler failed.
    pub async fn delete_processed(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(), StoreError> {
        const SQL: &str = "DELETE FROM processed_events WHERE source = $1 AND event_id = $2";
        either_tx!(self, |tx| sqlx::query(SQL)
            .bind(source)
            .bind(event_id)
            .execute(&mut **tx)
            .await
            .map(drop)?);
        Ok(())
    }

    pub async fn insert_outbox(&mut self, rows: &[NewOutboxRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        on_tx!(self, insert_outbox(rows))
    }

    pub async fn insert_dead_letter(&mut self, row: &NewDeadLetter) -> Result<(), StoreError> {
        on_tx!(self, insert_dead_letter(row, false)).map(drop)
    }

    /// Like [`StoreTx::insert_dead_letter`], unless a dead letter of the same event (source and
    /// a non-empty id) on the same queue is there already; returns whether it inserted. Dead
    /// letters have no key of their own, so a move that is repeated (a crash between its
    /// commit and its ack delivers the message again) would otherwise list the event twice.
    pub async fn insert_dead_letter_once(
        &mut self,
        row: &NewDeadLetter,
    ) -> Result<bool, StoreError> {
        on_tx!(self, insert_dead_letter(row, true)).map(|n| n > 0)
    }

    /// The connection handlers write through.
    pub fn conn(&mut self) -> DbTx<'_> {
        match self {
            StoreTx::Postgres(tx) => DbTx::Postgres(tx),
            StoreTx::Sqlite(tx) => DbTx::Sqlite(tx),
        }
    }

    pub async fn savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("SAVEPOINT dedup_event").await
    }

    pub async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("RELEASE SAVEPOINT dedup_event").await
    }

    pub async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.execute("ROLLBACK TO SAVEPOINT dedup_event").await
    }

    async fn execute(&mut self, sql: &'static str) -> Result<(), StoreError> {
        either_tx!(self, |tx| sqlx::query(sql)
            .execute(&mut **tx)
            .await
            .map(drop)?);
        Ok(())
    }

    /// Commits; on PostgreSQL a NOTIFY queued in this transaction is delivered now.
    pub async fn commit(self) -> Result<(), StoreError> {
        either_tx!(self, |tx| tx.commit().await?);
        Ok(())
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        either_tx!(self, |tx| tx.rollback().await?);
        Ok(())
    }
}

/// A claim token: random, so no two claims share one (2^-64 for any pair).
fn new_claim_token() -> i64 {
    rand::random()
}

/// Milliseconds since the Unix epoch (SQLite keeps times as integers).
pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
