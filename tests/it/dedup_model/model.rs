//! The reference model of the dedup record: which ids are recorded in which generation of the
//! ring, what the open batches hold, and which calls wait for which (the locking protocol of
//! `store::dedup` on PostgreSQL, one writer at a time on SQLite). It predicts every call's
//! result; `schedule.rs` generates the valid schedules from it, and the invariants are checked
//! in `sut.rs` against what the store actually answered.
//!
//! Times are seconds of the model's clock, which moves only by time travel (`Travel`): the store's
//! own clock barely moves during a case, and the test moves every timestamp of
//! `dedup_generations` back instead. Travel steps are whole hours plus 7 minutes and windows are
//! whole days, so no sum of fewer than 60 steps lands exactly on a window or a third of one: the
//! few milliseconds the real clock moves never decide a comparison.

use std::collections::BTreeSet;

use dedup_worker::store::dedup::{dedup_key, RING_SLOTS};

/// Connections that run batches.
pub const BATCHES: usize = 3;
/// Event ids in play (`evt_0` …): few, so that deliveries repeat and batches share them.
pub const IDS: usize = 6;
const SLOTS: usize = RING_SLOTS as usize;
pub const HOUR: i64 = 3_600;
pub const DAY: i64 = 86_400;
/// A forged creation time is claimed this far ahead of the event's first delivery: by a producer
/// that stamps `created` (without Stripe's signature of it), so the consumer's trust decision
/// passes the store none and every generation is looked up. Two days and a minute: a later
/// delivery finds the claim within the margin of its own clock, which is where the store of
/// issue 26 item 2 trusted it (an event first delivered without a creation time, recorded, the
/// generation sealed, delivered a day later claiming one a day past the seal, was recorded
/// again).
pub const FORGED_AHEAD: i64 = 2 * DAY + 60;

/// The source of every event (the key space of `stripe`).
pub const SOURCE: &str = "stripe";

pub fn event_id(id: usize) -> String {
    format!("evt_{id}")
}

/// One step of a schedule.
#[derive(Clone, Debug)]
pub enum Step {
    Begin(usize),
    /// A batch records these deliveries (one `insert_processed_events` call).
    Insert(usize, Vec<Delivery>),
    Commit(usize),
    Rollback(usize),
    /// `seal_dedup_generation(window)`.
    Seal,
    /// `maintain_dedup_generations(window)`: retention's pass.
    Retention,
    /// The window retention and seals use from now on, in days.
    Window(i64),
    /// Every timestamp of the ring moved back by this many seconds.
    Travel(i64),
}

/// One delivery of an event.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: usize,
    /// Whether this delivery carries the event's creation time (a source that signs it).
    pub with_created: bool,
    /// The event's creation time if this is its first delivery: so many minutes from the
    /// moment (at most the margin ahead: an authentic event), or forged far ahead.
    pub created: Created,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    MinutesFromNow(i64),
    Forged,
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

/// An insert that has not finished: its ids in the store's order (by dedup key), how far it got,
/// and the ids it recorded so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Insert {
    pub ids: Vec<usize>,
    pub next: usize,
    pub accepted: Vec<usize>,
}

#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub open: bool,
    /// PostgreSQL: holds the ring lock shared (from its first insert to its end).
    pub ring_lock: bool,
    /// Ids it recorded, not yet committed.
    pub held: Vec<usize>,
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
    /// Where each id is recorded (committed): slot and epoch.
    pub recorded: [Option<(usize, u32)>; IDS],
    /// Each event's creation time (model seconds), fixed by its first delivery; a forged one is
    /// [`FORGED_AHEAD`] past it.
    pub created: [Option<i64>; IDS],
    /// Whether each event's creation time is forged (fixed by its first delivery too).
    pub forged: [bool; IDS],
    /// The calls that finished in the last step.
    pub done: Vec<Done>,
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
            recorded: [None; IDS],
            created: [None; IDS],
            forged: [false; IDS],
            done: Vec::new(),
        }
    }

    /// Calls that wait now (each is one database session waiting on a lock on PostgreSQL).
    pub fn waiting(&self) -> usize {
        self.batches.iter().filter(|b| b.waiting.is_some()).count()
            + usize::from(self.maintenance.is_some())
    }

    fn present(&self, id: usize) -> bool {
        self.recorded[id].is_some()
    }

    fn holder(&self, id: usize, except: usize) -> Option<usize> {
        (0..BATCHES).find(|&b| b != except && self.batches[b].held.contains(&id))
    }

    /// The ids of a delivery list as the store inserts them: once each, by dedup key.
    pub fn in_key_order(deliveries: &[Delivery]) -> Vec<usize> {
        let ids: BTreeSet<usize> = deliveries.iter().map(|d| d.id).collect();
        let mut ids: Vec<usize> = ids.into_iter().collect();
        ids.sort_by_key(|id| dedup_key(SOURCE, &event_id(*id)));
        ids
    }

    /// Runs batch `b`'s insert from where it stopped: each id is a duplicate if recorded or
    /// already this batch's, waits if another open batch holds it, else is recorded.
    pub(super) fn run_insert(&mut self, b: usize) {
        let mut insert = self.batches[b]
            .insert
            .take()
            .expect("an insert in progress");
        while let Some(&id) = insert.ids.get(insert.next) {
            if self.present(id) || self.batches[b].held.contains(&id) {
                insert.next += 1;
            } else if let Some(holder) = self.holder(id, b) {
                self.batches[b].waiting = Some(Wait::Key { holder });
                self.batches[b].insert = Some(insert);
                return;
            } else {
                self.batches[b].held.push(id);
                insert.accepted.push(id);
                insert.next += 1;
            }
        }
        self.batches[b].waiting = None;
        let mut accepted = insert.accepted;
        accepted.sort_unstable();
        self.done.push(Done::Insert { batch: b, accepted });
    }

    /// Where batch `b`'s insert of `ids` would stop: `None` if it finishes, else why it waits and
    /// the ids it has left.
    pub(super) fn would_wait(&self, b: usize, ids: &[usize]) -> Option<(Wait, Vec<usize>)> {
        if self.postgres && !self.batches[b].ring_lock && self.maintenance.is_some() {
            return Some((Wait::Ring, ids.to_vec()));
        }
        let mut trial = self.clone();
        trial.done.clear();
        trial.batches[b].ring_lock = true;
        trial.batches[b].insert = Some(Insert {
            ids: ids.to_vec(),
            ..Insert::default()
        });
        trial.run_insert(b);
        let batch = &trial.batches[b];
        let insert = batch.insert.as_ref()?;
        Some((batch.waiting?, insert.ids[insert.next..].to_vec()))
    }

    /// The ids a waiting batch has left to insert.
    pub(super) fn remaining(&self, b: usize) -> &[usize] {
        match &self.batches[b].insert {
            Some(insert) => &insert.ids[insert.next..],
            None => &[],
        }
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
            for id in batch.held {
                self.recorded[id] = Some((self.current, epoch));
            }
        }
        self.release(b);
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
