//! The store: PostgreSQL in production, SQLite as the embedded default.
//!
//! Owns every SQL statement of the pipeline and the migrations, by table family, each family a
//! small handle borrowed from [`Store`] and each in its own room, the PostgreSQL and the SQLite
//! form of each statement side by side:
//!
//! | family | reached as | room |
//! |---|---|---|
//! | the database queue (`queue_messages`) | [`Store::queue`] | `queue.rs` |
//! | the dedup record (a ring of generation tables) | [`Store::dedup`] | `dedup/` |
//! | the outbox (`outbox`) | [`Store::outbox`] | `outbox.rs` |
//! | dead letters and their redrives | [`Store::dead_letters`] | `dead_letters.rs` |
//! | the stale-event guard's rows | [`Store::stale_events`] | `stale.rs` |
//! | the operator's reads (event list, one event's trail, activity, alerts) | [`Store::reads`] | `reads/` |
//! | retention's purge | [`Store::retention`] | `retention.rs` |
//! | kept event bodies | [`Store::bodies`] | `bodies/` |
//! | the history tables' day partitions | [`Store::partitions`] | `partitions.rs` |
//! | the operator's bulk actions by filter | [`Store::bulk`] | `bulk/` |
//! | the record of those actions (`admin_actions`) | [`Store::admin_actions`] | `admin_actions.rs` |
//! | per-minute counts (`activity_minutes`), written with what they count | [`Store::activity`] | `activity.rs` |
//!
//! [`StoreTx`], the consumer's batch transaction, runs the families' writes that must commit
//! with the batch (processed ids, outbox rows, dead letters, the stale guard's rows, the
//! per-minute counts); their statements are the families' own. Both backends give the same
//! guarantees, checked by one contract test suite (`tests/it/store_contract.rs`):
//! * `insert_processed` returns only the ids that were not there before, inside the caller's
//!   transaction, so "seen" and "handled" commit together, across the whole dedup window
//!   whatever its size ([`dedup`]: a ring of generation tables);
//! * queue and outbox claims lease rows; an expired lease makes them claimable again;
//! * each claim writes a fresh claim token on its rows, and outbox marks and queue releases
//!   apply only under the token of the caller's claim: a relay or consumer whose lease expired
//!   and was taken over changes nothing, and is told so (0 rows);
//! * writers that take a transaction never commit it themselves.

mod activity;
mod admin_actions;
pub mod bodies;
mod bulk;
mod dead_letters;
pub mod dedup;
mod migrate;
mod ordering;
mod outbox;
mod partitions;
mod postgres;
mod queue;
mod reads;
mod retention;
mod rows;
mod sink_rate;
mod sinks;
mod sqlite;
mod stale;
mod timeouts;
mod transaction;
mod user_migrations;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use tokio::sync::Notify;

use crate::config::Settings;

pub use activity::{Activity, Counts, Series, Shard, SHARDS};
pub use admin_actions::{AdminAction, AdminActions};
pub use bulk::{Bulk, BulkRows, DeadLetterListing, DeliveryListing, Requeued, RowFilter};
pub use dead_letters::DeadLetters;
pub use dedup::{dedup_key, DedupRing, ProcessedEvent, RingMaintenance};
pub use migrate::{migrate_postgres, LayoutError, SCHEMA};
pub use ordering::HeldKey;
pub use outbox::{AttemptKind, AttemptLane, AttemptMark, FailedMark, Outbox};
pub use partitions::{DropTiming, Dropped, Partitions, DROP_STATEMENT_TIMEOUT, PARTITIONED};
pub use queue::Queue;
pub use reads::{
    AlertCounts, AttemptRecord, BodyPage, BodyPosition, BodySearch, DeliveryState, FoundBody,
    HandledEvent, ListFilter, ListPosition, ListedKind, ListedRow, MinuteCount, Reads, Tie,
};
pub use retention::Retention;
pub use sink_rate::Tokens;
pub use sinks::{Circuit, SinkState, Sinks};
pub use stale::StaleEvents;
pub use timeouts::{bounded, ServerTimeouts};
pub use transaction::{DbTx, StoreTx};
pub use user_migrations::Migrations;

pub use rows::{
    DeadLetter, DeadLetterRecord, DuplicateDeliveries, NewDeadLetter, NewOutboxRow,
    NewQueueMessage, OutboxClaim, OutboxCounts, OutboxRecord, OutboxRow, ProcessedRecord,
    QueuedMessage, QueuedRecord, RedriveRecord, StaleEvent, StaleRecord,
};

/// A store failure. Every variant is "try again later" for callers: ingress answers 503, the
/// consumer leaves the batch unacked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed; `history` says whose ("dedup-worker's" or "the application's").
    /// The message leaves the cause to `source`, so a printed chain says it once.
    #[error("applying {history} migrations failed")]
    Migrate {
        history: &'static str,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// The application passed migrations, but none for the store in use.
    #[error("the application's migrations have no set for {0}: pass one in Migrations")]
    NoMigrationsFor(&'static str),
    /// The library's tables could not be put in their place (see [`LayoutError`]).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A statement the caller bounded did not answer in time (a database that stopped
    /// answering); whether it took effect is unknown.
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
    #[error("cannot create the SQLite directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    /// The first connection failed: which server (never its password), and the cause.
    #[error("cannot connect to {target}")]
    Connect {
        target: String,
        #[source]
        source: sqlx::Error,
    },
    /// The first connection got no answer at all (a black-holed host or port).
    #[error("cannot connect to {target}: no answer within {timeout:?} (database.acquire_timeout)")]
    ConnectTimedOut { target: String, timeout: Duration },
}

/// A failure of the pipeline's own migrations, or of putting the tables in their schema.
impl From<dedup_db::schema::SchemaError> for StoreError {
    fn from(error: dedup_db::schema::SchemaError) -> Self {
        use dedup_db::schema::SchemaError;
        match error {
            SchemaError::Database(e) => StoreError::Database(e),
            SchemaError::Migrate(e) => StoreError::from(e),
            SchemaError::Layout(e) => StoreError::Layout(e),
            // `SchemaError` is non-exhaustive: a later kind is still a failed migration.
            other => StoreError::Database(sqlx::Error::Protocol(other.to_string())),
        }
    }
}

/// A failure of the library's own migrations (the application's are mapped in
/// [`Store::migrate_with`]).
impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(source: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate {
            history: user_migrations::LIBRARY_HISTORY,
            source,
        }
    }
}

/// What a failed first connection to PostgreSQL says: the pool reports only that it timed out
/// waiting, so one more connection is tried (within `timeout`) for the server's or the
/// network's own reason (refused, unknown host, authentication, no answer).
async fn why_not_connected(
    options: &PgConnectOptions,
    timeout: Duration,
    pool_error: sqlx::Error,
) -> StoreError {
    use sqlx::Connection;
    let target = format!(
        "PostgreSQL at {}:{} (database {}, user {})",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default)"),
        options.get_username(),
    );
    match tokio::time::timeout(timeout, sqlx::PgConnection::connect_with(options)).await {
        Ok(Err(source)) => StoreError::Connect { target, source },
        Ok(Ok(conn)) => {
            drop(conn); // it answers now: the pool's own failure is all there is to say
            StoreError::Connect {
                target,
                source: pool_error,
            }
        }
        Err(_) => StoreError::ConnectTimedOut { target, timeout },
    }
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

/// Which of the two stores a [`Store`] (or a handler's [`DbTx`]) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    /// Both stores: what a handler supports unless it says otherwise.
    pub const ALL: &'static [Backend] = &[Backend::Postgres, Backend::Sqlite];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Names of the LISTEN/NOTIFY channels.
pub const QUEUE_CHANNEL: &str = "dedup_queue";
pub const OUTBOX_CHANNEL: &str = "dedup_outbox";

/// A connection pool to one of the two backends. Which one is the store's own business: the
/// pipeline reaches each table family by name (`store.outbox().claim_lane(…)`), and asks
/// [`Store::single_writer`] where the difference matters.
#[derive(Debug, Clone)]
pub struct Store(Pool);

/// The backend's pool.
#[derive(Debug, Clone)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Store {
    /// Connects (creating the SQLite file and its directory when needed). On PostgreSQL every
    /// connection carries the server-side bounds of [`ServerTimeouts::from_settings`].
    pub async fn connect(settings: &Settings) -> Result<Self, StoreError> {
        Self::connect_with(
            &settings.database_url,
            settings.database.max_connections,
            settings.database.acquire_timeout,
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
            Ok(Store(Pool::Sqlite(pool)))
        } else {
            // Every session READ COMMITTED, whatever the database's default (the dedup ring's
            // protocol needs it: postgres::BEGIN_READ_COMMITTED says why).
            let mut options =
                PgConnectOptions::from_str(url)?.options([postgres::READ_COMMITTED_OPTION]);
            if let Some(timeouts) = server_timeouts {
                options = timeouts.apply(options);
            }
            let pool = PoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(acquire_timeout)
                // The pipeline's SQL names the library's tables unqualified: schema
                // dedup_worker first, the session's own search_path behind it (migrate/).
                .after_connect(|conn, _| Box::pin(migrate::put_schema_first(conn)))
                .connect_with(options.clone())
                .await;
            match pool {
                Ok(pool) => Ok(Store(Pool::Postgres(pool))),
                Err(error) => Err(why_not_connected(&options, acquire_timeout, error).await),
            }
        }
    }

    /// The database queue's rows (`queue.rs`).
    pub fn queue(&self) -> Queue<'_> {
        Queue { pool: &self.0 }
    }

    /// The dedup record: the ring of generation tables (`dedup/`).
    pub fn dedup(&self) -> DedupRing<'_> {
        DedupRing { pool: &self.0 }
    }

    /// The outbox's rows (`outbox.rs`).
    pub fn outbox(&self) -> Outbox<'_> {
        Outbox { pool: &self.0 }
    }

    /// The outbox lanes' shared state: paused, circuit, the receiver's hold (`sinks.rs`).
    pub fn sinks(&self) -> Sinks<'_> {
        Sinks { pool: &self.0 }
    }

    /// Dead letters and the record of their redrives (`dead_letters.rs`).
    pub fn dead_letters(&self) -> DeadLetters<'_> {
        DeadLetters { pool: &self.0 }
    }

    /// The events the stale-event guard held back (`stale.rs`).
    pub fn stale_events(&self) -> StaleEvents<'_> {
        StaleEvents { pool: &self.0 }
    }

    /// The operator's reads across the tables: event list, one event's trail, activity,
    /// alerts (`reads/`).
    pub fn reads(&self) -> Reads<'_> {
        Reads { pool: &self.0 }
    }

    /// Retention's purge of expired rows (`retention.rs`).
    pub fn retention(&self) -> Retention<'_> {
        Retention { pool: &self.0 }
    }

    /// The operator's bulk actions by filter (`bulk/`).
    pub fn bulk(&self) -> Bulk<'_> {
        Bulk { pool: &self.0 }
    }

    /// Kept event bodies (`bodies/`).
    pub fn bodies(&self) -> bodies::Bodies<'_> {
        bodies::Bodies { pool: &self.0 }
    }

    /// The history tables' day partitions, PostgreSQL only (`partitions.rs`).
    pub fn partitions(&self) -> Partitions<'_> {
        Partitions { pool: &self.0 }
    }

    /// The record of the operator's bulk actions (`admin_actions.rs`).
    pub fn admin_actions(&self) -> AdminActions<'_> {
        AdminActions { pool: &self.0 }
    }

    /// The per-minute counts' upkeep (`activity.rs`; the writes go with what they count).
    pub fn activity(&self) -> Activity<'_> {
        Activity { pool: &self.0 }
    }

    pub fn backend(&self) -> Backend {
        match &self.0 {
            Pool::Postgres(_) => Backend::Postgres,
            Pool::Sqlite(_) => Backend::Sqlite,
        }
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend().name()
    }

    /// One round trip: is the store answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.0 {
            Pool::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
            Pool::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
        }
        Ok(())
    }

    pub async fn begin(&self) -> Result<StoreTx, StoreError> {
        Ok(match &self.0 {
            Pool::Postgres(pool) => StoreTx::Postgres(postgres::begin(pool).await?),
            Pool::Sqlite(pool) => StoreTx::Sqlite(sqlite::begin_immediate(pool).await?, now_ms()),
        })
    }

    /// Forwards PostgreSQL notifications to `wakeups` until the pool closes. A no-op on SQLite.
    pub fn spawn_listener(&self, wakeups: Arc<Wakeups>) -> Option<tokio::task::JoinHandle<()>> {
        match &self.0 {
            Pool::Postgres(pool) => Some(tokio::spawn(postgres::listen(pool.clone(), wakeups))),
            Pool::Sqlite(_) => None,
        }
    }

    /// Whether the store takes one writer at a time (SQLite): more writer tasks or consumer
    /// workers would only wait on its lock.
    pub fn single_writer(&self) -> bool {
        matches!(self.0, Pool::Sqlite(_))
    }

    /// The PostgreSQL pool, for tools and tests that query the store's tables directly; `None`
    /// on SQLite. Its connections put schema [`SCHEMA`] first in `search_path`: unqualified
    /// names resolve to the library's tables before the application's (write `public.outbox`
    /// for a table of the application's that shares a name with one of ours), and `CREATE`
    /// without a schema lands in [`SCHEMA`]. Run an application's migrations with
    /// [`Store::run_user_migrator`], not `migrator.run(pool)` on this pool.
    pub fn postgres_pool(&self) -> Option<&PgPool> {
        match &self.0 {
            Pool::Postgres(pool) => Some(pool),
            Pool::Sqlite(_) => None,
        }
    }

    /// The SQLite pool, as [`Store::postgres_pool`]; `None` on PostgreSQL.
    pub fn sqlite_pool(&self) -> Option<&SqlitePool> {
        match &self.0 {
            Pool::Sqlite(pool) => Some(pool),
            Pool::Postgres(_) => None,
        }
    }

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
        match &self.0 {
            Pool::Postgres(pool) => pool.close().await,
            Pool::Sqlite(pool) => pool.close().await,
        }
    }
}

/// A claim token: random, so no two claims share one (2^-64 for any pair).
fn new_claim_token() -> i64 {
    rand::random()
}

/// A count as read: never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Milliseconds since the Unix epoch (SQLite keeps times as integers).
pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub(crate) use crate::retry::millis;
