//! Transactions: [`StoreTx`], the consumer's batch transaction, and [`DbTx`], the connection a
//! handler writes through inside it. [`with_connection!`](crate::with_connection) lets a
//! handler write each statement once for both stores.
//!
//! `StoreTx`'s writes are the families' statements, run in the batch transaction: each method
//! calls its family's function (`dedup/`, `outbox.rs`, `dead_letters.rs`, `stale.rs`), where
//! the statement is, its two forms side by side. What is here is the transaction itself.

use super::dedup::{self, ProcessedEvent};
use super::{dead_letters, outbox, stale, NewDeadLetter, NewOutboxRow, StaleEvent, StoreError};

/// Runs the same expression on whichever connection a [`DbTx`] (or `&mut DbTx`) holds, so SQL
/// both stores accept is written once. `$conn` is bound to `&mut &mut PgConnection` or
/// `&mut &mut SqliteConnection`; pass it to sqlx as `&mut **conn`. Both arms must have one
/// type: map an `execute` to its `rows_affected()`, fetch rows into your own `FromRow` type:
///
/// ```
/// use dedup_worker_core::store::DbTx;
///
/// async fn credit(tx: &mut DbTx<'_>, event_id: &str) -> Result<u64, sqlx::Error> {
///     dedup_worker_core::with_connection!(tx, |conn| {
///         sqlx::query("INSERT INTO credits (event_id) VALUES ($1)")
///             .bind(event_id)
///             .execute(&mut **conn)
///             .await
///             .map(|done| done.rows_affected())
///     })
/// }
/// ```
#[macro_export]
macro_rules! with_connection {
    ($tx:expr, |$conn:ident| $body:expr) => {
        match $tx {
            $crate::store::DbTx::Postgres($conn) => $body,
            $crate::store::DbTx::Sqlite($conn) => $body,
        }
    };
}

/// Executes one statement on whichever connection a [`DbTx`] holds, binding each argument in
/// order, and returns the rows it affected: the common case of [`with_connection!`] in one
/// line, through the sqlx this crate re-exports (a handler crate needs no sqlx of its own for
/// it). The statement must be one both stores accept (`$1`-style parameters do on both).
///
/// ```
/// use dedup_worker_core::store::DbTx;
///
/// async fn record(tx: &mut DbTx<'_>, invoice: &str, cents: i64) -> Result<u64, dedup_worker_core::sqlx::Error> {
///     dedup_worker_core::execute!(
///         tx,
///         "INSERT INTO paid_invoices (invoice_id, amount) VALUES ($1, $2) ON CONFLICT DO NOTHING",
///         invoice,
///         cents
///     )
/// }
/// ```
#[macro_export]
macro_rules! execute {
    ($tx:expr, $sql:expr $(, $arg:expr)* $(,)?) => {
        $crate::with_connection!($tx, |conn| {
            $crate::sqlx::query($sql)
                $(.bind($arg))*
                .execute(&mut **conn)
                .await
                .map(|done| done.rows_affected())
        })
    };
}

/// An open transaction. Dropping it without [`StoreTx::commit`] rolls back.
#[derive(Debug)]
pub enum StoreTx {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    /// The transaction and when it began (Unix ms): the time of the processed ids and outbox
    /// rows it writes, as PostgreSQL's now() is for both (`events show` finds an event's
    /// outbox rows by that equality).
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>, i64),
}

/// The connection a handler writes through: the batch transaction (inside a savepoint).
#[derive(Debug)]
pub enum DbTx<'a> {
    Postgres(&'a mut sqlx::PgConnection),
    Sqlite(&'a mut sqlx::SqliteConnection),
}

impl DbTx<'_> {
    /// Which store this connection belongs to.
    pub fn backend(&self) -> super::Backend {
        match self {
            DbTx::Postgres(_) => super::Backend::Postgres,
            DbTx::Sqlite(_) => super::Backend::Sqlite,
        }
    }

    /// The PostgreSQL connection, for a handler that needs PostgreSQL's own features (`COPY`,
    /// `jsonb` operators, advisory locks); `None` on SQLite, where such a handler should return
    /// a fatal error naming what it needs rather than guess.
    pub fn postgres(&mut self) -> Option<&mut sqlx::PgConnection> {
        match self {
            DbTx::Postgres(conn) => Some(conn),
            DbTx::Sqlite(_) => None,
        }
    }

    /// The SQLite connection; `None` on PostgreSQL.
    pub fn sqlite(&mut self) -> Option<&mut sqlx::SqliteConnection> {
        match self {
            DbTx::Sqlite(conn) => Some(conn),
            DbTx::Postgres(_) => None,
        }
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
        let events: Vec<ProcessedEvent> = events
            .iter()
            .map(|(id, event_type)| ProcessedEvent {
                id: id.clone(),
                event_type: event_type.clone(),
                ..ProcessedEvent::default()
            })
            .collect();
        self.insert_processed_events(source, &events).await
    }

    /// As [`StoreTx::insert_processed`], with how each event was received (when the
    /// transport took it in, which delivery this is), which `events show` reports.
    pub async fn insert_processed_events(
        &mut self,
        source: &str,
        events: &[ProcessedEvent],
    ) -> Result<Vec<String>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        dedup::insert_processed(self, source, events).await
    }

    /// Records one later delivery of each `(source, event id)`, recognised as a duplicate of
    /// an event processed before (in an earlier batch, or earlier in this one), for `events
    /// show`. An event delivered three times more is listed three times. Each is
    /// `(source, id, type)`: the type lets the console list duplicates by type.
    pub async fn record_duplicates(
        &mut self,
        deliveries: &[(&str, &str, &str)],
    ) -> Result<(), StoreError> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let keys: Vec<([u8; 16], &str)> = deliveries
            .iter()
            .map(|(source, id, event_type)| (dedup::dedup_key(source, id), *event_type))
            .collect();
        dedup::record_duplicates(self, &keys).await
    }

    /// Undoes `insert_processed` for one event whose handler failed.
    pub async fn delete_processed(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(), StoreError> {
        dedup::delete_processed(self, source, event_id).await
    }

    /// Writes outbox rows (on PostgreSQL, notifying the relays at commit).
    pub async fn insert_outbox(&mut self, rows: &[NewOutboxRow]) -> Result<(), StoreError> {
        outbox::insert(self, rows).await
    }

    pub async fn insert_dead_letter(&mut self, row: &NewDeadLetter) -> Result<(), StoreError> {
        dead_letters::insert(self, row, false).await.map(drop)
    }

    /// Like [`StoreTx::insert_dead_letter`], unless a dead letter of the same event (source and
    /// a non-empty id) on the same queue is there already; returns whether it inserted. Dead
    /// letters have no key of their own, so a move that is repeated (a crash between its
    /// commit and its ack delivers the message again) would otherwise list the event twice.
    pub async fn insert_dead_letter_once(
        &mut self,
        row: &NewDeadLetter,
    ) -> Result<bool, StoreError> {
        dead_letters::insert(self, row, true).await.map(|n| n > 0)
    }

    /// [`StoreTx::insert_dead_letter_once`] for each of `rows`, their locks taken first and in
    /// one canonical order (see `dead_letters::lock`): a batch's dead letters, whatever order
    /// its events failed in.
    pub async fn insert_dead_letters_once(
        &mut self,
        rows: &[NewDeadLetter],
    ) -> Result<(), StoreError> {
        dead_letters::lock(self, rows).await?;
        for row in rows {
            self.insert_dead_letter_once(row).await?;
        }
        Ok(())
    }

    /// Locks each `(source, object id)` whose version the stale-event guard may record in this
    /// transaction, in one canonical order (the lock keys'), before any is recorded. Recorded
    /// one event at a time, in the order the batch delivered them, two batches touching the
    /// same objects in opposite orders would each hold one object's row and wait for the
    /// other's: `deadlock detected`, a batch started over or an event retried. Held until the
    /// transaction ends, like the rows. SQLite: nothing to do (one writer at a time).
    pub async fn lock_objects(&mut self, objects: &[(&str, &str)]) -> Result<(), StoreError> {
        stale::lock_objects(self, objects).await
    }

    /// Records `version` as the newest handled for `(source, object_id)` unless a strictly newer
    /// one is recorded; returns that newer one (version, event id) when there is one, so the
    /// event is stale. Equal versions are not stale. The row stays locked until the batch
    /// commits, so two workers decide one object's events one after the other.
    pub async fn record_object_version(
        &mut self,
        source: &str,
        object_id: &str,
        version: i64,
        event_id: &str,
    ) -> Result<Option<(i64, String)>, StoreError> {
        stale::record_version(self, source, object_id, version, event_id).await
    }

    /// Keeps the bodies of events this transaction recorded as processed (see `bodies/`);
    /// returns how many were kept (fewer when today's partition is missing).
    pub async fn insert_event_bodies(
        &mut self,
        rows: &[super::bodies::NewEventBody],
    ) -> Result<u64, StoreError> {
        super::bodies::insert(self, rows).await
    }

    /// Lists `event` as held back by the stale-event guard.
    pub async fn insert_stale_event(&mut self, event: &StaleEvent) -> Result<(), StoreError> {
        stale::insert(self, event).await
    }

    /// The connection handlers write through.
    pub fn conn(&mut self) -> DbTx<'_> {
        match self {
            StoreTx::Postgres(tx) => DbTx::Postgres(tx),
            StoreTx::Sqlite(tx, _) => DbTx::Sqlite(tx),
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
        match self {
            StoreTx::Postgres(tx) => sqlx::query(sql).execute(&mut **tx).await.map(drop)?,
            StoreTx::Sqlite(tx, _) => sqlx::query(sql).execute(&mut **tx).await.map(drop)?,
        }
        Ok(())
    }

    /// Commits; on PostgreSQL a NOTIFY queued in this transaction is delivered now.
    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            StoreTx::Postgres(tx) => tx.commit().await?,
            StoreTx::Sqlite(tx, _) => tx.commit().await?,
        }
        Ok(())
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        match self {
            StoreTx::Postgres(tx) => tx.rollback().await?,
            StoreTx::Sqlite(tx, _) => tx.rollback().await?,
        }
        Ok(())
    }
}
