//! The checks of what the store answered: the invariants on its own history first ("ACCEPTED
//! TWICE", "LOST", "LOST EARLY", "ROLLED BACK", "RING"), then the model's predictions
//! ("MODEL"); and what the schedules covered.

use std::collections::BTreeSet;

use super::super::model::{event_id, Done, Place, Seen, State, Step, Wait, KEYS, SOURCE};
use super::super::{Context, Coverage};
use super::{names, Call, Sut, LIMIT};

impl Sut {
    /// The checks of one insert's answer against the store's own history; returns its new ids.
    /// `before` is what the batch recorded in its earlier calls (undone ones taken out).
    pub(super) fn check_insert(
        &self,
        state: &State,
        batch: usize,
        call: &Call,
        before: &BTreeSet<usize>,
        answered: &[String],
    ) -> BTreeSet<usize> {
        let keys = call.keys();
        let what = format!("batch {batch}'s insert of {:?}", call.deliveries);
        let mut new = BTreeSet::new();
        for event in answered {
            let id = self.id_of(event);
            if !keys.contains(&id) || !new.insert(id) || before.contains(&id) {
                self.fail(format!(
                    "ACCEPTED TWICE: {what} answered {answered:?} (the batch had recorded {:?})",
                    names(before)
                ));
            }
            if let Some((at, window)) = self.history.in_window(id, state.now) {
                self.fail(format!(
                    "ACCEPTED TWICE: {what} recorded {event} as new, committed at {at} s, less \
                     than the window ({window} s) before now ({} s)",
                    state.now
                ));
            }
            // Every copy carried the alias: the same message, which an earlier release recorded
            // under the alias (committed before the call, or by this batch).
            if let Some(alias) = call.alias(id) {
                let recorded = if before.contains(&alias) {
                    Some("by this batch".to_owned())
                } else if call.committed_before.contains(&alias) {
                    self.history.committed[alias]
                        .map(|(at, window)| format!("committed at {at} s, window {window} s"))
                } else {
                    None
                };
                if let Some(recorded) = recorded {
                    self.fail(format!(
                        "ACCEPTED TWICE: {what} recorded {event} as new though its alias {} was \
                         recorded before the call ({recorded})",
                        event_id(alias)
                    ));
                }
            }
        }
        for id in keys {
            let alias_ever = call
                .alias(id)
                .is_some_and(|alias| self.history.ever[alias] || before.contains(&alias));
            if !new.contains(&id) && !before.contains(&id) && !self.history.ever[id] && !alias_ever
            {
                self.fail(format!(
                    "LOST: {what} took {} for a duplicate though no batch ever committed it{}",
                    event_id(id),
                    if call.alias(id).is_some() {
                        " nor its alias"
                    } else {
                        ""
                    }
                ));
            }
        }
        new
    }

    /// The invariants on what the store holds (read while no maintenance pass waits, which on
    /// PostgreSQL may hold a generation's table).
    pub(super) fn check_store(&self, ctx: &mut Context, state: &State) {
        let all: Vec<String> = (0..KEYS).map(event_id).collect();
        let among = ctx
            .rt
            .block_on(tokio::time::timeout(
                LIMIT,
                ctx.store.dedup().processed_among(SOURCE, &all),
            ))
            .unwrap_or_else(|_| self.fail("processed_among did not answer".into()))
            .unwrap_or_else(|e| self.fail(format!("processed_among failed: {e:?}")));
        let held: BTreeSet<usize> = among.iter().map(|e| self.id_of(e)).collect();
        for id in &held {
            if !self.history.ever[*id] {
                self.fail(format!(
                    "ROLLED BACK: {} is recorded though no batch that recorded it (and did not \
                     undo it) committed",
                    event_id(*id)
                ));
            }
        }
        for id in 0..KEYS {
            if let Some((at, window)) = self.history.in_window(id, state.now) {
                if !held.contains(&id) {
                    self.fail(format!(
                        "LOST EARLY: {}, committed at {at} s, is no longer recorded at {} s, \
                         inside the window ({window} s)",
                        event_id(id),
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
        let expected: BTreeSet<usize> = (0..KEYS).filter(|id| state.present(*id)).collect();
        if held != expected {
            self.fail(format!(
                "MODEL: the store records {:?}, the model {:?} (ring {:?}, legacy {:?})",
                names(&held),
                names(&expected),
                state.recorded,
                state.legacy
            ));
        }
    }
}

pub(super) fn count(coverage: &mut Coverage, state: &State, step: &Step) {
    coverage.steps += 1;
    match step {
        Step::Insert(b, deliveries) => {
            coverage.inserts += 1;
            coverage.aliased += deliveries.iter().filter(|d| d.aliased).count() as u32;
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
        Step::Undo(..) => coverage.undone += 1,
        Step::Legacy(_) => coverage.legacy_records += 1,
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
    for seen in &state.seen {
        let count = match seen {
            Seen::AliasDuplicate(Place::Sealed) => &mut coverage.alias_in_sealed,
            Seen::AliasDuplicate(Place::Current) => &mut coverage.alias_in_current,
            Seen::AliasDuplicate(Place::Legacy) => &mut coverage.alias_in_legacy,
            Seen::AliasDuplicate(Place::Batch) => &mut coverage.alias_in_batch,
            Seen::AliasUncommitted => &mut coverage.alias_uncommitted,
            Seen::AliasedClaimWaits => &mut coverage.aliased_waits_for_key,
            Seen::NewAgain => &mut coverage.new_again,
        };
        *count += 1;
    }
}
