//! The schedules: which steps are valid in a state of the model (so that the calls that go on
//! together never race for a lock, and waits never form a cycle), and which are likely (those
//! that reach the protocol's corners: seals while batches hold the ring lock, ids other batches
//! hold, expiry under open batches, a change claimed by several batches, an alias recorded or
//! held elsewhere, a record undone).

use proptest::prelude::*;
use proptest::strategy::Union;
use proptest_state_machine::ReferenceStateMachine;

use super::model::{Delivery, Done, Insert, State, Step, Wait, BATCHES, CHANGES, DAY, HOUR, KEYS};

/// A delivery of one of `changes` (the schedule's interesting ones: one of whose ids is held by
/// an open batch, or recorded) or of any change: most often a copy carrying the alias (a thin
/// event, an EventBridge envelope), or one without (a snapshot event by webhook), sometimes an
/// earlier release's delivery under the old id.
fn delivery(changes: Vec<usize>) -> impl Strategy<Value = Delivery> {
    let change = if changes.is_empty() {
        (0..CHANGES).boxed()
    } else {
        prop_oneof![1 => 0..CHANGES, 1 => prop::sample::select(changes)].boxed()
    };
    let kind =
        prop_oneof![5 => Just((0, true)), 3 => Just((0, false)), 2 => Just((CHANGES, false))];
    (change, kind).prop_map(|(change, (old, aliased))| Delivery {
        key: change + old,
        aliased,
    })
}

/// The model for one store: `POSTGRES` or SQLite.
pub struct DedupModel<const POSTGRES: bool>;

impl<const POSTGRES: bool> DedupModel<POSTGRES> {
    /// Whether an earlier release may record `key` in the legacy table now. On SQLite only
    /// between batches (it takes the one writer). On PostgreSQL while no insert is under way
    /// (an insert's lookups of the legacy table see the statement's snapshot, so a record made
    /// while it waits for a key would not count) and no open batch holds the id (it was not
    /// recorded when that batch recorded it: no double acceptance to report). No release running
    /// beside this one writes the legacy table (it is what the upgrade found); records appear
    /// during a case only so that they meet the ring in every state.
    fn legacy_allowed(state: &State, key: usize) -> bool {
        if state.postgres {
            state
                .batches
                .iter()
                .all(|b| b.insert.is_none() && !b.claimed.contains(&key))
        } else {
            state.maintenance.is_none()
                && state.batches.iter().all(|b| !b.open && b.waiting.is_none())
        }
    }
}

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
        // An earlier release's record in the legacy table, of an id no batch holds (see the
        // preconditions): most often an old id, the alias of a change.
        let legacy: Vec<usize> = (0..KEYS)
            .filter(|&k| !state.legacy[k] && Self::legacy_allowed(state, k))
            .collect();
        if !legacy.is_empty() {
            let old: Vec<usize> = legacy.iter().copied().filter(|&k| k >= CHANGES).collect();
            let key = if old.is_empty() {
                prop::sample::select(legacy).boxed()
            } else {
                prop_oneof![3 => prop::sample::select(old), 1 => prop::sample::select(legacy)]
                    .boxed()
            };
            options.push((1, key.prop_map(Step::Legacy).boxed()));
        }
        for &b in &ready {
            // Changes with an id recorded, and (while this batch claims none, so it may wait
            // for them) those with an id other batches hold or are inserting.
            let interesting: Vec<usize> = (0..CHANGES)
                .filter(|&c| {
                    [c, c + CHANGES].iter().any(|&k| {
                        state.present(k)
                            || (state.batches[b].claimed.is_empty()
                                && state.batches.iter().any(|o| {
                                    o.claimed.contains(&k)
                                        || o.insert
                                            .as_ref()
                                            .is_some_and(|i| i.rows.iter().any(|r| r.key == k))
                                }))
                    })
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
            // A copy carrying the alias of a change another open batch holds an id of: its key
            // (the change claimed from two connections at once: this batch waits, so only while
            // it claims nothing) or its old id (an earlier release's record, uncommitted, which
            // the lookup does not see).
            let may_wait = state.batches[b].claimed.is_empty();
            let copies: Vec<usize> = (0..CHANGES)
                .filter(|&c| {
                    let others = || (0..BATCHES).filter(|&o| o != b).map(|o| &state.batches[o]);
                    let claimed = others().any(|o| o.claimed.contains(&c));
                    (claimed && may_wait)
                        || (!claimed && others().any(|o| o.held.contains(&(c + CHANGES))))
                })
                .collect();
            if !copies.is_empty() {
                options.push((
                    8,
                    prop::sample::select(copies)
                        .prop_map(move |c| {
                            let copy = Delivery {
                                key: c,
                                aliased: true,
                            };
                            Step::Insert(b, vec![copy])
                        })
                        .boxed(),
                ));
            }
            if !state.batches[b].held.is_empty() {
                let held = state.batches[b].held.clone();
                options.push((
                    2,
                    prop::sample::select(held)
                        .prop_map(move |k| Step::Undo(b, k))
                        .boxed(),
                ));
            }
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
                let rows = State::in_key_order(deliveries);
                let ids: Vec<usize> = rows.iter().map(|r| r.key).collect();
                match state.would_wait(*b, &rows) {
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
                        batch.claimed.is_empty()
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
            // The consumer undoes only what the batch recorded, and only between its calls.
            Step::Undo(b, key) => {
                let batch = &state.batches[*b];
                batch.open && batch.waiting.is_none() && batch.held.contains(key)
            }
            Step::Legacy(key) => {
                *key < KEYS && !state.legacy[*key] && Self::legacy_allowed(state, *key)
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
        state.seen.clear();
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
                state.batches[*b].insert = Some(Insert {
                    rows: State::in_key_order(deliveries),
                    ..Insert::default()
                });
                if state.postgres && !state.batches[*b].ring_lock && state.maintenance.is_some() {
                    state.batches[*b].waiting = Some(Wait::Ring);
                } else {
                    state.batches[*b].ring_lock = state.postgres;
                    state.run_insert(*b);
                }
            }
            Step::Undo(b, key) => state.undo(*b, *key),
            Step::Legacy(key) => state.legacy[*key] = true,
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
