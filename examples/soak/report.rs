//! The report of a run: the checker's verdict on what the run produced, the summary line (the
//! last line printed), `summary.json`, and on a violation the seed, the replay command, the
//! schedule and the violating keys' history; and `soak --check DIR`, which judges a kept run's
//! directory again.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::api::ApiTotals;
use crate::api_check::{self, ApiEffectRow, ApiFindings};
use crate::checker::{self, DeadLetterRow, EffectRow, EndState, Findings};
use crate::cluster::API_PROCESSES;
use crate::history;
use crate::history_check::{self, HistoryTables};
use crate::order_check::{self, LaneRow, OrderFindings};
use crate::plan::{FaultKind, Isolation, Plan};
use crate::run::{Options, Ran};

/// Violating keys whose history a failure prints (all of them are in `summary.json`).
const KEYS_SHOWN: usize = 20;

/// The last line printed: the fields first, then the rest of what was found.
#[derive(Serialize)]
struct Summary<'a> {
    seed: u64,
    seconds: u64,
    events_accepted: usize,
    /// Injected by kind, and what the SQS duplicator saw (`sqs_made_visible`,
    /// `sqs_received_twice`) and the nemesis did after a crash (`pg_restart`).
    faults: &'a BTreeMap<&'static str, u64>,
    /// What the plan sent, by kind (within the run).
    workload: BTreeMap<&'static str, u64>,
    lost: usize,
    doubled: usize,
    /// The Idempotency-Key layer's calls and what its checker counted ([`ApiSummary`]).
    api: ApiSummary,
    /// Of `doubled`, changes sent on two channels at once (issue 36, item 1), and by their
    /// second channel.
    doubled_two_channels: usize,
    doubled_two_channels_by_kind: &'a BTreeMap<String, usize>,
    two_channel_changes: usize,
    isolation: Isolation,
    workers: u32,
    sink_redeliveries_same_key: usize,
    sink_redeliveries_other_key: usize,
    sink_wrong_key: usize,
    /// The ordered sink ([`crate::order_check`]): deliveries out of their key's commit order,
    /// accepted events it never answered 2xx, deliveries of no row of its lane, and how much
    /// was judged (deliveries of keyed rows, keys, keys with two rows or more arrived).
    order_violations: usize,
    ordered_missing: usize,
    ordered_unexpected: usize,
    ordered_deliveries: usize,
    ordered_deliveries_checked: usize,
    ordered_redeliveries: usize,
    ordered_keys_checked: usize,
    ordered_keys_with_several: usize,
    ordered_rows: usize,
    reaccepted_after_window: usize,
    missing_effect: usize,
    unexpected: usize,
    rejected: usize,
    recovered: usize,
    dead_letters: usize,
    /// Foreign messages with no id, dead-lettered as promised (distinct).
    dead_lettered_as_promised: usize,
    dead_letter_missing: usize,
    dead_letter_unexpected: usize,
    outbox_failed: usize,
    crashes: usize,
    events_attempted: usize,
    posts: usize,
    posts_not_started: usize,
    posts_abandoned: usize,
    direct_abandoned: usize,
    sink_deliveries: usize,
    effect_rows: usize,
    drained: bool,
    outbox_pending: i64,
    left_in_queues: [i64; 3],
    rate: u32,
    sqs_rate: u32,
    window_secs: u64,
    verdict: &'static str,
    /// Why the verdict is `violated`: each violation with its count, too few events accepted,
    /// an unfinished drain (empty when it held).
    why: Vec<String>,
    run_dir: String,
}

/// Judges the run, prints the report and the summary line; whether the promise held.
pub fn report(o: &Options, plan: &Plan, run_dir: &Path, ran: Ran) -> anyhow::Result<bool> {
    let records = history::read(&run_dir.join("history.jsonl"))?;
    let found = checker::check(
        &records,
        &ran.last.effects,
        &ran.last.dead_letters,
        plan.window_secs,
    );
    let api = api_check::check(&records, &ran.last.api_effects);
    let order = order_check::check(&records, &ran.last.ordered_lane, &found.accepted);
    let mut why = checker::verdict(
        &found,
        &api,
        EndState {
            drained: ran.drained.complete,
            outbox_failed: ran.last.outbox_failed,
            crashes: ran.crashes.len(),
        },
    );
    why.extend(order.reasons(found.events_accepted));
    let history = history_check::check(&ran.last.history, &ran.last.effects);
    why.extend(history.reasons());
    let holds = why.is_empty();
    let summary = Summary {
        seed: o.seed,
        seconds: o.seconds,
        events_accepted: found.events_accepted,
        faults: &ran.faults,
        workload: crate::workload::counts(plan),
        lost: found.lost.len(),
        doubled: found.doubled.len(),
        api: ApiSummary::new(&api, ran.api_totals, plan),
        doubled_two_channels: found.doubled_two_channels.len(),
        doubled_two_channels_by_kind: &found.doubled_two_channels_by_kind,
        two_channel_changes: found.two_channel_changes,
        isolation: plan.isolation,
        workers: plan.workers,
        sink_redeliveries_same_key: found.sink_redeliveries_same_key,
        sink_redeliveries_other_key: found.sink_redeliveries_other_key,
        sink_wrong_key: found.sink_wrong_key,
        order_violations: order.order_violations.len(),
        ordered_missing: order.ordered_missing.len(),
        ordered_unexpected: order.ordered_unexpected.len(),
        ordered_deliveries: order.ordered_deliveries,
        ordered_deliveries_checked: order.ordered_deliveries_checked,
        ordered_redeliveries: order.ordered_redeliveries,
        ordered_keys_checked: order.ordered_keys_checked,
        ordered_keys_with_several: order.ordered_keys_with_several,
        ordered_rows: order.ordered_rows,
        reaccepted_after_window: found.reaccepted_after_window.len(),
        missing_effect: found.missing_effect.len(),
        unexpected: found.unexpected.len(),
        rejected: found.rejected.len(),
        recovered: found.recovered,
        dead_letters: ran.last.dead_letters.len(),
        dead_lettered_as_promised: found.dead_lettered_as_promised,
        dead_letter_missing: found.dead_letter_missing.len(),
        dead_letter_unexpected: found.dead_letter_unexpected.len(),
        outbox_failed: ran.last.outbox_failed,
        crashes: ran.crashes.len(),
        events_attempted: found.events_attempted,
        posts: found.posts,
        posts_not_started: ran.totals.posts_not_started,
        posts_abandoned: ran.totals.posts_abandoned,
        direct_abandoned: ran.direct_abandoned,
        sink_deliveries: found.sink_deliveries,
        effect_rows: found.effect_rows,
        drained: ran.drained.complete,
        outbox_pending: ran.last.outbox_pending,
        left_in_queues: ran.last.left_in_queues,
        rate: o.rate,
        sqs_rate: o.sqs_rate,
        window_secs: o.window_secs,
        verdict: if holds { "held" } else { "violated" },
        why,
        run_dir: run_dir.display().to_string(),
    };
    let full = serde_json::json!({
        "summary": &summary, "findings": &found, "api_findings": &api,
        "order_findings": &order, "history_findings": &history, "drain": &ran.drained, "crashes": &ran.crashes,
        "faults_without_effect": &ran.faults_without_effect,
        "peak_memory_kb": &ran.peak_memory_kb,
    });
    std::fs::write(
        run_dir.join("summary.json"),
        serde_json::to_vec_pretty(&full)?,
    )?;
    if !ran.drained.complete {
        eprintln!("soak: the drain did not complete: {:?}", ran.drained);
    }
    if !holds {
        explain_failure(o, plan, run_dir, &found, &ran, &records, &summary.why);
        explain_api_failure(&api, &records, &ran.last.api_effects);
        explain_order_failure(&order, &records);
    }
    println!("{}", serde_json::to_string(&summary)?);
    Ok(holds)
}

fn explain_failure(
    o: &Options,
    plan: &Plan,
    run_dir: &Path,
    found: &Findings,
    ran: &Ran,
    records: &[history::Record],
    summary_why: &[String],
) {
    eprintln!(
        "soak: VIOLATED ({}). seed {}; replay: {}",
        summary_why.join("; "),
        o.seed,
        replay_command(o)
    );
    eprintln!("soak: fault schedule ({} faults):", plan.faults.len());
    for fault in &plan.faults {
        eprintln!("  {}", serde_json::to_string(fault).unwrap_or_default());
    }
    for crash in &ran.crashes {
        eprintln!("soak: crash: {crash}");
    }
    if !found.dead_letter_unexpected.is_empty() || ran.last.outbox_failed > 0 {
        eprintln!(
            "soak: {} unexpected dead letter(s), {} failed outbox row(s): see dead_letters.txt, outbox_failed.txt in {}",
            found.dead_letter_unexpected.len(), ran.last.outbox_failed, run_dir.display()
        );
    }
    if !found.doubled_two_channels.is_empty() {
        eprintln!(
            "soak: {} of the doubled change(s) were sent on two channels at once (a webhook and \
             an EventBridge or thin copy: issue 36, item 1), by second channel {:?}: {}",
            found.doubled_two_channels.len(),
            found.doubled_two_channels_by_kind,
            found
                .doubled_two_channels
                .iter()
                .take(KEYS_SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let keys = found.violating_keys();
    for (what, key) in keys.iter().take(KEYS_SHOWN) {
        eprintln!("soak: {what} {key}:");
        for line in checker::key_history(key, records, &ran.last.effects) {
            eprintln!("    {line}");
        }
    }
    if keys.len() > KEYS_SHOWN {
        eprintln!(
            "soak: … and {} more in summary.json",
            keys.len() - KEYS_SHOWN
        );
    }
}

/// The layer's violations, each scope's attempts and rows.
fn explain_api_failure(api: &ApiFindings, records: &[history::Record], rows: &[ApiEffectRow]) {
    for (what, scopes) in api.violations() {
        for scope in scopes.iter().take(KEYS_SHOWN) {
            eprintln!("soak: {what} {scope}:");
            for line in api_check::scope_history(scope, records, rows) {
                eprintln!("    {line}");
            }
        }
    }
}

/// The ordered sink's violations, each with its key's deliveries there.
fn explain_order_failure(order: &OrderFindings, records: &[history::Record]) {
    let mut shown = std::collections::BTreeSet::new();
    for violation in order.order_violations.iter().take(KEYS_SHOWN) {
        eprintln!(
            "soak: order violation: {}",
            serde_json::to_string(violation).unwrap_or_default()
        );
        if shown.insert(violation.ordering_key.as_str()) {
            eprintln!("soak: ordered sink, key {}:", violation.ordering_key);
            for line in order_check::key_history(&violation.ordering_key, records) {
                eprintln!("    {line}");
            }
        }
    }
    for (what, keys) in [
        ("ordered_missing", &order.ordered_missing),
        ("ordered_unexpected", &order.ordered_unexpected),
    ] {
        if !keys.is_empty() {
            let some: Vec<&str> = keys.iter().take(KEYS_SHOWN).map(String::as_str).collect();
            eprintln!("soak: {what} ({}): {}", keys.len(), some.join(", "));
        }
    }
}

/// The API's part of the summary line: counts, no lists (those are in `summary.json`).
#[derive(Serialize)]
struct ApiSummary {
    rate: u32,
    calls: usize,
    answered: usize,
    calls_not_started: usize,
    calls_abandoned: usize,
    attempts: usize,
    replays: usize,
    conflicts: usize,
    server_errors: usize,
    handler_failures: usize,
    commits_refused: usize,
    no_answer: usize,
    /// Faults the nemesis planned on the API processes, by kind (`kill`, `pause`, `reload`).
    process_faults: BTreeMap<&'static str, usize>,
    keys_shared_across_tenants: usize,
    connection_reused_across_tenants: usize,
    effect_rows: usize,
    /// Each violation's count (all 0 when the layer's checks held).
    violations: BTreeMap<&'static str, usize>,
}

impl ApiSummary {
    fn new(api: &ApiFindings, totals: ApiTotals, plan: &Plan) -> ApiSummary {
        let mut process_faults = BTreeMap::new();
        for fault in &plan.faults {
            let process = match &fault.kind {
                FaultKind::Kill { process, .. }
                | FaultKind::Pause { process, .. }
                | FaultKind::Reload { process, .. } => *process,
                _ => continue,
            };
            if API_PROCESSES.contains(&process) {
                *process_faults.entry(fault.kind.name()).or_default() += 1;
            }
        }
        ApiSummary {
            rate: plan.api_rate,
            calls: api.calls,
            answered: api.answered,
            calls_not_started: totals.calls_not_started,
            calls_abandoned: totals.calls_abandoned,
            attempts: api.attempts,
            replays: api.replays,
            conflicts: api.conflicts,
            server_errors: api.server_errors,
            handler_failures: api.handler_failures,
            commits_refused: api.commits_refused,
            no_answer: api.no_answer,
            process_faults,
            keys_shared_across_tenants: api.keys_shared_across_tenants,
            connection_reused_across_tenants: api.connection_reused_across_tenants,
            effect_rows: api.effect_rows,
            violations: api
                .violations()
                .into_iter()
                .map(|(what, scopes)| (what, scopes.len()))
                .collect(),
        }
    }
}

pub fn replay_command(o: &Options) -> String {
    let mut command = format!("bench/soak.sh {} {}", o.seconds, o.seed);
    if o.rate != 60 {
        command = format!("SOAK_RATE={} {command}", o.rate);
    }
    if o.sqs_rate != 4 {
        command = format!("SOAK_SQS_RATE={} {command}", o.sqs_rate);
    }
    if o.api_rate != o.rate.div_ceil(6) {
        command = format!("SOAK_API_RATE={} {command}", o.api_rate);
    }
    if o.window_secs != 60 {
        command = format!("SOAK_WINDOW_SECS={} {command}", o.window_secs);
    }
    command
}

/// Judges a kept run's directory again (history and effects; the store is not read).
pub fn check_again(dir: &Path) -> anyhow::Result<bool> {
    let schedule: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("schedule.json"))?)?;
    let window = schedule["window_secs"]
        .as_u64()
        .context("schedule.json: window_secs")?;
    let records = history::read(&dir.join("history.jsonl"))?;
    let effects: Vec<EffectRow> = std::fs::read_to_string(dir.join("effects.jsonl"))?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    // Runs before the dead letters were dumped as JSON lines have none to judge.
    let dead_letters: Vec<DeadLetterRow> = std::fs::read_to_string(dir.join("dead_letters.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let found = checker::check(&records, &effects, &dead_letters, window);
    for (what, key) in found.violating_keys().iter().take(KEYS_SHOWN) {
        eprintln!("soak: {what} {key}:");
        for line in checker::key_history(key, &records, &effects) {
            eprintln!("    {line}");
        }
    }
    // Runs before the API was in the soak have no API effects to judge.
    let api_effects: Vec<ApiEffectRow> = std::fs::read_to_string(dir.join("api_effects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let api = api_check::check(&records, &api_effects);
    explain_api_failure(&api, &records, &api_effects);
    // Runs before the ordered sink have no lane to judge.
    let lane: Option<Vec<LaneRow>> = match std::fs::read_to_string(dir.join("ordered_outbox.jsonl"))
    {
        Ok(text) => Some(
            text.lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()?,
        ),
        Err(_) => None,
    };
    let order = lane.map(|lane| order_check::check(&records, &lane, &found.accepted));
    if let Some(order) = &order {
        explain_order_failure(order, &records);
    }
    // Runs before issue 40's history check have no history tables to judge.
    let history = match std::fs::read_to_string(dir.join("history_tables.json")) {
        Ok(text) => Some(history_check::check(
            &serde_json::from_str::<HistoryTables>(&text)?,
            &effects,
        )),
        Err(_) => None,
    };
    if let Some(history) = &history {
        for reason in history.reasons() {
            eprintln!("soak: {reason}");
        }
    }
    println!(
        "{}",
        serde_json::json!({"findings": &found, "api_findings": &api, "order_findings": &order,
                           "history_findings": &history})
    );
    Ok(found.holds()
        && api.holds()
        && order.is_none_or(|o| o.holds())
        && history.is_none_or(|h| h.reasons().is_empty()))
}
