//! The reference model of the dedup record: which ids are recorded in which generation of the
//! ring (or in the legacy table), what the open batches hold, and which calls wait for which (the
//! locking protocol of `store::dedup` on PostgreSQL, one writer at a time on SQLite). It predicts
//! every call's result; `schedule.rs` generates the valid schedules from it, and the invariants
//! are checked in `sut.rs` against what the store actually answered. How an insert decides is
//! in [`insert`].
//!
//! Times are seconds of the model's clock, which moves only by time travel (`Travel`): the store's
//! own clock barely moves during a case, and the test moves every timestamp of
//! `dedup_generations` back instead. Travel steps are whole hours plus 7 minutes and windows are
//! whole days, so no sum of fewer than 60 steps lands exactly on a window or a third of one: the
//! few milliseconds the real clock moves never decide a comparison.

mod insert;

use std::fmt;

use dedup_worker_core::store::dedup::RING_SLOTS;

pub use insert::Row;

/// Connections that run batches.
pub const BATCHES: usize = 3;
/// Changes in play: few, so that deliveries repeat and batches share them. Change `c` has two
/// ids: its key now, `evt_c` (key `c`), and the id an earlier release gave one of its messages,
/// `evt_c_old` (key `CHANGES + c`), which the copies of the change carry as their alias.
pub const CHANGES: usize = 5;
/// Ids in play: each change's two.
pub const KEYS: usize = 2 * CHANGES;
const SLOTS: usize = RING_SLOTS as usize;
pub const HOUR: i64 = 3_600;
pub const DAY: i64 = 86_400;

/// The source of every event (the key space of `stripe`).
pub const SOURCE: &str = "stripe";

pub fn event_id(key: usize) -> String {
    if key < CHANGES {
        format!("evt_{key}")
    } else {
        format!("evt_{}_old", key - CHANGES)
    }
}

/// The key of an id [`event_id`] made.
pub fn key_of(id: &str) -> Option<usize> {
    (0..KEYS).find(|key| event_id(*key) == id)
}

/// The alias a copy of change `key` carries (the id an earlier release recorded it under).
pub fn alias_of(key: usize) -> usize {
    debug_assert!(key < CHANGES);
    key + CHANGES
}

/// One step of a schedule.
#[derive(Clone, Debug)]
pub enum Step {
    Begin(usize),
    /// A batch records these deliveries (one `insert_processed_events` call).
    Insert(usize, Vec<Delivery>),
    /// A batch undoes its record of one id it recorded (`delete_processed`): the event's
    /// handler failed and the rest of the batch goes on to commit.
    Undo(usize, usize),
    Commit(usize),
    Rollback(usize),
    /// An earlier release recorded this id in the legacy table (committed at once).
    Legacy(usize),
    /// `store.dedup().seal(window)`.
    Seal,
    /// `store.dedup().maintain(window)`: retention's pass.
    Retention,
    /// The window retention and seals use from now on, in days.
    Window(i64),
    /// Every timestamp of the ring moved back by this many seconds.
    Travel(i64),
}

/// One delivery: a copy of change `key` (`key < CHANGES`), with or without its alias (a thin
/// event or an EventBridge envelope carries the id an earlier release keyed it by; a snapshot
/// event by webhook carries none), or an earlier release's delivery under the old id
/// (`key >= CHANGES`, never with an alias).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub key: usize,
    pub aliased: bool,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.aliased {
            write!(f, "{}~{}", event_id(self.key), event_id(alias_of(self.key)))
        } else {
            write!(f, "{}", event_id(self.key))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation {
    pub started: i64,
    pub sealed: Option<i64>,
    /// Which use of the slot this is (a slot is emptied and reused as the ring turns).
    pub epoch: u32,
}

/// Why a call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// SQLite: `BEGIN IMMEDIATE` behind the one writer.
    Begin,
    /// PostgreSQL: the shared ring lock, behind a seal or expiry waiting for it exclusively.
    Ring,
    /// PostgreSQL: an id another open batch inserted and has not committed.
    Key { holder: usize },
}

/// An insert that has not finished: its rows in the store's order (by dedup key), how far it
/// got, the ids it recorded so far, and the aliases its statement sees (fixed when it starts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Insert {
    pub rows: Vec<Row>,
    pub next: usize,
    pub accepted: Vec<usize>,
    pub snapshot: Option<Vec<(usize, Place)>>,
}

#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub open: bool,
    /// PostgreSQL: holds the ring lock shared (from its first insert to its end).
    pub ring_lock: bool,
    /// Ids it recorded, not yet committed (what its commit records).
    pub held: Vec<usize>,
    /// Ids it inserted, undone ones included: an undone row is still its uncommitted row
    /// version, so another batch inserting the id waits for this one to end.
    pub claimed: Vec<usize>,
    pub waiting: Option<Wait>,
    pub insert: Option<Insert>,
}

/// A seal or retention pass that waits (for the batches on PostgreSQL, the writer on SQLite).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Maintenance {
    pub window: i64,
    pub seal_now: bool,
}

/// What a maintenance pass reports (`RingMaintenance`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rotated {
    pub expired: usize,
    pub sealed: bool,
    pub next_slot_busy: bool,
}

/// A call that finished in this step, with the model's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    Begin(usize),
    Insert { batch: usize, accepted: Vec<usize> },
    Maintenance(Rotated),
}

/// Where an insert found a delivery's alias recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Sealed,
    Current,
    Legacy,
    /// Recorded earlier by the same batch, not yet committed.
    Batch,
}

/// What the model decided in the last step that the coverage counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A change answered a duplicate because its alias is recorded there.
    AliasDuplicate(Place),
    /// A change recorded as new although another open batch holds its alias uncommitted (the
    /// lookup sees committed records only: the interleaving an earlier release running beside
    /// this one makes).
    AliasUncommitted,
    /// An insert of a copy carrying an alias waits for another batch's claim of the change.
    AliasedClaimWaits,
    /// An id recorded as new after a batch undid its record of it.
    NewAgain,
}

#[derive(Clone, Debug)]
pub struct State {
    pub postgres: bool,
    pub now: i64,
    pub window: i64,
    pub ring: [Option<Generation>; SLOTS],
    pub current: usize,
    epochs: u32,
    pub batches: [Batch; BATCHES],
    pub maintenance: Option<Maintenance>,
    /// Where each id is recorded (committed) in the ring: slot and epoch.
    pub recorded: [Option<(usize, u32)>; KEYS],
    /// The ids in the legacy table (retention's row purge is not part of the model: kept).
    pub legacy: [bool; KEYS],
    /// Ids a batch undid, not recorded as new since.
    undone: [bool; KEYS],
    /// The calls that finished in the last step.
    pub done: Vec<Done>,
    /// What the last step's inserts decided.
    pub seen: Vec<Seen>,
}

impl State {
    pub(super) fn new(postgres: bool) -> Self {
        let mut ring = [None; SLOTS];
        ring[0] = Some(Generation {
            started: 0,
            sealed: None,
            epoch: 0,
        });
        State {
            postgres,
            now: 0,
            window: 4 * DAY,
            ring,
            current: 0,
            epochs: 1,
            batches: Default::default(),
            maintenance: None,
            recorded: [None; KEYS],
            legacy: [false; KEYS],
            undone: [false; KEYS],
            done: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// Calls that wait now (each is one database session waiting on a lock on PostgreSQL).
    pub fn waiting(&self) -> usize {
        self.batches.iter().filter(|b| b.waiting.is_some()).count()
            + usize::from(self.maintenance.is_some())
    }

    /// Whether `key` is recorded and committed (in the ring or the legacy table).
    pub fn present(&self, key: usize) -> bool {
        self.recorded[key].is_some() || self.legacy[key]
    }

    /// The open batch other than `except` whose uncommitted row of `key` an insert waits for.
    fn holder(&self, key: usize, except: usize) -> Option<usize> {
        (0..BATCHES).find(|&b| b != except && self.batches[b].claimed.contains(&key))
    }

    /// What a maintenance pass with `window` decides, from the ring as it is.
    pub fn plan(&self, window: i64, seal_now: bool) -> (Vec<usize>, bool, Rotated) {
        let expired: Vec<usize> = (0..SLOTS)
            .filter(|&s| matches!(self.ring[s], Some(Generation { sealed: Some(at), .. }) if self.now - at >= window))
            .collect();
        let current = self.ring[self.current].expect("a current generation");
        let due = self.now - current.started >= window / 3;
        let sealing = due || seal_now;
        let next = (self.current + 1) % SLOTS;
        let next_free = sealing && (expired.contains(&next) || self.ring[next].is_none());
        let rotated = Rotated {
            expired: expired.len(),
            sealed: next_free,
            next_slot_busy: sealing && !next_free,
        };
        (expired, next_free, rotated)
    }

    /// Whether the pass takes the ring lock (only when it has something to expire or seal).
    fn takes_ring_lock(&self, window: i64, seal_now: bool) -> bool {
        let (expired, seals, _) = self.plan(window, seal_now);
        !expired.is_empty() || seals
    }

    fn finish_maintenance(&mut self, window: i64, seal_now: bool) {
        let (expired, seals, rotated) = self.plan(window, seal_now);
        for slot in expired {
            let epoch = self.ring[slot].take().expect("an expired generation").epoch;
            for place in &mut self.recorded {
                if *place == Some((slot, epoch)) {
                    *place = None;
                }
            }
        }
        if seals {
            let next = (self.current + 1) % SLOTS;
            if let Some(current) = &mut self.ring[self.current] {
                current.sealed = Some(self.now);
            }
            self.ring[next] = Some(Generation {
                started: self.now,
                sealed: None,
                epoch: self.epochs,
            });
            self.epochs += 1;
            self.current = next;
        }
        self.maintenance = None;
        self.done.push(Done::Maintenance(rotated));
    }

    /// After batch `ended` committed or rolled back: the calls that waited for it go on.
    fn release(&mut self, ended: usize) {
        if !self.postgres {
            if let Some(b) = (0..BATCHES).find(|&b| self.batches[b].waiting == Some(Wait::Begin)) {
                self.batches[b].waiting = None;
                self.batches[b].open = true;
                self.done.push(Done::Begin(b));
            } else if let Some(m) = self.maintenance {
                self.finish_maintenance(m.window, m.seal_now);
            }
            return;
        }
        for b in 0..BATCHES {
            if self.batches[b].waiting == Some(Wait::Key { holder: ended }) {
                self.run_insert(b);
            }
        }
        if let Some(m) = self.maintenance {
            if !self.batches.iter().any(|b| b.ring_lock) {
                self.finish_maintenance(m.window, m.seal_now);
                for b in 0..BATCHES {
                    if self.batches[b].waiting == Some(Wait::Ring) {
                        self.batches[b].ring_lock = true;
                        self.run_insert(b);
                    }
                }
            }
        }
    }

    pub(super) fn end(&mut self, b: usize, commit: bool) {
        let batch = std::mem::take(&mut self.batches[b]);
        if commit {
            let epoch = self.ring[self.current].expect("a current generation").epoch;
            for key in batch.held {
                self.recorded[key] = Some((self.current, epoch));
            }
        }
        self.release(b);
    }

    /// `delete_processed` of an id batch `b` recorded: its commit will not record it, and a
    /// later delivery is new; the row version stays the batch's until it ends (others wait).
    pub(super) fn undo(&mut self, b: usize, key: usize) {
        self.batches[b].held.retain(|k| *k != key);
        self.undone[key] = true;
    }

    pub(super) fn maintain(&mut self, seal_now: bool) {
        let window = self.window;
        let waits = if self.postgres {
            self.takes_ring_lock(window, seal_now) && self.batches.iter().any(|b| b.ring_lock)
        } else {
            self.batches.iter().any(|b| b.open)
        };
        if waits {
            self.maintenance = Some(Maintenance { window, seal_now });
        } else {
            self.finish_maintenance(window, seal_now);
        }
    }
}
