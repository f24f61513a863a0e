//! The reference model of the dedup record: which ids are recorded in which generation of the
//! ring, what the open batches hold, and which calls wait for which (the locking protocol of
//! `store::dedup` on PostgreSQL, one writer at a time on SQLite). It predicts every call's
//! result and drives the generation of valid schedules; the invariants are checked in `sut.rs`
//! against what the store actually answered.
//!
//! Times are seconds of the model's clock, which moves only by time travel (`Travel`): the store's
//! own clock barely moves during a case, and the test moves every timestamp of
//! `dedup_generations` back instead. Travel steps are whole hours plus 7 minutes and windows are
//! whole days, so no sum of fewer than 60 steps lands exactly on a window or a third of one: the
//! few milliseconds the real clock moves never decide a comparison.

use std::collections::BTreeSet;

use dedup_worker::store::dedup::{dedup_key, CREATED_MARGIN, RING_SLOTS};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest_state_machine::ReferenceStateMachine;

/// Connections that run batches.
pub const BATCHES: usize = 3;
/// Event ids in play (`evt_0` …): few, so that deliveries repeat and batches share them.
pub const IDS: usize = 6;
const SLOTS: usize = RING_SLOTS as usize;
pub const HOUR: i64 = 3_600;
pub const DAY: i64 = 86_400;
/// Creation times claimed this far ahead of an event's first delivery are forged: the store must
/// not skip a generation for them. Beyond any case's time travel (at most 40 steps of 9 days),
/// so every delivery finds the claim too far ahead. Closer (2 days and a minute), a later
/// delivery finds it within the margin, and the store of issue 26 item 2 trusted it then: an
/// event first delivered without a creation time, recorded, the generation sealed, delivered a
/// day later claiming one a day past the seal, was recorded again.
pub const FORGED_AHEAD: i64 = 1_000 * DAY;

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
    /// The calls that finished in the last step.
    pub done: Vec<Done>,
}

impl State {
    fn new(postgres: bool) -> Self {
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
    fn run_insert(&mut self, b: usize) {
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
    fn would_wait(&self, b: usize, ids: &[usize]) -> Option<(Wait, Vec<usize>)> {
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
    fn remaining(&self, b: usize) -> &[usize] {
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

    fn end(&mut self, b: usize, commit: bool) {
        let batch = std::mem::take(&mut self.batches[b]);
        if commit {
            let epoch = self.ring[self.current].expect("a current generation").epoch;
            for id in batch.held {
                self.recorded[id] = Some((self.current, epoch));
            }
        }
        self.release(b);
    }

    fn maintain(&mut self, seal_now: bool) {
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

/// A delivery of one of `ids` (the schedule's interesting ones: held by an open batch, or
/// recorded) or of any id.
fn delivery(ids: Vec<usize>) -> impl Strategy<Value = Delivery> {
    let created = prop_oneof![
        6 => (-3 * 24 * 60..=CREATED_MARGIN.as_secs() as i64 / 60).prop_map(Created::MinutesFromNow),
        1 => Just(Created::MinutesFromNow(CREATED_MARGIN.as_secs() as i64 / 60)),
        1 => Just(Created::Forged),
    ];
    let id = if ids.is_empty() {
        (0..IDS).boxed()
    } else {
        prop_oneof![1 => 0..IDS, 1 => prop::sample::select(ids)].boxed()
    };
    (id, prop::bool::weighted(0.7), created).prop_map(|(id, with_created, created)| Delivery {
        id,
        with_created,
        created,
    })
}

/// The model for one store: `POSTGRES` or SQLite.
pub struct DedupModel<const POSTGRES: bool>;

impl<const POSTGRES: bool> ReferenceStateMachine for DedupModel<POSTGRES> {
    type State = State;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<State> {
        Just(State::new(POSTGRES)).boxed()
    }

    fn transitions(state: &State) -> BoxedStrategy<Step> {
        let closed: Vec<usize> = (0..BATCHES)
            .filter(|&b| !state.batches[b].open && state.batches[b].waiting.is_none())
            .collect();
        let ready: Vec<usize> = (0..BATCHES)
            .filter(|&b| state.batches[b].open && state.batches[b].waiting.is_none())
            .collect();
        // Seals and expiry are most telling while batches hold the ring lock, and while one
        // waits for them, so are batches beginning and inserting (they queue behind it).
        let holders = state.batches.iter().any(|b| b.ring_lock);
        let pending = state.maintenance.is_some();
        let mut options: Vec<(u32, BoxedStrategy<Step>)> =
            vec![(1, (2..=9i64).prop_map(Step::Window).boxed())];
        if !pending {
            let maintenance = if holders { 4 } else { 2 };
            options.extend([
                (
                    2,
                    (0..=120i64)
                        .prop_map(|h| Step::Travel(h * HOUR + 7 * 60))
                        .boxed(),
                ),
                // Just past the window: the oldest sealed generations expire at the next pass.
                (1, Just(Step::Travel(state.window + 7 * 60)).boxed()),
                (maintenance, Just(Step::Seal).boxed()),
                (maintenance, Just(Step::Retention).boxed()),
            ]);
        }
        if !closed.is_empty() {
            options.push((
                if pending { 5 } else { 3 },
                prop::sample::select(closed).prop_map(Step::Begin).boxed(),
            ));
        }
        for &b in &ready {
            // Ids recorded, and (while this batch holds none, so it may wait for them) those
            // other batches hold or are inserting.
            let interesting: Vec<usize> = (0..IDS)
                .filter(|&id| {
                    state.recorded[id].is_some()
                        || (state.batches[b].held.is_empty()
                            && state.batches.iter().any(|o| {
                                o.held.contains(&id)
                                    || o.insert.as_ref().is_some_and(|i| i.ids.contains(&id))
                            }))
                })
                .collect();
            options.push((
                if pending && !state.batches[b].ring_lock {
                    12
                } else {
                    8
                },
                prop::collection::vec(delivery(interesting), 1..=3)
                    .prop_map(move |d| Step::Insert(b, d))
                    .boxed(),
            ));
            options.push((3, Just(Step::Commit(b)).boxed()));
            options.push((1, Just(Step::Rollback(b)).boxed()));
        }
        Union::new_weighted(options).boxed()
    }

    fn preconditions(state: &State, step: &Step) -> bool {
        let other_waits = |except: usize| {
            (0..BATCHES).any(|b| b != except && state.batches[b].waiting.is_some())
                || state.maintenance.is_some()
        };
        match step {
            Step::Begin(b) => {
                let batch = &state.batches[*b];
                if batch.open || batch.waiting.is_some() {
                    return false;
                }
                // SQLite: a begin behind the writer waits; at most one call waits at a time
                // there (which of two would get the lock first is the OS's choice).
                state.postgres
                    || !(state.batches.iter().any(|b| b.open) || state.maintenance.is_some())
                    || !other_waits(*b)
            }
            Step::Insert(b, deliveries) => {
                let batch = &state.batches[*b];
                if !batch.open || batch.waiting.is_some() || deliveries.is_empty() {
                    return false;
                }
                let ids = State::in_key_order(deliveries);
                match state.would_wait(*b, &ids) {
                    None => true,
                    // Batches that go on together must not race for an id: those behind a seal
                    // insert disjoint ids, as do those waiting for keys.
                    Some((Wait::Ring, _)) => (0..BATCHES).all(|o| {
                        o == *b
                            || state.batches[o].waiting != Some(Wait::Ring)
                            || state.remaining(o).iter().all(|id| !ids.contains(id))
                    }),
                    // Only a batch holding nothing yet may wait for a key (batches insert in key
                    // order, so waits never form a cycle: PostgreSQL would abort one).
                    Some((Wait::Key { .. }, left)) => {
                        batch.held.is_empty()
                            && (0..BATCHES).all(|o| {
                                o == *b
                                    || !matches!(state.batches[o].waiting, Some(Wait::Key { .. }))
                                    || state.remaining(o).iter().all(|id| !left.contains(id))
                            })
                    }
                    Some((Wait::Begin, _)) => false,
                }
            }
            Step::Commit(b) | Step::Rollback(b) => {
                state.batches[*b].open && state.batches[*b].waiting.is_none()
            }
            Step::Seal | Step::Retention => {
                state.maintenance.is_none()
                    && (state.postgres
                        || !state.batches.iter().any(|b| b.open)
                        || !other_waits(BATCHES))
            }
            Step::Window(days) => *days > 0,
            Step::Travel(_) => {
                state.maintenance.is_none()
                    && (state.postgres
                        || state.batches.iter().all(|b| !b.open && b.waiting.is_none()))
            }
        }
    }

    fn apply(mut state: State, step: &Step) -> State {
        state.done.clear();
        match step {
            Step::Begin(b) => {
                let waits = !state.postgres
                    && (state.batches.iter().any(|b| b.open) || state.maintenance.is_some());
                if waits {
                    state.batches[*b].waiting = Some(Wait::Begin);
                } else {
                    state.batches[*b].open = true;
                    state.done.push(Done::Begin(*b));
                }
            }
            Step::Insert(b, deliveries) => {
                for d in deliveries {
                    if state.created[d.id].is_none() {
                        state.created[d.id] = Some(match d.created {
                            Created::MinutesFromNow(m) => state.now + m * 60,
                            Created::Forged => state.now + FORGED_AHEAD,
                        });
                    }
                }
                let ids = State::in_key_order(deliveries);
                state.batches[*b].insert = Some(Insert {
                    ids,
                    ..Insert::default()
                });
                if state.postgres && !state.batches[*b].ring_lock && state.maintenance.is_some() {
                    state.batches[*b].waiting = Some(Wait::Ring);
                } else {
                    state.batches[*b].ring_lock = state.postgres;
                    state.run_insert(*b);
                }
            }
            Step::Commit(b) => state.end(*b, true),
            Step::Rollback(b) => state.end(*b, false),
            Step::Seal => state.maintain(true),
            Step::Retention => state.maintain(false),
            Step::Window(days) => state.window = days * DAY,
            Step::Travel(seconds) => state.now += seconds,
        }
        state
    }
}
