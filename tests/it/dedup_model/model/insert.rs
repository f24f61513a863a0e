//! How one `insert_processed_events` call decides, row by row in the store's order:
//! 1. a row whose copies all carry an alias is a duplicate if the alias is recorded: committed
//!    (in any generation or the legacy table) when the statement started, or recorded earlier by
//!    the same batch. The lookup is a `NOT EXISTS` under the statement's snapshot: it never waits,
//!    never sees another open batch's rows, nor what commits while the statement waits for a key;
//! 2. an id recorded and committed, or recorded by the same batch, is a duplicate;
//! 3. an id another open batch inserted (an undone row too: its row version is that batch's until
//!    it ends) waits for that batch: the primary key claims the change, so copies from several
//!    connections at once are one new event;
//! 4. anything else is recorded as new.

use std::collections::BTreeMap;

use dedup_worker_core::store::dedup::dedup_key;

use super::{alias_of, event_id, Delivery, Insert, Place, Seen, State, Wait, BATCHES, SOURCE};

/// One row of an insert: an id, and the alias that can make it a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub key: usize,
    /// The alias, if every delivery of the id in the call carries it: the store inserts each
    /// delivery as a row of its own, so a copy without the alias (or with one not found) passes
    /// the lookups, and the primary key makes the copies one.
    pub alias: Option<usize>,
}

impl State {
    /// The rows of a delivery list as the store inserts them: one per id, by dedup key.
    pub fn in_key_order(deliveries: &[Delivery]) -> Vec<Row> {
        let mut aliased = BTreeMap::new();
        for d in deliveries {
            *aliased.entry(d.key).or_insert(true) &= d.aliased;
        }
        let mut rows: Vec<Row> = aliased
            .into_iter()
            .map(|(key, aliased)| Row {
                key,
                alias: aliased.then(|| alias_of(key)),
            })
            .collect();
        rows.sort_by_key(|row| dedup_key(SOURCE, &event_id(row.key)));
        rows
    }

    /// The aliases of `rows` that batch `b`'s statement finds if it starts now, and where.
    fn snapshot(&self, b: usize, rows: &[Row]) -> Vec<(usize, Place)> {
        rows.iter()
            .filter_map(|row| row.alias)
            .filter_map(|alias| {
                let place = match self.recorded[alias] {
                    Some((slot, _)) if slot == self.current => Place::Current,
                    Some(_) => Place::Sealed,
                    None if self.legacy[alias] => Place::Legacy,
                    None if self.batches[b].held.contains(&alias) => Place::Batch,
                    None => return None,
                };
                Some((alias, place))
            })
            .collect()
    }

    fn held_by_another(&self, key: usize, b: usize) -> bool {
        (0..BATCHES).any(|o| o != b && self.batches[o].held.contains(&key))
    }

    /// Runs batch `b`'s insert from where it stopped (see the module above).
    pub(crate) fn run_insert(&mut self, b: usize) {
        let mut insert = self.batches[b]
            .insert
            .take()
            .expect("an insert in progress");
        // Taken when the statement starts: on PostgreSQL after the ring lock, which a batch
        // behind a seal waits for first, so not when the step was issued.
        let snapshot = match insert.snapshot.take() {
            Some(snapshot) => snapshot,
            None => self.snapshot(b, &insert.rows),
        };
        while let Some(&row) = insert.rows.get(insert.next) {
            let alias_found = row
                .alias
                .and_then(|alias| snapshot.iter().find(|(a, _)| *a == alias));
            if let Some(&(_, place)) = alias_found {
                self.seen.push(Seen::AliasDuplicate(place));
                insert.next += 1;
            } else if self.present(row.key) || self.batches[b].held.contains(&row.key) {
                insert.next += 1;
            } else if let Some(holder) = self.holder(row.key, b) {
                if row.alias.is_some() {
                    self.seen.push(Seen::AliasedClaimWaits);
                }
                self.batches[b].waiting = Some(Wait::Key { holder });
                insert.snapshot = Some(snapshot);
                self.batches[b].insert = Some(insert);
                return;
            } else {
                if row
                    .alias
                    .is_some_and(|alias| self.held_by_another(alias, b))
                {
                    self.seen.push(Seen::AliasUncommitted);
                }
                if std::mem::take(&mut self.undone[row.key]) {
                    self.seen.push(Seen::NewAgain);
                }
                let batch = &mut self.batches[b];
                batch.held.push(row.key);
                if !batch.claimed.contains(&row.key) {
                    batch.claimed.push(row.key);
                }
                insert.accepted.push(row.key);
                insert.next += 1;
            }
        }
        self.batches[b].waiting = None;
        let mut accepted = insert.accepted;
        accepted.sort_unstable();
        self.done.push(super::Done::Insert { batch: b, accepted });
    }

    /// Where batch `b`'s insert of `rows` would stop: `None` if it finishes, else why it waits
    /// and the ids it has left.
    pub(crate) fn would_wait(&self, b: usize, rows: &[Row]) -> Option<(Wait, Vec<usize>)> {
        if self.postgres && !self.batches[b].ring_lock && self.maintenance.is_some() {
            return Some((Wait::Ring, rows.iter().map(|r| r.key).collect()));
        }
        let mut trial = self.clone();
        trial.batches[b].ring_lock = true;
        trial.batches[b].insert = Some(Insert {
            rows: rows.to_vec(),
            ..Insert::default()
        });
        trial.run_insert(b);
        let batch = &trial.batches[b];
        let insert = batch.insert.as_ref()?;
        let left = insert.rows[insert.next..].iter().map(|r| r.key).collect();
        Some((batch.waiting?, left))
    }

    /// The ids a waiting batch has left to insert.
    pub(crate) fn remaining(&self, b: usize) -> Vec<usize> {
        match &self.batches[b].insert {
            Some(insert) => insert.rows[insert.next..].iter().map(|r| r.key).collect(),
            None => Vec::new(),
        }
    }
}
