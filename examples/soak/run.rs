//! One soak, start to end: the plan, the run's PostgreSQL server, resources and processes, the
//! run with its sender, direct producer and nemesis, the drain, the final reading, the report
//! ([`crate::report`]) and the cleanup (which happens whatever failed before it).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiClient, ApiTotals};
use crate::cluster::{Cluster, LAYOUT};
use crate::drain::{self, DrainWatch, Drained, FinalState};
use crate::history::History;
use crate::infra::Infra;
use crate::nemesis::{self, Nemesis};
use crate::plan::Plan;
use crate::postgres::PgServer;
use crate::producer::Producer;
use crate::report::{replay_command, report};
use crate::sender::{Sender, SenderTotals};
use crate::settings::{common_env, lane_env, SECRET};
use crate::sink::{self, SinkSeen};

pub struct Options {
    pub seconds: u64,
    pub seed: u64,
    pub rate: u32,
    pub sqs_rate: u32,
    pub api_rate: u32,
    pub window_secs: u64,
    pub parent_dir: PathBuf,
    pub service: PathBuf,
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
    let plan = Arc::new(
        Plan::generate(o.seed, o.seconds, o.rate, o.window_secs, o.sqs_rate).with_api(o.api_rate),
    );
    let schedule = serde_json::json!({
        "seed": plan.seed, "seconds": plan.seconds, "rate": plan.rate,
        "window_secs": plan.window_secs, "sqs_rate": plan.sqs_rate,
        "isolation": plan.isolation, "workers": plan.workers,
        "events": plan.events.len(), "posts": plan.posts.len(), "direct": plan.direct.len(),
        "api_rate": plan.api_rate, "api_calls": plan.api.len(),
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
pub struct Ran {
    pub faults: BTreeMap<&'static str, u64>,
    pub faults_without_effect: BTreeMap<&'static str, u64>,
    pub peak_memory_kb: Vec<(&'static str, u64)>,
    pub crashes: Vec<String>,
    pub totals: SenderTotals,
    pub api_totals: ApiTotals,
    pub direct_abandoned: usize,
    pub drained: Drained,
    pub last: FinalState,
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
        ingress: cluster.addresses.clone(),
        secret: SECRET.to_owned(),
        run_start_unix,
        accepted: accepted.clone(),
    };
    let sending = tokio::spawn(sender.run(stop_new.clone(), give_up.clone()));
    let api_client = ApiClient {
        calls: Arc::new(plan.api.clone()),
        history: history.clone(),
        addresses: cluster.addresses.clone(),
    };
    let calling = tokio::spawn(api_client.run(stop_new.clone(), give_up.clone()));
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
        sender_done: &|| sending.is_finished() && producing.is_finished() && calling.is_finished(),
        deadline: Duration::from_secs(180.max(plan.seconds / 2)),
    }
    .wait()
    .await;
    give_up.cancel();
    let totals = sending.await.context("the sender panicked")?;
    let api_totals = calling.await.context("the API client panicked")?;
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
        api_totals,
        direct_abandoned,
        drained,
        last,
    })
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
