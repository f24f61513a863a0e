//! The nemesis: carries out the plan's fault schedule at its times, each fault on a task of its
//! own (a partition and a pause may overlap; the plan never puts two on one target), writes
//! each fault's start and end into the history, and counts what it injected. Stopping it cuts
//! every fault's remaining time short; the drain then heals what is left ([`heal_all`]).
//!
//! Beside it, a watch ([`watch_crashes`]) reaps processes that exited although nobody stopped
//! them (a crash is a finding), records them and starts them again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_worker::testing::fault_proxy::Mode;
use dedup_worker_core::store::Store;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, LAYOUT};
use crate::history::History;
use crate::infra::{Infra, CALL_TIMEOUT};
use crate::plan::{consumer_processes, Dependency, Fault, FaultKind, Partition, Plan};
use crate::postgres::PgServer;

/// One burst of lost answers (and the pause after it): longer than a mark's or a commit's round
/// trip, shorter than a lease.
const LOST_ANSWERS_MS: u64 = 400;

/// The sink's added latency during lost answers: a delivery then outlasts a burst.
const SLOW_SINK_MS: u64 = 300;

/// How long a restart may keep trying (a dependency it needs may be down).
const RESTART_DEADLINE: Duration = Duration::from_secs(120);

pub struct Nemesis {
    pub plan: Arc<Plan>,
    pub pg: Arc<PgServer>,
    pub cluster: Arc<Cluster>,
    pub infra: Arc<Infra>,
    pub store: Store,
    pub history: History,
    /// Faults injected, by kind (the summary's `faults`).
    pub counts: Mutex<BTreeMap<&'static str, u64>>,
    /// Of those, the ones that found nothing to do: a kill or pause of a process that was down,
    /// a seal that did not seal (another process's retention held the ring, or the next slot
    /// was busy).
    pub no_effect: Mutex<BTreeMap<&'static str, u64>>,
    /// Processes that exited by themselves.
    pub crashes: Mutex<Vec<String>>,
}

impl Nemesis {
    /// Injects the schedule's faults at their times (measured from now) until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let started = Instant::now();
        let mut faults = JoinSet::new();
        for fault in self.plan.faults.clone() {
            let due = started + Duration::from_millis(fault.at_ms);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            faults.spawn(self.clone().inject(fault, stop.clone()));
        }
        while faults.join_next().await.is_some() {}
    }

    async fn inject(self: Arc<Self>, fault: Fault, stop: CancellationToken) {
        let name = fault.kind.name();
        self.count(name);
        let detail = serde_json::to_string(&fault.kind).unwrap_or_default();
        self.history.fault("start", name, detail);
        // Waits `ms`, or less if the run ends first.
        let hold = |ms: u64| {
            let stop = stop.clone();
            async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                }
            }
        };
        let mut effective = true;
        let end = match fault.kind {
            FaultKind::Kill { process, down_ms } => {
                effective = self.cluster.kill(process);
                hold(down_ms).await;
                self.restart(process).await
            }
            FaultKind::Pause { process, ms } => {
                effective = self.cluster.pause(process);
                hold(ms).await;
                self.cluster.resume(process);
                String::new()
            }
            // Answers lost in bursts ([`LOST_ANSWERS_MS`] lost, then as long passing) for `ms`,
            // while every delivery to the sink takes [`SLOW_SINK_MS`] each way longer: a relay
            // is then mostly between its claim and its mark, so a burst catches marks (and the
            // consumers' commits), not only the claims and reads a single outage would catch.
            FaultKind::Partition {
                dependency,
                mode: Partition::LoseAnswers,
                ms,
            } => {
                let proxy = self.infra.proxy(dependency);
                let sink = self.infra.proxy(Dependency::Sink);
                sink.set_latency(Duration::from_millis(SLOW_SINK_MS));
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until && !stop.is_cancelled() {
                    proxy.set(Mode::LoseAnswers).await;
                    hold(LOST_ANSWERS_MS).await;
                    proxy.set(Mode::Pass).await;
                    hold(LOST_ANSWERS_MS).await;
                }
                sink.set_latency(Duration::ZERO);
                String::new()
            }
            FaultKind::Partition {
                dependency,
                mode,
                ms,
            } => {
                let proxy = self.infra.proxy(dependency);
                proxy
                    .set(match mode {
                        Partition::BlackHole => Mode::BlackHole,
                        Partition::Refuse => Mode::Refuse,
                        Partition::LoseAnswers => Mode::LoseAnswers,
                    })
                    .await;
                hold(ms).await;
                proxy.set(Mode::Pass).await;
                String::new()
            }
            FaultKind::Cut { dependency } => {
                self.infra.proxy(dependency).cut_all().await;
                String::new()
            }
            FaultKind::Latency {
                dependency,
                latency_ms,
                ms,
                backlog_ms,
            } => {
                for process in consumer_processes() {
                    self.cluster.pause(process);
                }
                hold(backlog_ms).await;
                let proxy = self.infra.proxy(dependency);
                proxy.set_latency(Duration::from_millis(latency_ms));
                for process in consumer_processes() {
                    self.cluster.resume(process);
                }
                hold(ms).await;
                proxy.set_latency(Duration::ZERO);
                String::new()
            }
            FaultKind::Seal => {
                let window = Duration::from_secs(self.plan.window_secs);
                let sealed =
                    tokio::time::timeout(CALL_TIMEOUT, self.store.dedup().seal(window)).await;
                effective = matches!(&sealed, Ok(Ok(done)) if done.sealed);
                format!("{sealed:?}")
            }
            FaultKind::Retention => self.retention().await,
            FaultKind::PgCrash { down_ms } => {
                effective = self.pg.kill();
                hold(down_ms).await;
                let restarted = self.pg.restart(Instant::now() + RESTART_DEADLINE).await;
                if restarted.is_ok() {
                    self.count("pg_restart");
                }
                format!("{restarted:?}")
            }
            FaultKind::SqsDuplicate { ms, one_in } => {
                let duplicator = self.infra.duplicator();
                let before = duplicator.counts();
                duplicator.set(one_in);
                hold(ms).await;
                duplicator.set(0);
                let after = duplicator.counts();
                let made_visible = after.made_visible - before.made_visible;
                effective = made_visible > 0;
                format!("{made_visible} message(s) made visible again")
            }
            FaultKind::Reload { process, tuning } => {
                let exited = self.cluster.stop(process).await;
                self.cluster.set_tuning(process, tuning);
                let mut end = if exited {
                    String::new()
                } else {
                    "did not exit on SIGTERM in time: killed; ".to_owned()
                };
                end.push_str(&self.restart(process).await);
                end
            }
        };
        if !effective {
            *self
                .no_effect
                .lock()
                .expect("counts")
                .entry(name)
                .or_default() += 1;
        }
        self.history.fault("end", name, end);
    }

    fn count(&self, name: &'static str) {
        *self.counts.lock().expect("counts").entry(name).or_default() += 1;
    }

    /// A retention pass as a consumer runs it, with the run's window.
    async fn retention(&self) -> String {
        let window = Duration::from_secs(self.plan.window_secs);
        let rotated = tokio::time::timeout(CALL_TIMEOUT, self.store.dedup().maintain(window)).await;
        let purged = tokio::time::timeout(
            CALL_TIMEOUT,
            self.store
                .retention()
                .purge_expired(window, Duration::from_secs(60), 5_000),
        )
        .await;
        format!("{rotated:?} purged {purged:?}")
    }

    /// Starts `process` again; what went wrong on the way, if anything.
    async fn restart(&self, process: usize) -> String {
        let failures = self
            .cluster
            .start_until(process, Instant::now() + RESTART_DEADLINE)
            .await;
        if failures.is_empty() {
            String::new()
        } else {
            format!(
                "restart: {} failed start(s), last: {}",
                failures.len(),
                failures.last().unwrap_or(&String::new())
            )
        }
    }
}

/// The database server running, every proxy passing with no latency, every paused process
/// continued, every process that is down started (each until it listens or the deadline).
pub async fn heal_all(cluster: &Cluster, infra: &Infra, pg: &Arc<PgServer>, history: &History) {
    if !pg.running() {
        if let Err(error) = pg.restart(Instant::now() + RESTART_DEADLINE).await {
            history.fault("note", "pg_restart", format!("{error:#}"));
        }
    }
    infra.heal().await;
    for process in cluster.paused() {
        cluster.resume(process);
    }
    let deadline = Instant::now() + RESTART_DEADLINE;
    for process in cluster.down() {
        let failures = cluster.start_until(process, deadline).await;
        if !failures.is_empty() {
            history.fault(
                "note",
                "restart",
                format!("{}: {}", LAYOUT[process].name, failures.join("; ")),
            );
        }
    }
}

/// Until `stop`: every second, processes that exited although nobody stopped them are
/// recorded as crashes and started again.
pub async fn watch_crashes(nemesis: Arc<Nemesis>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        for (process, status) in nemesis.cluster.exited_by_themselves() {
            let what = format!("{} exited by itself: {status}", LAYOUT[process].name);
            nemesis.history.fault("note", "crash", what.clone());
            nemesis.crashes.lock().expect("crashes").push(what);
            let restart = nemesis.restart(process).await;
            if !restart.is_empty() {
                nemesis.history.fault("note", "crash", restart);
            }
        }
    }
}
