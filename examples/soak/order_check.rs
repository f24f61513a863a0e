//! The order check (issue 39, ordering by key): every forwarded event also goes, by a route, to
//! the ordered sink (`outbox.sinks.ordered`, `ordered = true`, keyed by the event's customer),
//! whose deliveries the history records as they arrive with the answer each got
//! ([`Record::OrderedSink`]). The commit order is the lane's rows in the outbox in id order
//! (on PostgreSQL the consumer's advisory lock per key makes id order commit order per key),
//! read after the drain ([`LaneRow`], `ordered_outbox.jsonl`). Matched by `Idempotency-Key`,
//! each delivery of a keyed row is judged against the rows of its key:
//!
//! * **overtook**: it arrived (whatever its answer) while an earlier row of its key had not yet
//!   been answered 2xx at the receiver;
//! * **after_later**: it arrived after a later row of its key had arrived (a late repeat).
//!
//! Either is an **order violation**. Retries of a key's head (answered 500, or whose 2xx was
//! lost on the way back) are fine, and so are keys interleaving. Besides, the ordered sink must
//! receive every accepted event too (**ordered_missing**: never answered 2xx there), and
//! receive nothing its lane does not hold (**ordered_unexpected**). A row without an ordering
//! key (a thin event, a foreign message) is delivered unordered and only counted.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::Record;

/// One row of the ordered sink's lane, as the driver dumps it after the drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaneRow {
    pub id: i64,
    pub ordering_key: Option<String>,
    pub idempotency_key: String,
    pub status: String,
}

/// One delivery out of its key's commit order.
#[derive(Debug, Clone, Serialize)]
pub struct OrderViolation {
    /// `overtook` or `after_later` (see the module docs).
    pub kind: &'static str,
    pub ordering_key: String,
    /// The delivery's `Idempotency-Key`, its row's place in its key (0: committed first) and
    /// when it arrived.
    pub idempotency_key: String,
    pub place: usize,
    pub t: u64,
    /// The row it is out of order with: the earliest of its key not accepted yet (`overtook`),
    /// or the latest arrived (`after_later`).
    pub other: String,
    pub other_place: usize,
}

/// What the order check found.
#[derive(Debug, Default, Serialize)]
pub struct OrderFindings {
    /// Rows of the ordered lane, and of them without an ordering key.
    pub ordered_rows: usize,
    pub ordered_rows_unkeyed: usize,
    /// Deliveries at the ordered sink; of them, of keyed rows (judged), of unkeyed rows, and
    /// answered other than 2xx.
    pub ordered_deliveries: usize,
    pub ordered_deliveries_checked: usize,
    pub ordered_deliveries_unkeyed: usize,
    pub ordered_deliveries_failed: usize,
    /// Judged deliveries of a row that had arrived before (retries of a head).
    pub ordered_redeliveries: usize,
    /// Ordering keys with a judged delivery, and of them those with two rows or more arrived.
    pub ordered_keys_checked: usize,
    pub ordered_keys_with_several: usize,
    /// `Idempotency-Key`s on more than one row of the lane (a doubled handling, which the main
    /// checker reports; the first row's place is used).
    pub ordered_duplicate_rows: usize,
    pub order_violations: Vec<OrderViolation>,
    /// Accepted events never answered 2xx at the ordered sink (sorted).
    pub ordered_missing: Vec<String>,
    /// Deliveries whose `Idempotency-Key` is no row of the lane.
    pub ordered_unexpected: Vec<String>,
}

impl OrderFindings {
    /// Why the run fails on the ordered sink, one reason a line. `accepted`: the events the
    /// run accepted (a run that accepted some and judged no key over two rows checked nothing).
    pub fn reasons(&self, accepted: usize) -> Vec<String> {
        let mut why = Vec::new();
        for (what, n) in [
            ("order_violations", self.order_violations.len()),
            ("ordered_missing", self.ordered_missing.len()),
            ("ordered_unexpected", self.ordered_unexpected.len()),
        ] {
            if n > 0 {
                why.push(format!("{what}: {n}"));
            }
        }
        if accepted > 0 && self.ordered_keys_with_several == 0 {
            why.push("the order check judged no key with two rows delivered".to_owned());
        }
        why
    }

    /// No violation (the counts of [`OrderFindings::reasons`] all 0).
    pub fn holds(&self) -> bool {
        self.order_violations.is_empty()
            && self.ordered_missing.is_empty()
            && self.ordered_unexpected.is_empty()
    }
}

/// One ordering key's rows in commit order, and what has arrived of them so far.
#[derive(Default)]
struct KeyState<'a> {
    rows: Vec<&'a str>,
    accepted: Vec<bool>,
    arrived: Vec<bool>,
    /// The earliest row not answered 2xx yet (`rows.len()` when all were).
    first_unaccepted: usize,
    latest_arrived: Option<usize>,
}

/// Judges the ordered sink's deliveries in `records` against the lane's rows (`lane`, any
/// order) and the events the main checker counts as accepted.
pub fn check(records: &[Record], lane: &[LaneRow], accepted: &[String]) -> OrderFindings {
    let mut found = OrderFindings::default();
    let mut lane: Vec<&LaneRow> = lane.iter().collect();
    lane.sort_by_key(|row| row.id);
    let mut place: HashMap<&str, (&str, usize)> = HashMap::new();
    let mut unkeyed: HashSet<&str> = HashSet::new();
    let mut keys: HashMap<&str, KeyState> = HashMap::new();
    found.ordered_rows = lane.len();
    for row in lane {
        let idempotency_key = row.idempotency_key.as_str();
        let Some(key) = row.ordering_key.as_deref() else {
            found.ordered_rows_unkeyed += 1;
            unkeyed.insert(idempotency_key);
            continue;
        };
        if place.contains_key(idempotency_key) {
            found.ordered_duplicate_rows += 1;
            continue;
        }
        let state = keys.entry(key).or_default();
        place.insert(idempotency_key, (key, state.rows.len()));
        state.rows.push(idempotency_key);
        state.accepted.push(false);
        state.arrived.push(false);
    }
    let mut delivered: HashSet<&str> = HashSet::new();
    for record in records {
        let Record::OrderedSink {
            t,
            key: change,
            idempotency_key,
            status,
            ..
        } = record
        else {
            continue;
        };
        found.ordered_deliveries += 1;
        let ok = (200..300).contains(status);
        if ok {
            delivered.insert(change.as_str());
        } else {
            found.ordered_deliveries_failed += 1;
        }
        let idempotency_key = idempotency_key.as_deref().unwrap_or_default();
        let Some(&(key, p)) = place.get(idempotency_key) else {
            if unkeyed.contains(idempotency_key) {
                found.ordered_deliveries_unkeyed += 1;
            } else {
                found.ordered_unexpected.push(idempotency_key.to_owned());
            }
            continue;
        };
        found.ordered_deliveries_checked += 1;
        let state = keys
            .get_mut(key)
            .expect("every placed row's key has a state");
        let violation = |kind, other: usize| OrderViolation {
            kind,
            ordering_key: key.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
            place: p,
            t: *t,
            other: state.rows[other].to_owned(),
            other_place: other,
        };
        if p > state.first_unaccepted {
            found
                .order_violations
                .push(violation("overtook", state.first_unaccepted));
        }
        if let Some(latest) = state.latest_arrived.filter(|latest| *latest > p) {
            found
                .order_violations
                .push(violation("after_later", latest));
        }
        state.latest_arrived = state.latest_arrived.max(Some(p));
        if std::mem::replace(&mut state.arrived[p], true) {
            found.ordered_redeliveries += 1;
        }
        if ok {
            state.accepted[p] = true;
            while state.accepted.get(state.first_unaccepted) == Some(&true) {
                state.first_unaccepted += 1;
            }
        }
    }
    for state in keys.values() {
        let arrived = state.arrived.iter().filter(|a| **a).count();
        if arrived > 0 {
            found.ordered_keys_checked += 1;
        }
        if arrived > 1 {
            found.ordered_keys_with_several += 1;
        }
    }
    found.ordered_missing = accepted
        .iter()
        .filter(|key| !delivered.contains(key.as_str()))
        .cloned()
        .collect();
    found.ordered_missing.sort();
    found.ordered_unexpected.sort();
    found.ordered_unexpected.dedup();
    found
}

/// The ordered sink's deliveries of one ordering key, for a failure report.
pub fn key_history(ordering_key: &str, records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter(
            |r| matches!(r, Record::OrderedSink { ordering_key: Some(k), .. } if k == ordering_key),
        )
        .map(|r| serde_json::to_string(r).unwrap_or_default())
        .collect()
}

#[cfg(test)]
#[path = "order_check_tests.rs"]
mod tests;
