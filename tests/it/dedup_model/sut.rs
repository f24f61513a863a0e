//! The system under test: the real store, driven through its public API by the steps the model
//! generated, each call that waits on a lock spawned and awaited only once the model says it can
//! go on. After every step the invariants are checked against what the store answered (its own
//! history, not the model's predictions), then the answers against the model's.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use dedup_worker_core::store::{ProcessedEvent, RingMaintenance, StoreError, StoreTx};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::task::JoinHandle;

use super::model::{
    alias_of, event_id, key_of, Delivery, Done, State, Step, BATCHES, KEYS, SOURCE,
};
use super::schedule::DedupModel;
use super::{with_context, Context, Leftover};

mod checks;

/// The longest any call may take once nothing holds it up, and the longest the store may take
/// to show the waits the model predicts.
const LIMIT: Duration = Duration::from_secs(20);

type Inserted = (StoreTx, Result<Vec<String>, StoreError>);

/// One connection's batch.
#[derive(Default)]
enum Conn {
    #[default]
    Closed,
    Beginning(JoinHandle<Result<StoreTx, StoreError>>),
    /// The transaction, and the ids it recorded (undone ones taken out).
    Idle(StoreTx, BTreeSet<usize>),
    Inserting(JoinHandle<Inserted>, BTreeSet<usize>, Call),
}

/// An insert call: its deliveries, and the ids committed less than the window before it was
/// made (what its lookups must find whatever happens while it runs).
pub(super) struct Call {
    deliveries: Vec<Delivery>,
    committed_before: BTreeSet<usize>,
}

impl Call {
    pub(super) fn keys(&self) -> Vec<usize> {
        let keys: BTreeSet<usize> = self.deliveries.iter().map(|d| d.key).collect();
        keys.into_iter().collect()
    }

    /// The alias of `key`'s copies in this call, if every copy carries it.
    pub(super) fn alias(&self, key: usize) -> Option<usize> {
        let mut copies = self.deliveries.iter().filter(|d| d.key == key).peekable();
        copies.peek()?;
        copies.all(|d| d.aliased).then(|| alias_of(key))
    }
}

/// What the store answered so far: when each id was committed (by a batch, or in the legacy
/// table), and the shortest window in effect since.
#[derive(Default)]
struct History {
    committed: [Option<(i64, i64)>; KEYS],
    ever: [bool; KEYS],
}

impl History {
    fn in_window(&self, id: usize, now: i64) -> Option<(i64, i64)> {
        self.committed[id].filter(|(at, window)| now - at < *window)
    }
}

pub struct Sut {
    conns: [Conn; BATCHES],
    maintenance: Option<JoinHandle<Result<RingMaintenance, StoreError>>>,
    /// When the running maintenance pass started (it may wait at most `RING_LOCK_TIMEOUT`).
    maintenance_since: Option<Instant>,
    history: History,
    /// The steps so far, and what the store did that the model did not expect it to do yet.
    log: Vec<String>,
}

impl Sut {
    fn fail(&self, what: String) -> ! {
        super::FIRST_FAILURE.with(|first| {
            if first.get().is_none() {
                first.set(Some(super::CASES_RUN.with(|n| n.get())));
            }
        });
        panic!("{what}\nsteps applied:\n  {}", self.log.join("\n  "));
    }

    fn id_of(&self, event: &str) -> usize {
        key_of(event)
            .unwrap_or_else(|| self.fail(format!("the store answered an unknown id {event:?}")))
    }

    /// Runs `what` on batch `b`'s transaction to its answer (it waits for nothing).
    fn end_call<T>(
        &self,
        ctx: &Context,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> T {
        match ctx.rt.block_on(tokio::time::timeout(LIMIT, call)) {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => self.fail(format!("{what} failed: {e:?}")),
            Err(_) => self.fail(format!("{what} did not answer within {LIMIT:?}")),
        }
    }

    fn wait<T>(&self, ctx: &Context, what: &str, handle: JoinHandle<T>) -> T {
        match ctx.rt.block_on(tokio::time::timeout(LIMIT, handle)) {
            Ok(Ok(value)) => value,
            Ok(Err(join)) => self.fail(format!("{what}: the task failed: {join}")),
            Err(_) => self.fail(format!(
                "{what} did not finish within {LIMIT:?} though the model says nothing holds it up"
            )),
        }
    }

    fn apply_step(&mut self, ctx: &mut Context, state: &State, step: &Step) {
        self.log.push(match step {
            Step::Undo(b, key) => format!("Undo({b}, {})", event_id(*key)),
            Step::Legacy(key) => format!("Legacy({})", event_id(*key)),
            _ => format!("{step:?}"),
        });
        match step {
            Step::Begin(b) => {
                let store = ctx.store.clone();
                self.conns[*b] = Conn::Beginning(ctx.rt.spawn(async move { store.begin().await }));
            }
            Step::Insert(b, deliveries) => {
                let Conn::Idle(mut tx, accepted) = std::mem::take(&mut self.conns[*b]) else {
                    self.fail(format!("batch {b} is not open and idle"))
                };
                let events: Vec<ProcessedEvent> = deliveries
                    .iter()
                    .map(|d| ProcessedEvent {
                        id: event_id(d.key),
                        event_type: "test.event".into(),
                        alias: d.aliased.then(|| event_id(alias_of(d.key))),
                        ..ProcessedEvent::default()
                    })
                    .collect();
                let call = Call {
                    deliveries: deliveries.clone(),
                    committed_before: (0..KEYS)
                        .filter(|k| self.history.in_window(*k, state.now).is_some())
                        .collect(),
                };
                let handle = ctx.rt.spawn(async move {
                    let result = tx.insert_processed_events(SOURCE, &events).await;
                    (tx, result)
                });
                self.conns[*b] = Conn::Inserting(handle, accepted, call);
            }
            Step::Undo(b, key) => {
                let Conn::Idle(mut tx, mut accepted) = std::mem::take(&mut self.conns[*b]) else {
                    self.fail(format!("batch {b} is not open and idle"))
                };
                let id = event_id(*key);
                self.end_call(
                    ctx,
                    &format!("batch {b}'s delete_processed of {id}"),
                    tx.delete_processed(SOURCE, &id),
                );
                accepted.remove(key);
                self.conns[*b] = Conn::Idle(tx, accepted);
            }
            Step::Legacy(key) => {
                ctx.rt.block_on(ctx.record_legacy(&event_id(*key)));
                self.history.committed[*key] = Some((state.now, state.window));
                self.history.ever[*key] = true;
            }
            Step::Commit(b) | Step::Rollback(b) => {
                let Conn::Idle(tx, accepted) = std::mem::take(&mut self.conns[*b]) else {
                    self.fail(format!("batch {b} is not open and idle"))
                };
                let commit = matches!(step, Step::Commit(_));
                self.end_call(ctx, &format!("batch {b}'s end"), async move {
                    if commit {
                        tx.commit().await
                    } else {
                        tx.rollback().await
                    }
                });
                if commit {
                    for id in accepted {
                        if let Some((at, window)) = self.history.in_window(id, state.now) {
                            self.fail(format!(
                                "ACCEPTED TWICE: batch {b} committed {}, which was committed at \
                                 {at} s, less than the window ({window} s) before now ({} s)",
                                event_id(id),
                                state.now
                            ));
                        }
                        self.history.committed[id] = Some((state.now, state.window));
                        self.history.ever[id] = true;
                    }
                }
            }
            Step::Seal | Step::Retention => {
                let store = ctx.store.clone();
                // The window before this step (a Window step changes it, not this one).
                let window = Duration::from_secs(state.window as u64);
                let seal = matches!(step, Step::Seal);
                self.maintenance_since = Some(Instant::now());
                self.maintenance = Some(ctx.rt.spawn(async move {
                    if seal {
                        store.dedup().seal(window).await
                    } else {
                        store.dedup().maintain(window).await
                    }
                }));
            }
            Step::Window(_) => {
                for (_, window) in self.history.committed.iter_mut().flatten() {
                    *window = (*window).min(state.window);
                }
            }
            Step::Travel(seconds) => ctx.rt.block_on(ctx.travel(*seconds)),
        }
    }

    /// Collects the calls the model says finished in this step and checks their answers, then
    /// (PostgreSQL) waits until the store's sessions wait as the model says.
    fn settle(&mut self, ctx: &mut Context, state: &State) {
        for done in &state.done {
            match done {
                Done::Begin(b) => {
                    let Conn::Beginning(handle) = std::mem::take(&mut self.conns[*b]) else {
                        self.fail(format!("batch {b} was not beginning"))
                    };
                    match self.wait(ctx, &format!("batch {b}'s begin"), handle) {
                        Ok(tx) => self.conns[*b] = Conn::Idle(tx, BTreeSet::new()),
                        Err(e) => self.fail(format!("batch {b}'s begin failed: {e:?}")),
                    }
                }
                Done::Insert { batch, accepted } => {
                    let Conn::Inserting(handle, mut all, call) =
                        std::mem::take(&mut self.conns[*batch])
                    else {
                        self.fail(format!("batch {batch} was not inserting"))
                    };
                    let (tx, result) = self.wait(ctx, &format!("batch {batch}'s insert"), handle);
                    let answered = result.unwrap_or_else(|e| {
                        self.fail(format!(
                            "batch {batch}'s insert of {:?} failed: {e:?}",
                            call.deliveries
                        ))
                    });
                    let new = self.check_insert(state, *batch, &call, &all, &answered);
                    if new.iter().copied().collect::<Vec<_>>() != *accepted {
                        self.fail(format!(
                            "MODEL: batch {batch}'s insert of {:?} recorded {:?}, the model \
                             expected {:?}",
                            call.deliveries,
                            names(&new),
                            names(accepted)
                        ));
                    }
                    ctx.coverage.duplicates_in_sealed += call
                        .keys()
                        .iter()
                        .filter(|id| {
                            !new.contains(id)
                                && state.recorded[**id]
                                    .is_some_and(|(slot, _)| slot != state.current)
                        })
                        .count() as u32;
                    all.extend(new);
                    self.conns[*batch] = Conn::Idle(tx, all);
                }
                Done::Maintenance(expected) => {
                    let Some(handle) = self.maintenance.take() else {
                        self.fail("no maintenance pass was running".into())
                    };
                    let done = self
                        .wait(ctx, "the maintenance pass", handle)
                        .unwrap_or_else(|e| {
                            self.fail(format!("the maintenance pass failed: {e:?}"))
                        });
                    if let Some(since) = self.maintenance_since.take() {
                        let took = since.elapsed().as_millis() as u64;
                        let longest = &mut ctx.coverage.longest_maintenance_ms;
                        *longest = (*longest).max(took);
                    }
                    let got = (done.expired, done.sealed, done.next_slot_busy);
                    let want = (expected.expired, expected.sealed, expected.next_slot_busy);
                    if got != want {
                        self.fail(format!(
                            "MODEL: the maintenance pass did (expired, sealed, next slot busy) \
                             {got:?}, the model expected {want:?}"
                        ));
                    }
                }
            }
        }
        if state.postgres {
            self.wait_for_waits(ctx, state);
        }
    }

    /// Waits until as many sessions wait on a lock as the model has calls waiting (a call the
    /// model says waits may also have finished early: noted, and collected when the model says).
    fn wait_for_waits(&mut self, ctx: &mut Context, state: &State) {
        let expected = state.waiting() as i64;
        let deadline = Instant::now() + LIMIT;
        loop {
            let early = self.running().filter(|h| *h).count() as i64;
            let waiting = ctx.rt.block_on(ctx.lock_waiters());
            if waiting + early == expected {
                if early > 0 {
                    self.log.push(format!(
                        "  ({early} call(s) the model says wait had already finished)"
                    ));
                }
                return;
            }
            if Instant::now() > deadline {
                self.fail(format!(
                    "the store has {waiting} session(s) waiting on locks and {early} call(s) \
                     finished early; the model has {expected} call(s) waiting"
                ));
            }
            ctx.rt
                .block_on(tokio::time::sleep(Duration::from_millis(2)));
        }
    }

    /// For each spawned call not yet collected: whether it has finished.
    fn running(&self) -> impl Iterator<Item = bool> + '_ {
        let conns = self.conns.iter().filter_map(|c| match c {
            Conn::Beginning(h) => Some(h.is_finished()),
            Conn::Inserting(h, ..) => Some(h.is_finished()),
            _ => None,
        });
        conns.chain(self.maintenance.iter().map(|h| h.is_finished()))
    }

    /// Ends every batch and collects every call, so the next case starts on an idle store.
    fn clean(&mut self, ctx: &mut Context) {
        let deadline = Instant::now() + LIMIT;
        loop {
            for conn in &mut self.conns {
                match std::mem::take(conn) {
                    Conn::Idle(tx, _) => {
                        let _ = ctx.rt.block_on(tokio::time::timeout(LIMIT, tx.rollback()));
                    }
                    Conn::Beginning(h) if h.is_finished() => {
                        if let Ok(Ok(tx)) = ctx.rt.block_on(h) {
                            *conn = Conn::Idle(tx, BTreeSet::new());
                        }
                    }
                    Conn::Inserting(h, ..) if h.is_finished() => {
                        if let Ok((tx, _)) = ctx.rt.block_on(h) {
                            *conn = Conn::Idle(tx, BTreeSet::new());
                        }
                    }
                    other => *conn = other,
                }
            }
            if self.maintenance.as_ref().is_some_and(|h| h.is_finished()) {
                self.maintenance = None;
            }
            let busy = self.conns.iter().any(|c| !matches!(c, Conn::Closed));
            if !busy && self.maintenance.is_none() {
                return;
            }
            if Instant::now() > deadline {
                return; // what is left goes to the context's leftovers (Drop)
            }
            ctx.rt
                .block_on(tokio::time::sleep(Duration::from_millis(5)));
        }
    }
}

impl Drop for Sut {
    /// A case that failed leaves its transactions and calls to the next case, which ends them.
    fn drop(&mut self) {
        let mut left = Vec::new();
        for conn in &mut self.conns {
            match std::mem::take(conn) {
                Conn::Closed => {}
                Conn::Beginning(h) => left.push(Leftover::Begin(h)),
                Conn::Idle(tx, _) => left.push(Leftover::Tx(tx)),
                Conn::Inserting(h, ..) => left.push(Leftover::Insert(h)),
            }
        }
        if let Some(h) = self.maintenance.take() {
            left.push(Leftover::Maintenance(h));
        }
        if !left.is_empty() {
            super::leave(left);
        }
    }
}

/// The ids of `keys`, for the messages.
pub(super) fn names<'k>(keys: impl IntoIterator<Item = &'k usize>) -> Vec<String> {
    keys.into_iter().map(|k| event_id(*k)).collect()
}

/// The model and the store, for one backend.
pub struct DedupTest<const POSTGRES: bool>;

impl<const POSTGRES: bool> StateMachineTest for DedupTest<POSTGRES> {
    type SystemUnderTest = Sut;
    type Reference = DedupModel<POSTGRES>;

    fn init_test(_: &<Self::Reference as ReferenceStateMachine>::State) -> Sut {
        with_context(|ctx| {
            ctx.coverage.cases += 1;
            super::CASES_RUN.with(|n| n.set(n.get() + 1));
            let rt = ctx.rt.handle().clone();
            rt.block_on(ctx.reset());
        });
        Sut {
            conns: Default::default(),
            maintenance: None,
            maintenance_since: None,
            history: History::default(),
            log: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, state: &State, step: Step) -> Sut {
        with_context(|ctx| {
            sut.apply_step(ctx, state, &step);
            sut.settle(ctx, state);
            checks::count(&mut ctx.coverage, state, &step);
        });
        sut
    }

    fn check_invariants(sut: &Sut, state: &State) {
        if state.maintenance.is_none() {
            with_context(|ctx| sut.check_store(ctx, state));
        }
    }

    fn teardown(mut sut: Sut) {
        with_context(|ctx| sut.clean(ctx));
    }
}
