//! The schedules: which steps are valid in a state of the model (so that the calls that go on
//! together never race for a lock, and waits never form a cycle), and which are likely (those
//! that reach the protocol's corners: seals while batches hold the ring lock, ids other batches
//! hold, expiry under open batches).

use proptest::prelude::*;
use proptest::strategy::Union;
use proptest_state_machine::ReferenceStateMachine;

use super::model::{
    Created, Delivery, Done, Insert, State, Step, Wait, BATCHES, DAY, FORGED_AHEAD, HOUR, IDS,
};

/// A delivery of one of `ids` (the schedule's interesting ones: held by an open batch, or
/// recorded) or of any id.
fn delivery(ids: Vec<usize>) -> impl Strategy<Value = Delivery> {
    let created = prop_oneof![
        6 => (-3 * 24 * 60..=DAY / 60).prop_map(Created::MinutesFromNow),
        1 => Just(Created::MinutesFromNow(DAY / 60)),
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
                        state.forged[d.id] = d.created == Created::Forged;
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
