//! The checks of what the store answered: the invariants on its own history first ("ACCEPTED
//! TWICE", "LOST", "LOST EARLY", "ROLLED BACK", "RING"), then the model's predictions
//! ("MODEL"); and what the schedules covered.

use std::collections::BTreeSet;

use super::super::model::{event_id, Done, State, Step, Wait, IDS, SOURCE};
use super::super::{Context, Coverage};
use super::{Sut, LIMIT};

impl Sut {
    /// The checks of one insert's answer against the store's own history; returns its new ids.
    pub(super) fn check_insert(
        &self,
        state: &State,
        batch: usize,
        ids: &[usize],
        before: &BTreeSet<usize>,
        answered: &[String],
    ) -> BTreeSet<usize> {
        let mut new = BTreeSet::new();
        for event in answered {
            let id = self.id_of(event);
            if !ids.contains(&id) || !new.insert(id) || before.contains(&id) {
                self.fail(format!(
                    "ACCEPTED TWICE: batch {batch}'s insert of {ids:?} answered {answered:?} (it \
                     had recorded {before:?})"
                ));
            }
            if let Some((at, window)) = self.history.in_window(id, state.now) {
                self.fail(format!(
                    "ACCEPTED TWICE: batch {batch} recorded evt_{id} as new, committed at {at} s, \
                     less than the window ({window} s) before now ({} s)",
                    state.now
                ));
            }
        }
        for id in ids {
            if !new.contains(id) && !before.contains(id) && !self.history.ever[*id] {
                self.fail(format!(
                    "LOST: batch {batch} took evt_{id} for a duplicate though no batch ever \
                     committed it"
                ));
            }
        }
        new
    }

    /// The invariants on what the store holds (read while no maintenance pass waits, which on
    /// PostgreSQL may hold a generation's table).
    pub(super) fn check_store(&self, ctx: &mut Context, state: &State) {
        let all: Vec<String> = (0..IDS).map(event_id).collect();
        let among = ctx
            .rt
            .block_on(tokio::time::timeout(
                LIMIT,
                ctx.store.processed_among(SOURCE, &all),
            ))
            .unwrap_or_else(|_| self.fail("processed_among did not answer".into()))
            .unwrap_or_else(|e| self.fail(format!("processed_among failed: {e:?}")));
        let held: BTreeSet<usize> = among.iter().map(|e| self.id_of(e)).collect();
        for id in &held {
            if !self.history.ever[*id] {
                self.fail(format!(
                    "ROLLED BACK: evt_{id} is recorded though no batch that recorded it committed"
                ));
            }
        }
        for id in 0..IDS {
            if let Some((at, window)) = self.history.in_window(id, state.now) {
                if !held.contains(&id) {
                    self.fail(format!(
                        "LOST EARLY: evt_{id}, committed at {at} s, is no longer recorded at {} s, \
                         inside the window ({window} s)",
                        state.now
                    ));
                }
            }
        }
        let ring = ctx.rt.block_on(ctx.generations());
        if ring.iter().filter(|(_, current)| *current).count() != 1 {
            self.fail(format!("RING: not one current generation: {ring:?}"));
        }
        let model_ring: Vec<(i64, bool)> = (0..state.ring.len())
            .filter_map(|s| state.ring[s].map(|g| (s as i64, g.sealed.is_none())))
            .collect();
        if ring != model_ring {
            self.fail(format!(
                "MODEL: the ring is {ring:?}, the model's {model_ring:?}"
            ));
        }
        let expected: BTreeSet<usize> = (0..IDS)
            .filter(|id| state.recorded[*id].is_some())
            .collect();
        if held != expected {
            self.fail(format!(
                "MODEL: the store records {held:?}, the model {expected:?} ({:?})",
                state.recorded
            ));
        }
    }
}

pub(super) fn count(coverage: &mut Coverage, state: &State, step: &Step) {
    coverage.steps += 1;
    match step {
        Step::Insert(b, deliveries) => {
            coverage.inserts += 1;
            coverage.with_created += deliveries.iter().filter(|d| d.with_created).count() as u32;
            coverage.forged += deliveries
                .iter()
                .filter(|d| d.with_created && state.forged[d.id])
                .count() as u32;
            match state.batches[*b].waiting {
                Some(Wait::Key { .. }) => coverage.waits_for_key += 1,
                Some(Wait::Ring) => {
                    coverage.waits_for_ring += 1;
                    if let Some(m) = state.maintenance {
                        if !state.plan(m.window, m.seal_now).0.is_empty() {
                            coverage.waits_behind_expiry += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        Step::Begin(b) if state.batches[*b].waiting.is_some() => coverage.waits_for_begin += 1,
        Step::Seal | Step::Retention if state.maintenance.is_some() => {
            coverage.waits_of_maintenance += 1
        }
        _ => {}
    }
    for done in &state.done {
        match done {
            Done::Maintenance(m) => {
                coverage.seals += u32::from(m.sealed);
                coverage.expired += m.expired as u32;
                coverage.next_slot_busy += u32::from(m.next_slot_busy);
            }
            Done::Insert { .. } | Done::Begin(_) => {}
        }
    }
}
