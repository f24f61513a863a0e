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
//! * **Events created after a generation was sealed are not looked up in it**, where the
//!   creation time is one the provider signed. The caller passes `created` (Unix seconds) only
//!   when the consumer verified that Stripe signed these exact bytes (`consumer/record.rs`: a
//!   `stripe` event whose payload verifies, with no timestamp tolerance, against
//!   `stripe.secrets` under the signature the ingress carried with the message, whose own `id`
//!   is the key, which is not a thin event, and whose `created` is at most five minutes after
//!   the signature's `t`); otherwise `None`, and every generation is looked up: correct, only
//!   slower (no signature, a bad one, no secrets on a consume-only process, backfill, redrive,
//!   EventBridge, Standard Webhooks, foreign producers). A generation `g` is skipped when
//!   `created >= sealed_at(g) + CREATED_MARGIN`. Why that cannot skip the generation holding
//!   the id: an id recorded in `g` was recorded at a database time `r < sealed_at(g)` (a seal
//!   waits for every batch that may still insert into `g`). The delivery that recorded it was
//!   received by the ingress before `r`, and the ingress accepts a signature only if its `t` is
//!   within `stripe.tolerance_secs` of its own clock, so `t <= r + tolerance` (plus the skew
//!   between the ingress's and the database's clocks); Stripe creates an event before it signs
//!   a delivery of it, `created <= t`. (Whatever else recorded the id, it could name it only
//!   after Stripe created it.) So `created < sealed_at(g) + tolerance + skew`, far below
//!   `sealed_at(g) + CREATED_MARGIN`. The assumption: Stripe's clock and the database's agree
//!   within the margin (one day) minus the tolerance (at most an hour). The decision depends on
//!   the message's own signed bytes alone, never on this process's clock, so every delivery of
//!   one message takes the same path. So a fresh event, the usual case, touches the current
//!   generation's index only, and a Stripe retry (at most three days late) the generations
//!   sealed since it was created.
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

use super::StoreError;

pub(super) use postgres::{
    delete_processed as delete_processed_pg, insert_processed as insert_processed_pg,
    maintain_generations as maintain_generations_pg, processed_among as processed_among_pg,
};
pub(super) use sqlite::{
    delete_processed as delete_processed_sqlite, insert_processed as insert_processed_sqlite,
    maintain_generations as maintain_generations_sqlite, processed_among as processed_among_sqlite,
};
pub(super) use trail::{
    duplicates_of_pg, duplicates_of_sqlite, processed_record_pg, processed_record_sqlite,
    processed_times, record_duplicates_pg, record_duplicates_sqlite,
};

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

/// How far a signed creation time may be after a generation's seal and the event still be in
/// it: the ingress's timestamp tolerance plus the clocks' disagreement (Stripe's, the
/// ingress's, the database's), with room to spare (see the module docs).
pub const CREATED_MARGIN: Duration = Duration::from_secs(86_400);

/// One event to record: its id, its type, and when the provider says it was created (Unix
/// seconds), only if the caller verified the provider's signature of that. [`ProcessedEvent`] also carries how it was received.
pub type NewProcessed = (String, String, Option<i64>);

/// One event to record, with what `events show` reports of how it arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessedEvent {
    pub id: String,
    pub event_type: String,
    /// When the provider says it was created (Unix seconds), only where the caller verified
    /// that the provider signed it: generations sealed well before it are not looked up.
    pub created: Option<i64>,
    /// When the transport took it in (Unix milliseconds), where the transport says.
    pub received_at: Option<i64>,
    /// Which delivery of it this is (1 on the first).
    pub delivery_attempt: Option<i32>,
    /// Another id of the same event under the same source, which an earlier release or setting
    /// recorded it under (see [`crate::event::Event::alias`]): looked up in every generation
    /// and the legacy table, never recorded.
    pub alias: Option<String>,
}

impl From<&NewProcessed> for ProcessedEvent {
    fn from((id, event_type, created): &NewProcessed) -> Self {
        ProcessedEvent {
            id: id.clone(),
            event_type: event_type.clone(),
            created: *created,
            ..ProcessedEvent::default()
        }
    }
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

/// From the generations in use (`(slot, sealed_at)` in Unix seconds, `None` for the current
/// one): the current slot, and per slot the creation time from which an event cannot be in that
/// generation (`None` for the current slot and free ones).
fn thresholds(rows: &[(i16, Option<f64>)]) -> Result<(i16, Vec<Option<f64>>), StoreError> {
    let mut current = None;
    let mut from = vec![None; RING_SLOTS as usize];
    for (slot, sealed_at) in rows {
        match sealed_at {
            None => current = Some(*slot),
            Some(at) => from[*slot as usize] = Some(at + CREATED_MARGIN.as_secs_f64()),
        }
    }
    // The migration makes one current generation and every seal starts the next in its
    // transaction; a store without one was changed by hand.
    let current = current.ok_or(StoreError::Database(sqlx::Error::RowNotFound))?;
    Ok((current, from))
}

/// One event to insert: its key, the event, and its alias's key.
struct Keyed<'e> {
    key: [u8; 16],
    event: &'e ProcessedEvent,
    alias: Option<[u8; 16]>,
}

/// Each event with its key, sorted by key: one global order in which every batch inserts, so
/// two batches sharing ids wait for each other in that order and never form a deadlock cycle.
/// The creation time is used as the caller gives it, whatever this clock says: the caller
/// passes only one the provider signed (see the module docs), so every delivery of one message
/// takes the same path.
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
