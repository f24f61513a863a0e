//! The API checker (issue 36): the Idempotency-Key layer's promise, judged on the history's
//! [`Record::Api`] attempts and the effect table `soak_api_effects` (one row per handler
//! execution that committed; no unique key). Per operation, a `(tenant, key)` scope:
//!
//! * **doubled**: two effect rows (the handler's writes committed twice);
//! * **missing_effect**: answered 2xx, and no effect row (a 2xx for something not stored);
//! * **effect_mismatch**: the 2xx names another row than the one committed, or another
//!   tenant's or amount's (one scope answered with another's result);
//! * **replay_differs**: two 2xx answers that are not byte-identical (a second execution
//!   answered, or a replay that is not the stored response);
//! * **session_leaks**: an execution that found `app.tenant` set when it began (in its answer,
//!   2xx or not, or in its row): another request's session state on its connection;
//! * **rejected**: a 4xx that is not worth retrying (400, 422, …): the client sent the same
//!   valid request every time;
//! * **unexpected**: an effect row of a scope no call used.
//!
//! Scopes never answered 2xx are counted (`unanswered`); the verdict wants 90 % answered, as it
//! wants of the events.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::Record;

/// One row of `soak_api_effects`, as the driver dumps it (`api_effects.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiEffectRow {
    pub id: i64,
    pub tenant: String,
    pub idem_key: String,
    pub amount: i64,
    pub seen_tenant: String,
    pub process: String,
    pub backend_pid: i32,
}

/// What the API checker found; lists are of scopes, `tenant/key`, sorted.
#[derive(Debug, Default, Serialize)]
pub struct ApiFindings {
    /// Scopes (operations) sent.
    pub calls: usize,
    /// Of them, answered 2xx at least once.
    pub answered: usize,
    pub attempts: usize,
    /// 2xx answers marked `Idempotent-Replayed: true`.
    pub replays: usize,
    /// 409: the key was being worked on (a retry raced a running request, or a dead one's lease).
    pub conflicts: usize,
    pub server_errors: usize,
    /// Of them, the handler's own drawn 500s (its writes rolled back, the key released).
    pub handler_failures: usize,
    /// Of them, 500s of the layer's own: a transaction it would not commit (a handler's
    /// transaction left open on it, at depth 2).
    pub commits_refused: usize,
    /// Timeouts, refused or lost connections, bodies cut off.
    pub no_answer: usize,
    /// Scopes that share their key with another tenant's.
    pub keys_shared_across_tenants: usize,
    /// Executions that ran on a backend whose previous execution (in the same process start)
    /// was another tenant's: the kept or pooled connection's reset was needed, and held.
    pub connection_reused_across_tenants: usize,
    pub effect_rows: usize,
    pub doubled: Vec<String>,
    pub missing_effect: Vec<String>,
    pub effect_mismatch: Vec<String>,
    pub replay_differs: Vec<String>,
    pub session_leaks: Vec<String>,
    pub rejected: Vec<String>,
    pub unexpected: Vec<String>,
}

impl ApiFindings {
    pub fn holds(&self) -> bool {
        self.violations().iter().all(|(_, keys)| keys.is_empty())
    }

    /// Each violation's name and scopes.
    pub fn violations(&self) -> [(&'static str, &Vec<String>); 7] {
        [
            ("api_doubled", &self.doubled),
            ("api_missing_effect", &self.missing_effect),
            ("api_effect_mismatch", &self.effect_mismatch),
            ("api_replay_differs", &self.replay_differs),
            ("api_session_leaks", &self.session_leaks),
            ("api_rejected", &self.rejected),
            ("api_unexpected", &self.unexpected),
        ]
    }
}

/// The fields of an answer's body the checker reads.
#[derive(Deserialize, Default)]
struct AnswerBody {
    #[serde(default)]
    charge: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    amount: Option<i64>,
    #[serde(default)]
    seen_tenant: Option<String>,
}

fn scope(tenant: &str, key: &str) -> String {
    format!("{tenant}/{key}")
}

/// Judges the API's attempts against its effect rows.
pub fn check(records: &[Record], rows: &[ApiEffectRow]) -> ApiFindings {
    let mut found = ApiFindings::default();
    // Per scope: the distinct 2xx answers (status and body) and the planned amount.
    let mut answers: BTreeMap<String, HashSet<(u16, &str)>> = BTreeMap::new();
    let mut sent: HashMap<String, &str> = HashMap::new();
    let mut leaks = HashSet::new();
    let mut rejected = HashSet::new();
    for record in records {
        let Record::Api {
            tenant,
            key,
            status,
            replayed,
            body,
            ..
        } = record
        else {
            continue;
        };
        let this = scope(tenant, key);
        found.attempts += 1;
        sent.entry(this.clone()).or_insert(key);
        let parsed: AnswerBody = body
            .as_deref()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        if parsed.seen_tenant.is_some_and(|seen| !seen.is_empty()) {
            leaks.insert(this.clone());
        }
        match status {
            None => found.no_answer += 1,
            Some(s) if (200..300).contains(s) => {
                found.replays += usize::from(*replayed);
                answers
                    .entry(this)
                    .or_default()
                    .insert((*s, body.as_deref().unwrap_or_default()));
            }
            Some(409) => found.conflicts += 1,
            Some(s) if *s >= 500 => {
                found.server_errors += 1;
                let text = body.as_deref().unwrap_or_default();
                found.handler_failures += usize::from(text.contains("drawn failure"));
                found.commits_refused +=
                    usize::from(*s == 500 && text.contains("\"Internal error\""));
            }
            Some(408 | 429) => {}
            Some(_) => {
                rejected.insert(this);
            }
        }
    }
    found.calls = sent.len();
    found.answered = answers.len();
    let mut tenants_of_key: HashMap<&str, usize> = HashMap::new();
    for key in sent.values() {
        *tenants_of_key.entry(key).or_default() += 1;
    }
    found.keys_shared_across_tenants = sent
        .values()
        .filter(|key| tenants_of_key[**key] > 1)
        .count();

    let mut by_scope: HashMap<String, Vec<&ApiEffectRow>> = HashMap::new();
    for row in rows {
        let this = scope(&row.tenant, &row.idem_key);
        if !row.seen_tenant.is_empty() {
            leaks.insert(this.clone());
        }
        by_scope.entry(this).or_default().push(row);
    }
    found.effect_rows = rows.len();
    for (this, rows) in &by_scope {
        if !sent.contains_key(this) {
            found.unexpected.push(this.clone());
        }
        if rows.len() > 1 {
            found.doubled.push(this.clone());
        }
    }
    for (this, distinct) in &answers {
        if distinct.len() > 1 {
            found.replay_differs.push(this.clone());
        }
        let Some(rows) = by_scope.get(this) else {
            found.missing_effect.push(this.clone());
            continue;
        };
        for (_, body) in distinct {
            let parsed: AnswerBody = serde_json::from_str(body).unwrap_or_default();
            let matches = rows.iter().any(|row| {
                parsed.charge.as_deref() == Some(&format!("ch_{}", row.id))
                    && parsed.tenant.as_deref() == Some(&row.tenant)
                    && parsed.amount == Some(row.amount)
            });
            if !matches {
                found.effect_mismatch.push(this.clone());
            }
        }
    }
    found.connection_reused_across_tenants = reused_across_tenants(rows);
    found.session_leaks = leaks.into_iter().collect();
    found.rejected = rejected.into_iter().collect();
    for list in [
        &mut found.doubled,
        &mut found.missing_effect,
        &mut found.effect_mismatch,
        &mut found.replay_differs,
        &mut found.session_leaks,
        &mut found.rejected,
        &mut found.unexpected,
    ] {
        list.sort();
        list.dedup();
    }
    found
}

/// The attempts and effect rows of `scope` (`tenant/key`), for a failure report.
pub fn scope_history(scope_name: &str, records: &[Record], rows: &[ApiEffectRow]) -> Vec<String> {
    let mut lines: Vec<String> = records
        .iter()
        .filter(
            |r| matches!(r, Record::Api { tenant, key, .. } if scope(tenant, key) == scope_name),
        )
        .map(|r| serde_json::to_string(r).unwrap_or_default())
        .collect();
    lines.extend(
        rows.iter()
            .filter(|row| scope(&row.tenant, &row.idem_key) == scope_name)
            .map(|row| format!("effect {}", serde_json::to_string(row).unwrap_or_default())),
    );
    lines
}

/// Executions whose backend's previous execution, in the same process start, was another
/// tenant's (rows in id order).
fn reused_across_tenants(rows: &[ApiEffectRow]) -> usize {
    let mut sorted: Vec<&ApiEffectRow> = rows.iter().collect();
    sorted.sort_by_key(|r| r.id);
    let mut last_tenant: HashMap<(&str, i32), &str> = HashMap::new();
    let mut reused = 0;
    for row in sorted {
        let previous = last_tenant.insert((&row.process, row.backend_pid), &row.tenant);
        reused += usize::from(previous.is_some_and(|t| t != row.tenant));
    }
    reused
}

#[cfg(test)]
#[path = "api_check_tests.rs"]
mod tests;
