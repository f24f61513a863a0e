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
//! The direct producer's messages ([`Record::Publish`]) are judged the same way: a confirmed
//! publish is acknowledged. A message the consumer keys by another id than the change's (a thin
//! event under its own id) is counted under the change's key: that id is an alias, in the
//! effect table and in the sink's `Idempotency-Key`. Keys sent on two channels at once and
//! doubled are also listed as **doubled_two_channels** (issue 36, item 1). A foreign message
//! with no id is no event: the promise is a dead letter, at least once; such a message not
//! dead-lettered is **dead_letter_missing**, and any other dead letter
//! **dead_letter_unexpected**.
//!
//! Posts answered only 5xx or not at all are indeterminate (Jepsen's `info`): they may have
//! been enqueued, so their keys may reach the sink (**recovered**) without being lost if not.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::api_check::ApiFindings;
use crate::history::{Outcome, Record};
use crate::plan::Shape;
use crate::workload::DirectKind;

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

/// One dead letter, as the driver dumps it (`dead_letters.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetterRow {
    pub event_id: String,
    /// The `soak_key` of its payload, if it is one of the foreign producer's messages.
    pub soak_key: Option<String>,
    pub error: String,
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
    /// Of `doubled`, the changes sent on two channels at once.
    pub doubled_two_channels: Vec<String>,
    /// Those by their second channel (`two_channels_eventbridge`, `…_thin_own_id` (with the
    /// queue), `…_thin_webhook`).
    pub doubled_two_channels_by_kind: BTreeMap<String, usize>,
    /// Changes sent on two channels at once (attempted).
    pub two_channel_changes: usize,
    /// Foreign messages with no id that were dead-lettered (distinct), as promised.
    pub dead_lettered_as_promised: usize,
    pub dead_letter_missing: Vec<String>,
    /// Dead letters of anything else (their event ids).
    pub dead_letter_unexpected: Vec<String>,
    pub reaccepted_after_window: Vec<String>,
    pub unexpected: Vec<String>,
    pub rejected: Vec<String>,
    pub recovered: usize,
    pub sink_redeliveries_same_key: usize,
    pub sink_redeliveries_other_key: usize,
    pub sink_wrong_key: usize,
    /// The keys accepted (sorted), for the order check's `ordered_missing`.
    #[serde(skip)]
    pub accepted: Vec<String>,
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
            && self.dead_letter_missing.is_empty()
            && self.dead_letter_unexpected.is_empty()
    }

    /// The keys behind each violation, for printing their history.
    pub fn violating_keys(&self) -> Vec<(&'static str, &String)> {
        let lists: [(&'static str, &Vec<String>); 6] = [
            ("lost", &self.lost),
            ("missing_effect", &self.missing_effect),
            ("doubled", &self.doubled),
            ("unexpected", &self.unexpected),
            ("rejected", &self.rejected),
            ("dead_letter_missing", &self.dead_letter_missing),
        ];
        lists
            .into_iter()
            .flat_map(|(what, keys)| keys.iter().map(move |k| (what, k)))
            .collect()
    }
}

pub fn check(
    records: &[Record],
    effects: &[EffectRow],
    dead_letters: &[DeadLetterRow],
    window_secs: u64,
) -> Findings {
    let mut found = Findings::default();
    let mut attempted = HashSet::new();
    let mut accepted = HashSet::new();
    let mut rejected = HashSet::new();
    // Another id the consumer may key a change's message by → the change's key.
    let mut aliases: HashMap<&str, &str> = HashMap::new();
    // Each change sent on two channels at once → its second channel.
    let mut two_channels: HashMap<&str, String> = HashMap::new();
    // Foreign messages with no id, sent (each attempt may have landed) and confirmed.
    let (mut no_id_sent, mut no_id_confirmed) = (HashSet::new(), HashSet::new());
    for record in records {
        match record {
            Record::Invoke {
                key,
                at_once,
                shape,
                ..
            } if *at_once => {
                if *shape == Shape::Thin {
                    two_channels.insert(key, "two_channels_thin_webhook".to_owned());
                } else {
                    two_channels.entry(key).or_default();
                }
            }
            Record::Publish {
                key,
                kind,
                lane,
                outcome,
                keyed_as,
                ..
            } => {
                if let Some(alias) = keyed_as {
                    aliases.insert(alias.as_str(), key.as_str());
                }
                if kind == DirectKind::ForeignNoId.name() {
                    no_id_sent.insert(key.as_str());
                    if *outcome == Outcome::Ok {
                        no_id_confirmed.insert(key.as_str());
                    }
                    continue;
                }
                if kind.starts_with("two_channels") {
                    let lane = serde_json::to_value(lane).unwrap_or_default();
                    let channel = format!("{kind}/{}", lane.as_str().unwrap_or_default());
                    two_channels.insert(key, channel);
                }
            }
            _ => {}
        }
    }
    let change_of = |id: &'_ str| -> String { aliases.get(id).copied().unwrap_or(id).to_owned() };
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
            Record::Publish {
                key, kind, outcome, ..
            } if kind != DirectKind::ForeignNoId.name() => {
                found.posts += 1;
                attempted.insert(key.as_str());
                if *outcome == Outcome::Ok {
                    accepted.insert(key.as_str());
                }
            }
            Record::Sink {
                key,
                idempotency_key,
                ..
            } => {
                found.sink_deliveries += 1;
                let keyed = idempotency_key.as_deref().map(change_of);
                if keyed.as_deref() != Some(key.as_str()) {
                    found.sink_wrong_key += 1;
                }
                deliveries
                    .entry(key.as_str())
                    .or_default()
                    .push(idempotency_key.as_deref());
            }
            Record::Publish { .. }
            | Record::OrderedSink { .. }
            | Record::Fault { .. }
            | Record::Phase { .. }
            | Record::Api { .. } => {}
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

    let mut rows: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for row in effects {
        rows.entry(change_of(&row.event_id))
            .or_default()
            .push(row.inserted_at_us);
    }
    found.effect_rows = effects.len();
    let window_us = i64::try_from(window_secs).unwrap_or(i64::MAX / 1_000_000) * 1_000_000;
    for (key, times) in &mut rows {
        if !attempted.contains(key.as_str()) {
            found.unexpected.push(key.clone());
        }
        times.sort_unstable();
        let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        if gaps.iter().any(|gap| *gap < window_us) {
            found.doubled.push(key.clone());
            if let Some(channel) = two_channels.get(key.as_str()) {
                found.doubled_two_channels.push(key.clone());
                *found
                    .doubled_two_channels_by_kind
                    .entry(channel.clone())
                    .or_default() += 1;
            }
        } else if !gaps.is_empty() {
            found.reaccepted_after_window.push(key.clone());
        }
    }
    found.two_channel_changes = two_channels.len();
    let mut dead_lettered = HashSet::new();
    for dead in dead_letters {
        match &dead.soak_key {
            Some(key) if no_id_sent.contains(key.as_str()) => {
                dead_lettered.insert(key.as_str());
            }
            _ => found.dead_letter_unexpected.push(dead.event_id.clone()),
        }
    }
    found.dead_lettered_as_promised = dead_lettered.len();
    found.dead_letter_missing = no_id_confirmed
        .difference(&dead_lettered)
        .map(|k| (*k).to_owned())
        .collect();
    for key in &accepted {
        if !deliveries.contains_key(key) {
            found.lost.push((*key).to_owned());
        }
        if !rows.contains_key(*key) {
            found.missing_effect.push((*key).to_owned());
        }
    }
    found.events_attempted = attempted.len();
    found.events_accepted = accepted.len();
    found.accepted = accepted.iter().map(|k| (*k).to_owned()).collect();
    found.accepted.sort();
    found.rejected = rejected.into_iter().collect();
    for list in [
        &mut found.lost,
        &mut found.missing_effect,
        &mut found.unexpected,
        &mut found.rejected,
        &mut found.dead_letter_missing,
        &mut found.dead_letter_unexpected,
    ] {
        list.sort();
        list.dedup();
    }
    found
}

/// What the run's end state says beside the history: the drain, and what the store and the
/// processes left.
#[derive(Debug, Clone, Copy, Default)]
pub struct EndState {
    /// Every accepted event reached the sink and every queue and the outbox were empty.
    pub drained: bool,
    pub outbox_failed: usize,
    pub crashes: usize,
}

/// The least share of the events sent that must be accepted: below it the run says nothing
/// about the pipeline (a history of 503s holds vacuously), so it fails.
pub const MIN_ACCEPTED_SHARE: f64 = 0.90;

/// Why the run fails, one reason a line; empty when it holds.
pub fn verdict(found: &Findings, api: &ApiFindings, end: EndState) -> Vec<String> {
    let mut why = Vec::new();
    let mut count = |what: &str, n: usize| {
        if n > 0 {
            why.push(format!("{what}: {n}"));
        }
    };
    count("lost", found.lost.len());
    count("missing_effect", found.missing_effect.len());
    count("doubled", found.doubled.len());
    count("doubled_two_channels", found.doubled_two_channels.len());
    count("unexpected", found.unexpected.len());
    count("rejected", found.rejected.len());
    count(
        "sink_redeliveries_other_key",
        found.sink_redeliveries_other_key,
    );
    count("sink_wrong_key", found.sink_wrong_key);
    count("dead_letter_unexpected", found.dead_letter_unexpected.len());
    count("dead_letter_missing", found.dead_letter_missing.len());
    for (what, scopes) in api.violations() {
        count(what, scopes.len());
    }
    count("outbox_failed", end.outbox_failed);
    count("crashes", end.crashes);
    let sent = found.events_attempted;
    let accepted = found.events_accepted;
    if sent == 0 || (accepted as f64) < MIN_ACCEPTED_SHARE * sent as f64 {
        why.push(format!(
            "accepted {accepted} of {sent} events sent, fewer than {:.0} %",
            MIN_ACCEPTED_SHARE * 100.0
        ));
    }
    // The API's calls are held to the same share (a run with no API calls has none to judge).
    if api.calls > 0 && (api.answered as f64) < MIN_ACCEPTED_SHARE * api.calls as f64 {
        why.push(format!(
            "answered {} of {} API calls, fewer than {:.0} %",
            api.answered,
            api.calls,
            MIN_ACCEPTED_SHARE * 100.0
        ));
    }
    if !end.drained {
        why.push("the drain did not finish".to_owned());
    }
    why
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
            .filter(|e| e.event_id == key || e.event_id.strip_suffix("_thin") == Some(key))
            .map(|e| format!("effect {}", serde_json::to_string(e).unwrap_or_default())),
    );
    lines
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
