//! The checker: reads the history and the effect table after the drain and judges them against
//! the promise, in the manner of Jepsen's queue checkers (attempted, acknowledged, observed):
//!
//! * **lost**: a key some post of which was answered 2xx, never delivered to the sink;
//! * **missing_effect**: such a key with no effect row;
//! * **doubled**: a key with two effect rows inserted less than the dedup window apart (an id is
//!   kept at least the window, so that is a second handling the promise forbids); rows further
//!   apart are **reaccepted_after_window**, allowed, and reported apart;
//! * **unexpected**: a sink delivery or an effect row for a key no post carried;
//! * **rejected**: a 4xx to a valid, signed post;
//! * sink redeliveries: every delivery of a key after its first is a redelivery, counted under
//!   **sink_redeliveries_same_key** when its `Idempotency-Key` is the first delivery's, else
//!   under **sink_redeliveries_other_key** (must be 0); **sink_wrong_key** counts deliveries
//!   whose `Idempotency-Key` is not the event's key at all (must be 0).
//!
//! Posts answered only 5xx or not at all are indeterminate (Jepsen's `info`): they may have
//! been enqueued, so their keys may reach the sink (**recovered**) without being lost if not.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::{Outcome, Record};

/// One row of `soak_effects`, as the driver dumps it (`effects.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EffectRow {
    pub event_id: String,
    pub payload_id: String,
    pub process: String,
    pub backend_pid: i32,
    pub delivery_attempt: i32,
    /// `inserted_at` in Unix microseconds (the database's clock).
    pub inserted_at_us: i64,
}

/// What the checker found; every list is of event keys, sorted.
#[derive(Debug, Default, Serialize)]
pub struct Findings {
    pub events_attempted: usize,
    pub events_accepted: usize,
    pub posts: usize,
    pub sink_deliveries: usize,
    pub effect_rows: usize,
    pub lost: Vec<String>,
    pub missing_effect: Vec<String>,
    pub doubled: Vec<String>,
    pub reaccepted_after_window: Vec<String>,
    pub unexpected: Vec<String>,
    pub rejected: Vec<String>,
    pub recovered: usize,
    pub sink_redeliveries_same_key: usize,
    pub sink_redeliveries_other_key: usize,
    pub sink_wrong_key: usize,
}

impl Findings {
    /// No violation of the promise in the history and the effect table.
    pub fn holds(&self) -> bool {
        self.lost.is_empty()
            && self.missing_effect.is_empty()
            && self.doubled.is_empty()
            && self.unexpected.is_empty()
            && self.rejected.is_empty()
            && self.sink_redeliveries_other_key == 0
            && self.sink_wrong_key == 0
    }

    /// The keys behind each violation, for printing their history.
    pub fn violating_keys(&self) -> Vec<(&'static str, &String)> {
        let lists: [(&'static str, &Vec<String>); 5] = [
            ("lost", &self.lost),
            ("missing_effect", &self.missing_effect),
            ("doubled", &self.doubled),
            ("unexpected", &self.unexpected),
            ("rejected", &self.rejected),
        ];
        lists
            .into_iter()
            .flat_map(|(what, keys)| keys.iter().map(move |k| (what, k)))
            .collect()
    }
}

pub fn check(records: &[Record], effects: &[EffectRow], window_secs: u64) -> Findings {
    let mut found = Findings::default();
    let mut attempted = HashSet::new();
    let mut accepted = HashSet::new();
    let mut rejected = HashSet::new();
    // Per key, the Idempotency-Key of each delivery in order of arrival.
    let mut deliveries: HashMap<&str, Vec<Option<&str>>> = HashMap::new();
    for record in records {
        match record {
            Record::Invoke { key, .. } => {
                found.posts += 1;
                attempted.insert(key.as_str());
            }
            Record::Complete {
                key,
                outcome,
                status,
                ..
            } => match (outcome, status) {
                (Outcome::Ok, _) => {
                    accepted.insert(key.as_str());
                }
                (Outcome::Fail, Some(_)) => {
                    rejected.insert(key.clone());
                }
                _ => {}
            },
            Record::Sink {
                key,
                idempotency_key,
                ..
            } => {
                found.sink_deliveries += 1;
                if idempotency_key.as_deref() != Some(key.as_str()) {
                    found.sink_wrong_key += 1;
                }
                deliveries
                    .entry(key.as_str())
                    .or_default()
                    .push(idempotency_key.as_deref());
            }
            Record::Fault { .. } | Record::Phase { .. } => {}
        }
    }
    for (key, keys) in &deliveries {
        if !attempted.contains(key) {
            found.unexpected.push((*key).to_owned());
        } else if !accepted.contains(key) {
            found.recovered += 1;
        }
        let first = keys[0];
        for later in &keys[1..] {
            if *later == first {
                found.sink_redeliveries_same_key += 1;
            } else {
                found.sink_redeliveries_other_key += 1;
            }
        }
    }

    let mut rows: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in effects {
        rows.entry(row.event_id.as_str())
            .or_default()
            .push(row.inserted_at_us);
    }
    found.effect_rows = effects.len();
    let window_us = i64::try_from(window_secs).unwrap_or(i64::MAX / 1_000_000) * 1_000_000;
    for (key, times) in &mut rows {
        if !attempted.contains(key) {
            found.unexpected.push((*key).to_owned());
        }
        times.sort_unstable();
        let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        if gaps.iter().any(|gap| *gap < window_us) {
            found.doubled.push((*key).to_owned());
        } else if !gaps.is_empty() {
            found.reaccepted_after_window.push((*key).to_owned());
        }
    }
    for key in &accepted {
        if !deliveries.contains_key(key) {
            found.lost.push((*key).to_owned());
        }
        if !rows.contains_key(key) {
            found.missing_effect.push((*key).to_owned());
        }
    }
    found.events_attempted = attempted.len();
    found.events_accepted = accepted.len();
    found.rejected = rejected.into_iter().collect();
    for list in [
        &mut found.lost,
        &mut found.missing_effect,
        &mut found.unexpected,
        &mut found.rejected,
    ] {
        list.sort();
        list.dedup();
    }
    found
}

/// The history lines and effect rows of `key`, for a failure report.
pub fn key_history(key: &str, records: &[Record], effects: &[EffectRow]) -> Vec<String> {
    let mut lines: Vec<String> = records
        .iter()
        .filter(|r| r.key() == Some(key))
        .map(|r| serde_json::to_string(r).unwrap_or_default())
        .collect();
    lines.extend(
        effects
            .iter()
            .filter(|e| e.event_id == key)
            .map(|e| format!("effect {}", serde_json::to_string(e).unwrap_or_default())),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Shape;

    fn invoke(key: &str) -> Record {
        Record::Invoke {
            t: 0,
            key: key.into(),
            post: 0,
            copy: 0,
            shape: Shape::Snapshot,
            ingress: 0,
            attempt: 1,
        }
    }

    fn complete(key: &str, outcome: Outcome, status: Option<u16>) -> Record {
        Record::Complete {
            t: 1,
            key: key.into(),
            post: 0,
            attempt: 1,
            outcome,
            status,
            error: None,
        }
    }

    fn sink(key: &str, idempotency_key: &str) -> Record {
        Record::Sink {
            t: 2,
            key: key.into(),
            idempotency_key: Some(idempotency_key.into()),
            payload_id: key.into(),
        }
    }

    fn effect(key: &str, at_secs: i64) -> EffectRow {
        EffectRow {
            event_id: key.into(),
            payload_id: key.into(),
            process: "p".into(),
            backend_pid: 1,
            delivery_attempt: 1,
            inserted_at_us: at_secs * 1_000_000,
        }
    }

    #[test]
    fn a_clean_history_holds() {
        let records = [
            invoke("a"),
            complete("a", Outcome::Ok, Some(200)),
            sink("a", "a"),
            sink("a", "a"),
        ];
        let found = check(&records, &[effect("a", 0)], 60);
        assert!(found.holds(), "{found:?}");
        assert_eq!(found.sink_redeliveries_same_key, 1);
        assert_eq!(found.events_accepted, 1);
    }

    #[test]
    fn every_violation_is_named() {
        let records = [
            invoke("lost"),
            complete("lost", Outcome::Ok, Some(200)),
            invoke("twice"),
            complete("twice", Outcome::Ok, Some(200)),
            sink("twice", "twice"),
            sink("twice", "other"),
            invoke("late"),
            complete("late", Outcome::Ok, Some(200)),
            sink("late", "late"),
            invoke("maybe"),
            complete("maybe", Outcome::Info, Some(503)),
            sink("maybe", "maybe"),
            invoke("bad"),
            complete("bad", Outcome::Fail, Some(400)),
            sink("ghost", "ghost"),
        ];
        let effects = [
            effect("lost", 0),
            effect("twice", 0),
            effect("twice", 59),
            effect("late", 0),
            effect("late", 61),
            effect("maybe", 0),
        ];
        let found = check(&records, &effects, 60);
        assert!(!found.holds());
        assert_eq!(found.lost, ["lost"]);
        assert_eq!(found.doubled, ["twice"]);
        assert_eq!(found.reaccepted_after_window, ["late"]);
        assert_eq!(found.unexpected, ["ghost"]);
        assert_eq!(found.rejected, ["bad"]);
        assert_eq!(found.recovered, 1);
        assert_eq!(found.sink_redeliveries_other_key, 1);
        assert_eq!(found.sink_wrong_key, 1);
        assert!(found.missing_effect.is_empty());
    }
}
