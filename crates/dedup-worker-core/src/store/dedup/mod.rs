//! The dedup record: which events were processed, kept for the whole dedup window, with a cost
//! per event that does not grow with the window.
//!
//! # Layout (migration `20261201000003_dedup_generations`)
//!
//! Processed ids live in a ring of [`RING_SLOTS`] generation tables, `processed_events_0` …
//! `processed_events_4`, keyed by a 16-byte [`dedup_key`]. `dedup_generations` has one row per
//! slot in use; the current generation is the one not sealed, a slot without a row is free.
//!
//! * **Writes go to the current generation only.** A generation lasts a third of the window
//!   ([`GENERATIONS_PER_WINDOW`]), so the index that takes random inserts holds at most a third
//!   of the window's ids, and its entries (16 bytes) are less than half as wide as the
//!   `(source, event_id)` text key they replace. The sealed generations are only read: an id is
//!   inserted only if no other generation (nor the legacy table) holds it.
//! * **Uniqueness across the window.** Inside one generation the table's primary key decides
//!   races. Across a rotation: on PostgreSQL a batch takes a shared advisory lock
//!   ([`RING_LOCK`]) before it reads which generation is current, and holds it to its commit;
//!   sealing takes that lock exclusively, so it waits until every batch that may still commit
//!   into the old generation has ended, and a batch that starts later sees the new generation
//!   and finds the old one's ids committed. SQLite has one writer at a time: a batch and a
//!   rotation never interleave.
//! * **Retention** ([`crate::retention`]) seals the current generation once it is a third of the
//!   window old, and empties a generation sealed longer ago than the window (TRUNCATE on
//!   PostgreSQL): every id it held is older than the window. Ids are therefore kept at least the
//!   window and at most a third longer. If the next slot is not free yet (the window was
//!   lengthened), the current generation simply keeps growing: never an id dropped early.
//! * **Every generation is looked up, whatever the event says of itself.** Releases before
//!   issue 36 skipped a sealed generation for an event whose Stripe-signed `created` was a day
//!   after the seal. A signature proves who signed, not when the change happened: a holder of
//!   the secret (a replay tool, a test harness, a compromised producer) can re-sign a handled
//!   event with a later `t` and `created`, and the copy skipped the generation holding its id
//!   and was handled again. Nothing a message carries chooses where its id is looked up now;
//!   the cost is one index probe per sealed generation (BENCHMARKS.md, "dedup window").
//! * **Aliases.** An event may carry an alias ([`ProcessedEvent::alias`]): the id an earlier
//!   release or another setting gave the same message (a thin event's own id, an EventBridge
//!   envelope's id). It is looked up in every generation and the legacy table, never recorded,
//!   so a message handled under the old key is a duplicate under the new one.
//! * **The legacy table.** The table of earlier versions is kept as `processed_events_legacy`
//!   (an upgrade rewrites nothing) and looked up by `(source, event_id)`; retention deletes its
//!   rows by age in bounded batches as before, until it is empty.

mod postgres;
mod sqlite;
mod trail;

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{DuplicateDeliveries, Pool, ProcessedRecord, StoreError, StoreTx};

pub(super) use trail::processed_times;

/// Generation tables in the ring: the current one, up to three sealed ones still inside the
/// window, and one free for the next rotation.
pub const RING_SLOTS: i16 = 5;

/// How many generations one dedup window spans: a generation is sealed after a third of it.
pub const GENERATIONS_PER_WINDOW: u32 = 3;

/// Arbitrary constant naming the PostgreSQL advisory lock a batch holds shared (from reading
/// the current generation to its commit) and a rotation holds exclusively.
pub const RING_LOCK: i64 = 0x6465_6475_7072_696e;

/// The longest a rotation or an expiry waits for the batches in flight (and makes new batches
/// wait behind it). A rotation that does not get its locks in time is tried again at the next
/// retention pass.
pub const RING_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// The dedup record (the generation tables, `dedup_generations`, the duplicate deliveries and
/// the legacy table; see the module): what the backfill, retention and `events show` ask of it.
/// The batch transaction's writes are this folder's `insert_processed`, `record_duplicates`
/// and `delete_processed`, which [`StoreTx`] calls. Each method picks the store's form of the
/// ring's protocol: `postgres.rs` and `sqlite.rs` (inserts, lookups, maintenance), `trail.rs`
/// (what `events show` reads, and the duplicates' write), each statement's two forms in this
/// folder.
#[derive(Debug, Clone, Copy)]
pub struct DedupRing<'a> {
    pub(super) pool: &'a Pool,
}

impl DedupRing<'_> {
    /// Which of `ids` (events of `source`) are recorded as processed (handled, or dead-lettered
    /// as handled): a backfill enqueues only the others.
    pub async fn processed_among(
        self,
        source: &str,
        ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        match self.pool {
            Pool::Postgres(pool) => postgres::processed_among(pool, source, ids).await,
            Pool::Sqlite(pool) => sqlite::processed_among(pool, source, ids).await,
        }
    }

    /// One maintenance pass of the generations: empties those sealed longer ago than
    /// `window`, and seals the current one once it is a third of the window old. On
    /// PostgreSQL one process at a time (the others return at once, doing nothing).
    pub async fn maintain(self, window: Duration) -> Result<RingMaintenance, StoreError> {
        self.maintain_generations(window, Seal::WhenDue).await
    }

    /// Seals the current generation now and starts the next one, if the next slot is free (an
    /// operator's or a test's rotation; retention does it when due). Expired generations are
    /// emptied first, as in [`DedupRing::maintain`].
    pub async fn seal(self, window: Duration) -> Result<RingMaintenance, StoreError> {
        self.maintain_generations(window, Seal::Now).await
    }

    async fn maintain_generations(
        self,
        window: Duration,
        seal: Seal,
    ) -> Result<RingMaintenance, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => postgres::maintain_generations(pool, window, seal).await,
            Pool::Sqlite(pool) => sqlite::maintain_generations(pool, window, seal).await,
        }
    }

    /// The event's dedup record (from whichever generation, or the legacy table, holds it).
    pub async fn processed_record(
        self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ProcessedRecord>, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => trail::processed_record_pg(pool, source, event_id).await,
            Pool::Sqlite(pool) => trail::processed_record_sqlite(pool, source, event_id).await,
        }
    }

    /// The later deliveries of the event recognised as duplicates, counted up to `limit`.
    pub async fn duplicates_of(
        self,
        source: &str,
        event_id: &str,
        limit: i64,
    ) -> Result<DuplicateDeliveries, StoreError> {
        let key = dedup_key(source, event_id);
        match self.pool {
            Pool::Postgres(pool) => trail::duplicates_of_pg(pool, key, limit).await,
            Pool::Sqlite(pool) => trail::duplicates_of_sqlite(pool, key, limit).await,
        }
    }
}

/// Records `events` of `source` in the batch transaction; returns the ids that were new (see
/// [`StoreTx::insert_processed_events`]).
pub(super) async fn insert_processed(
    tx: &mut StoreTx,
    source: &str,
    events: &[ProcessedEvent],
) -> Result<Vec<String>, StoreError> {
    match tx {
        StoreTx::Postgres(tx) => postgres::insert_processed(tx, source, events).await,
        StoreTx::Sqlite(tx, began) => sqlite::insert_processed(tx, *began, source, events).await,
    }
}

/// Records one later delivery per `(key, type)` in the batch transaction (see
/// [`StoreTx::record_duplicates`]).
pub(super) async fn record_duplicates(
    tx: &mut StoreTx,
    keys: &[([u8; 16], &str)],
) -> Result<(), StoreError> {
    match tx {
        StoreTx::Postgres(tx) => trail::record_duplicates_pg(tx, keys).await,
        StoreTx::Sqlite(tx, began) => trail::record_duplicates_sqlite(tx, *began, keys).await,
    }
}

/// Undoes an insert of this transaction (see [`StoreTx::delete_processed`]).
pub(super) async fn delete_processed(
    tx: &mut StoreTx,
    source: &str,
    event_id: &str,
) -> Result<(), StoreError> {
    match tx {
        StoreTx::Postgres(tx) => postgres::delete_processed(tx, source, event_id).await,
        StoreTx::Sqlite(tx, _) => sqlite::delete_processed(tx, source, event_id).await,
    }
}

/// One event to record, with what `events show` reports of how it arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessedEvent {
    pub id: String,
    pub event_type: String,
    /// When the transport took it in (Unix milliseconds), where the transport says.
    pub received_at: Option<i64>,
    /// Which delivery of it this is (1 on the first).
    pub delivery_attempt: Option<i32>,
    /// Another id of the same event under the same source, which an earlier release or setting
    /// recorded it under (see [`crate::event::Event::alias`]): looked up in every generation
    /// and the legacy table, never recorded.
    pub alias: Option<String>,
}

/// The 16-byte dedup key of an event: the first half of
/// `sha256(be_u32(len(source)) ‖ source ‖ event_id)`. The length prefix keeps `("ab", "c")` and
/// `("a", "bc")` apart. A collision (two events taken for one) has probability about
/// `n² / 2¹²⁹`: for a window of 10¹⁰ ids, below 10⁻¹⁸.
pub fn dedup_key(source: &str, event_id: &str) -> [u8; 16] {
    let mut hasher = Sha256::new();
    hasher.update((source.len() as u32).to_be_bytes());
    hasher.update(source.as_bytes());
    hasher.update(event_id.as_bytes());
    let digest = hasher.finalize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// What one maintenance pass of the ring did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingMaintenance {
    /// Generations emptied because they were sealed longer ago than the window.
    pub expired: usize,
    /// Whether the current generation was sealed and the next one started.
    pub sealed: bool,
    /// The current generation was due to be sealed but the next slot still holds ids inside the
    /// window (the window was lengthened), so it keeps growing.
    pub next_slot_busy: bool,
}

/// When to seal the current generation: once it is a third of the window old, or now.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seal {
    WhenDue,
    Now,
}

/// The generation's table for `slot`.
fn table(slot: i16) -> String {
    format!("processed_events_{slot}")
}

/// The table of the duplicate deliveries recorded while `slot` was current (a partition on
/// PostgreSQL), emptied with the generation's own table.
fn duplicates_table(slot: i16) -> String {
    format!("duplicate_deliveries_{slot}")
}

/// The slots other than `current`, for the NOT EXISTS lookups.
fn others(current: i16) -> impl Iterator<Item = i16> {
    (0..RING_SLOTS).filter(move |s| *s != current)
}

/// The slot that follows `current` in the ring.
fn next_slot(current: i16) -> i16 {
    (current + 1) % RING_SLOTS
}

/// How long a generation stays current.
fn generation_length(window: Duration) -> Duration {
    window / GENERATIONS_PER_WINDOW
}

/// The current slot among the generations in use (`(slot, sealed)`, one row per slot in use).
fn current_slot(rows: &[(i16, bool)]) -> Result<i16, StoreError> {
    // The migration makes one current generation and every seal starts the next in its
    // transaction; a store without one was changed by hand.
    rows.iter()
        .find(|(_, sealed)| !sealed)
        .map(|(slot, _)| *slot)
        .ok_or(StoreError::Database(sqlx::Error::RowNotFound))
}

/// One event to insert: its key, the event, and its alias's key.
struct Keyed<'e> {
    key: [u8; 16],
    event: &'e ProcessedEvent,
    alias: Option<[u8; 16]>,
}

/// Each event with its key, sorted by key: one global order in which every batch inserts, so
/// two batches sharing ids wait for each other in that order and never form a deadlock cycle.
fn keyed<'e>(source: &str, events: &'e [ProcessedEvent]) -> Vec<Keyed<'e>> {
    let mut rows: Vec<_> = events
        .iter()
        .map(|event| Keyed {
            key: dedup_key(source, &event.id),
            event,
            alias: event.alias.as_deref().map(|alias| dedup_key(source, alias)),
        })
        .collect();
    rows.sort_unstable_by_key(|row| row.key);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_first_half_of_sha256_of_the_length_prefixed_source_and_id() {
        // Computed independently: Python's
        // hashlib.sha256(b"\x00\x00\x00\x06stripe" b"evt_1").hexdigest()[:32]
        let key = dedup_key("stripe", "evt_1");
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "89e2ca83f324949dd904884a7135351d");
    }

    #[test]
    fn the_length_prefix_keeps_sources_and_ids_apart() {
        assert_ne!(dedup_key("ab", "c"), dedup_key("a", "bc"));
        assert_ne!(dedup_key("stripe", "evt_1"), dedup_key("github", "evt_1"));
    }

    #[test]
    fn the_ring_wraps_and_lookups_skip_only_the_current_slot() {
        assert_eq!(next_slot(4), 0);
        assert_eq!(others(2).collect::<Vec<_>>(), vec![0, 1, 3, 4]);
        assert_eq!(
            generation_length(Duration::from_secs(30 * 86_400)),
            Duration::from_secs(10 * 86_400)
        );
    }
}
