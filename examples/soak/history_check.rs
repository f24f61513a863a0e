//! The history check (issue 40): what the console shows of the past is written in the same
//! transaction or statement as what it records, so under the soak's faults (kills, pauses,
//! PostgreSQL crashes, cut connections, marks retried after an outage) it must still add up
//! exactly:
//!
//! * **bodies**: each handling that committed kept its event's body once: the bodies of an
//!   event id are as many as its effect rows (a handling reaccepted after the window keeps a
//!   second), and the bodies in all are the `handled` plus `stale` counts (a stale event keeps
//!   its body and has no effect row);
//! * **counts**: the per-minute `handled` count adds up to the effect rows, and each delivery
//!   series (`delivered`, `delivery_failed`, `gave_up`, `throttled`) to the attempts of its kind
//!   (`delivery_failed`: `failed` and a circuit's `probe_failed`; the relay's mark writes both
//!   in one statement);
//! * **attempts once**: no outbox row has two `delivered` attempts under one attempt number (a
//!   mark retried after an outage whose commit went through records nothing again; a delivery
//!   whose lease was lost is another claim, another number), and every dispatched row has a
//!   `delivered` attempt.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use dedup_worker_core::store::{Store, SCHEMA};
use serde::{Deserialize, Serialize};

use crate::checker::EffectRow;
use crate::drain::bounded;

/// The history tables as the run left them (`history_tables.json`).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct HistoryTables {
    /// Kept bodies per event id.
    pub bodies_by_event: BTreeMap<String, i64>,
    /// `activity_minutes` summed per series over the run.
    pub counts: BTreeMap<String, i64>,
    /// `outbox_attempts` per kind.
    pub attempts_by_kind: BTreeMap<String, i64>,
    /// `(outbox id, attempt)` with more than one `delivered` attempt.
    pub delivered_twice: Vec<(i64, i32)>,
    /// Dispatched outbox rows with no `delivered` attempt.
    pub dispatched_unrecorded: Vec<i64>,
}

/// Reads the history tables (after the processes stopped).
pub async fn read(store: &Store) -> anyhow::Result<HistoryTables> {
    let pool = store.postgres_pool().context("a PostgreSQL store")?;
    let bodies: Vec<(String, i64)> = bounded(
        "reading event_bodies",
        sqlx::query_as(&format!(
            "SELECT event_id, count(*) FROM {SCHEMA}.event_bodies GROUP BY event_id"
        ))
        .fetch_all(pool),
    )
    .await?;
    let counts: Vec<(String, i64)> = bounded(
        "reading activity_minutes",
        sqlx::query_as(&format!(
            "SELECT series, sum(n)::int8 FROM {SCHEMA}.activity_minutes GROUP BY series"
        ))
        .fetch_all(pool),
    )
    .await?;
    let attempts: Vec<(String, i64)> = bounded(
        "reading outbox_attempts",
        sqlx::query_as(&format!(
            "SELECT kind, count(*) FROM {SCHEMA}.outbox_attempts GROUP BY kind"
        ))
        .fetch_all(pool),
    )
    .await?;
    let delivered_twice: Vec<(i64, i32)> = bounded(
        "reading outbox_attempts twice",
        sqlx::query_as(&format!(
            "SELECT outbox_id, attempt FROM {SCHEMA}.outbox_attempts WHERE kind = 'delivered' \
             GROUP BY outbox_id, attempt HAVING count(*) > 1 ORDER BY 1, 2"
        ))
        .fetch_all(pool),
    )
    .await?;
    let dispatched_unrecorded: Vec<i64> = bounded(
        "reading unrecorded deliveries",
        sqlx::query_scalar(&format!(
            "SELECT o.id FROM {SCHEMA}.outbox o WHERE o.status = 'dispatched' AND NOT EXISTS \
             (SELECT 1 FROM {SCHEMA}.outbox_attempts a \
              WHERE a.outbox_id = o.id AND a.kind = 'delivered') ORDER BY 1"
        ))
        .fetch_all(pool),
    )
    .await?;
    Ok(HistoryTables {
        bodies_by_event: bodies.into_iter().collect(),
        counts: counts.into_iter().collect(),
        attempts_by_kind: attempts.into_iter().collect(),
        delivered_twice,
        dispatched_unrecorded,
    })
}

/// What the history check found.
#[derive(Debug, Default, Serialize)]
pub struct HistoryFindings {
    pub bodies: i64,
    /// Event ids whose bodies are fewer than their effect rows (a handling without its body).
    pub bodies_missing: Vec<String>,
    /// Event ids with more bodies than effect rows, beyond what the stale count explains.
    pub bodies_extra: Vec<String>,
    /// Bodies in all against `handled` + `stale`; empty when equal.
    pub bodies_against_counts: Option<String>,
    /// Series whose sum is not what it counts: `series: counted N, rows M`.
    pub counts_mismatched: Vec<String>,
    pub delivered_twice: usize,
    pub dispatched_unrecorded: usize,
}

impl HistoryFindings {
    /// Why the history does not add up, one reason a line.
    pub fn reasons(&self) -> Vec<String> {
        let mut why = Vec::new();
        let mut count = |what: &str, n: usize| {
            if n > 0 {
                why.push(format!("{what}: {n}"));
            }
        };
        count("history_bodies_missing", self.bodies_missing.len());
        count("history_bodies_extra", self.bodies_extra.len());
        count("history_counts_mismatched", self.counts_mismatched.len());
        count("history_delivered_twice", self.delivered_twice);
        count("history_dispatched_unrecorded", self.dispatched_unrecorded);
        if let Some(what) = &self.bodies_against_counts {
            why.push(format!("history_bodies_against_counts: {what}"));
        }
        why
    }
}

/// Judges the history tables against the effect rows.
pub fn check(tables: &HistoryTables, effects: &[EffectRow]) -> HistoryFindings {
    let mut effects_by_event: HashMap<&str, i64> = HashMap::new();
    for effect in effects {
        *effects_by_event
            .entry(effect.event_id.as_str())
            .or_default() += 1;
    }
    let count = |series: &str| tables.counts.get(series).copied().unwrap_or(0);
    let attempts = |kind: &str| tables.attempts_by_kind.get(kind).copied().unwrap_or(0);
    let mut found = HistoryFindings {
        bodies: tables.bodies_by_event.values().sum(),
        delivered_twice: tables.delivered_twice.len(),
        dispatched_unrecorded: tables.dispatched_unrecorded.len(),
        ..HistoryFindings::default()
    };
    for (event_id, &handled) in &effects_by_event {
        let kept = tables.bodies_by_event.get(*event_id).copied().unwrap_or(0);
        if kept < handled {
            found.bodies_missing.push((*event_id).to_owned());
        }
    }
    // Bodies beyond the effect rows are stale events' (no handler ran), at most `stale` of them.
    let mut beyond = 0;
    for (event_id, &kept) in &tables.bodies_by_event {
        let handled = effects_by_event
            .get(event_id.as_str())
            .copied()
            .unwrap_or(0);
        if kept > handled {
            beyond += kept - handled;
            if beyond > count("stale") {
                found.bodies_extra.push(event_id.clone());
            }
        }
    }
    found.bodies_missing.sort();
    let counted = count("handled") + count("stale");
    if found.bodies != counted {
        found.bodies_against_counts = Some(format!(
            "{} bodies, handled + stale counted {counted}",
            found.bodies
        ));
    }
    let mut mismatch = |series: &str, counted: i64, rows: i64| {
        if counted != rows {
            found
                .counts_mismatched
                .push(format!("{series}: counted {counted}, rows {rows}"));
        }
    };
    mismatch("handled", count("handled"), effects.len() as i64);
    mismatch("delivered", count("delivered"), attempts("delivered"));
    // A circuit's failed probe is counted as a failed delivery (`probe_failed` attempts).
    mismatch(
        "delivery_failed",
        count("delivery_failed"),
        attempts("failed") + attempts("probe_failed"),
    );
    mismatch("gave_up", count("gave_up"), attempts("gave_up"));
    mismatch("throttled", count("throttled"), attempts("throttled"));
    found
}

#[cfg(test)]
#[path = "history_check_tests.rs"]
mod tests;
