//! One soak, start to end: the plan, the run's resources and processes, the run with its
//! sender and nemesis, the drain, the final reading, the checker, the report and the cleanup
//! (which happens whatever failed before it).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checker::{self, DeadLetterRow, EffectRow, EndState, Findings};
use crate::cluster::{Cluster, LAYOUT};
use crate::drain::{self, DrainWatch, Drained, FinalState};
use crate::history::{self, History};
use crate::infra::Infra;
use crate::nemesis::{self, Nemesis};
use crate::plan::{Isolation, Plan};
use crate::postgres::PgServer;
use crate::producer::Producer;
use crate::sender::{Sender, SenderTotals};
use crate::settings::{common_env, lane_env, SECRET};
use crate::sink::{self, SinkSeen};

/// Violating keys whose history a failure prints (all of them are in `summary.json`).
const KEYS_SHOWN: usize = 20;

pub struct Options {
    pub seconds: u64,
    pub seed: u64,
    pub rate: u32,
    pub sqs_rate: u32,
    pub window_secs: u64,
    pub parent_dir: PathBuf,
    pub service: PathBuf,
}

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

pub async fn soak(o: Options) -> anyhow::Result<bool> {
    if !o.service.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --example soak_service` (bench/soak.sh does)",
            o.service.display()
        );
    }
    let run_id = format!("{:x}_{}", o.seed, std::process::id());
    let run_dir = o.parent_dir.join(&run_id);
    std::fs::create_dir_all(run_dir.join("logs"))
        .with_context(|| format!("creating {}", run_dir.display()))?;
    eprintln!(
        "soak: seed {} ({} s at {} events/s, dedup window {} s); replay: {}; run directory {}",
        o.seed,
        o.seconds,
        o.rate,
        o.window_secs,
        replay_command(&o),
        run_dir.display()
    );
    let plan = Arc::new(Plan::generate(
        o.seed,
        o.seconds,
        o.rate,
        o.window_secs,
        o.sqs_rate,
    ));
    let schedule = serde_json::json!({
        "seed": plan.seed, "seconds": plan.seconds, "rate": plan.rate,
        "window_secs": plan.window_secs, "sqs_rate": plan.sqs_rate,
        "isolation": plan.isolation, "workers": plan.workers,
        "events": plan.events.len(), "posts": plan.posts.len(), "direct": plan.direct.len(),
        "faults": plan.faults,
    });
    std::fs::write(
        run_dir.join("schedule.json"),
        serde_json::to_vec_pretty(&schedule)?,
    )?;

    let isolation = plan.isolation;
    let pg = tokio::task::spawn_blocking(move || PgServer::start(isolation))
        .await?
        .context("starting the run's PostgreSQL server")?;
    let pg = Arc::new(pg);
    eprintln!(
        "soak: PostgreSQL of the run's own on port {} (default_transaction_isolation {}); {} consumer worker(s)",
        pg.port,
        plan.isolation.setting(),
        plan.workers
    );
    let outcome = soak_on(&o, &plan, &run_id, &run_dir, &pg).await;
    // Whatever happened: the server stopped and its directory removed.
    tokio::task::spawn_blocking(move || pg.remove()).await?;
    outcome
}

async fn soak_on(
    o: &Options,
    plan: &Arc<Plan>,
    run_id: &str,
    run_dir: &Path,
    pg: &Arc<PgServer>,
) -> anyhow::Result<bool> {
    let (history, writer) =
        History::create(&run_dir.join("history.jsonl"), std::time::Instant::now())?;
    let seen = Arc::new(SinkSeen::default());
    let sink = sink::start(history.clone(), seen.clone()).await?;
    let infra = Arc::new(Infra::create(run_id, sink, pg.admin_url()).await?);
    let cluster = Arc::new(Cluster::new(
        plan.workers,
        o.service.clone(),
        common_env(&infra, o.window_secs),
        lane_env(&infra),
        run_dir.join("logs"),
    ));
    // A SIGINT or SIGTERM at any point ends the run where it is; the cleanup below still runs.
    let ran = tokio::select! {
        ran = exercise(plan, &infra, pg, &cluster, &history, &seen, run_dir) => ran,
        signal = stop_signal() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    // Whatever happened: every process stopped, then the history closed.
    for process in 0..LAYOUT.len() {
        cluster.kill(process);
    }
    drop(history);
    let written = writer.finish().await;
    let outcome = match (ran, written) {
        (Ok(ran), Ok(())) => report(o, plan, run_dir, ran),
        (Err(error), _) => Err(error),
        (_, Err(error)) => Err(anyhow::Error::new(error).context("writing the history")),
    };
    // The database goes with its server (removed by the caller); the run's directory keeps
    // what a post-mortem reads (effects, dead letters, the outbox's failed rows, the logs).
    infra.remove(true).await;
    outcome
}

/// What the run produced, for the report.
struct Ran {
    faults: BTreeMap<&'static str, u64>,
    faults_without_effect: BTreeMap<&'static str, u64>,
    peak_memory_kb: Vec<(&'static str, u64)>,
    crashes: Vec<String>,
    totals: SenderTotals,
    direct_abandoned: usize,
    drained: Drained,
    last: FinalState,
}

async fn exercise(
    plan: &Arc<Plan>,
    infra: &Arc<Infra>,
    pg: &Arc<PgServer>,
    cluster: &Arc<Cluster>,
    history: &History,
    seen: &Arc<SinkSeen>,
    run_dir: &Path,
) -> anyhow::Result<Ran> {
    // The first process applies the migrations; then the rest start together.
    let start_deadline = Instant::now() + Duration::from_secs(120);
    let first = LAYOUT.len() - 1;
    let failures = cluster.start_until(first, start_deadline).await;
    if cluster.down().contains(&first) {
        bail!(
            "{} did not start: {}",
            LAYOUT[first].name,
            failures.join("; ")
        );
    }
    let starts = (0..first).map(|p| cluster.start_until(p, start_deadline));
    futures::future::join_all(starts).await;
    if !cluster.down().is_empty() {
        let names: Vec<&str> = cluster.down().iter().map(|p| LAYOUT[*p].name).collect();
        bail!("{} did not start (see their logs)", names.join(", "));
    }
    let store = infra.store().await?;

    history.phase("run");
    let accepted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (stop_new, give_up, stop_faults) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CancellationToken::new(),
    );
    let run_start_unix = chrono::Utc::now().timestamp();
    let sender = Sender {
        plan: plan.clone(),
        history: history.clone(),
        ingress: cluster.ingress.clone(),
        secret: SECRET.to_owned(),
        run_start_unix,
        accepted: accepted.clone(),
    };
    let sending = tokio::spawn(sender.run(stop_new.clone(), give_up.clone()));
    let producer = Arc::new(Producer {
        plan: plan.clone(),
        history: history.clone(),
        store: store.clone(),
        amqp_url: infra.amqp_url.clone(),
        rabbit_queue: infra.rabbit_queue.clone(),
        sqs: infra.sqs.clone(),
        sqs_queue_url: infra.sqs_queue_url.clone(),
        run_start_unix,
        accepted: accepted.clone(),
        rabbit: tokio::sync::Mutex::default(),
    });
    let producing = tokio::spawn(producer.run(stop_new.clone(), give_up.clone()));
    let nemesis = Arc::new(Nemesis {
        pg: pg.clone(),
        plan: plan.clone(),
        cluster: cluster.clone(),
        infra: infra.clone(),
        store: store.clone(),
        history: history.clone(),
        counts: Mutex::default(),
        no_effect: Mutex::default(),
        crashes: Mutex::default(),
    });
    let faults = tokio::spawn(nemesis.clone().run(stop_faults.clone()));
    let stop_watch = CancellationToken::new();
    let watch = tokio::spawn(nemesis::watch_crashes(nemesis.clone(), stop_watch.clone()));
    tokio::time::sleep(Duration::from_secs(plan.seconds)).await;
    stop_new.cancel();
    stop_faults.cancel();
    let _ = faults.await;

    history.phase("drain");
    nemesis::heal_all(cluster, infra, pg, history).await;
    let drained = DrainWatch {
        infra,
        store: &store,
        accepted: &accepted,
        seen,
        sender_done: &|| sending.is_finished() && producing.is_finished(),
        deadline: Duration::from_secs(180.max(plan.seconds / 2)),
    }
    .wait()
    .await;
    give_up.cancel();
    let totals = sending.await.context("the sender panicked")?;
    let direct_abandoned = producing.await.context("the direct producer panicked")?;
    stop_watch.cancel();
    let _ = watch.await;

    history.phase("stop");
    let peak_memory_kb = cluster.peak_memory_kb();
    let stops = (0..LAYOUT.len()).map(|p| cluster.stop(p));
    futures::future::join_all(stops).await;
    let last = drain::read_final(&store, infra, run_dir).await?;
    store.close().await;
    let mut faults = nemesis.counts.lock().expect("counts").clone();
    // Every kind, injected or not, so a summary always names them all.
    for name in crate::faults::FAULT_NAMES.into_iter().chain(["pg_restart"]) {
        faults.entry(name).or_insert(0);
    }
    let duplicated = infra.duplicator().counts();
    faults.insert("sqs_made_visible", duplicated.made_visible);
    faults.insert("sqs_received_twice", duplicated.received_twice);
    let faults_without_effect = nemesis.no_effect.lock().expect("counts").clone();
    let crashes = nemesis.crashes.lock().expect("crashes").clone();
    Ok(Ran {
        faults,
        faults_without_effect,
        peak_memory_kb,
        crashes,
        totals,
        direct_abandoned,
        drained,
        last,
    })
}

/// Judges the run, prints the report and the summary line; whether the promise held.
fn report(o: &Options, plan: &Plan, run_dir: &Path, ran: Ran) -> anyhow::Result<bool> {
    let records = history::read(&run_dir.join("history.jsonl"))?;
    let found = checker::check(
        &records,
        &ran.last.effects,
        &ran.last.dead_letters,
        plan.window_secs,
    );
    let why = checker::verdict(
        &found,
        EndState {
            drained: ran.drained.complete,
            outbox_failed: ran.last.outbox_failed,
            crashes: ran.crashes.len(),
        },
    );
    let holds = why.is_empty();
    let summary = Summary {
        seed: o.seed,
        seconds: o.seconds,
        events_accepted: found.events_accepted,
        faults: &ran.faults,
        workload: crate::workload::counts(plan),
        lost: found.lost.len(),
        doubled: found.doubled.len(),
        doubled_two_channels: found.doubled_two_channels.len(),
        doubled_two_channels_by_kind: &found.doubled_two_channels_by_kind,
        two_channel_changes: found.two_channel_changes,
        isolation: plan.isolation,
        workers: plan.workers,
        sink_redeliveries_same_key: found.sink_redeliveries_same_key,
        sink_redeliveries_other_key: found.sink_redeliveries_other_key,
        sink_wrong_key: found.sink_wrong_key,
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
        "summary": &summary, "findings": &found, "drain": &ran.drained, "crashes": &ran.crashes,
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

/// SIGINT or SIGTERM, whichever comes first.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}

fn replay_command(o: &Options) -> String {
    let mut command = format!("bench/soak.sh {} {}", o.seconds, o.seed);
    if o.rate != 60 {
        command = format!("SOAK_RATE={} {command}", o.rate);
    }
    if o.sqs_rate != 4 {
        command = format!("SOAK_SQS_RATE={} {command}", o.sqs_rate);
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
    println!("{}", serde_json::to_string(&found)?);
    Ok(found.holds())
}
