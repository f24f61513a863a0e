//! The processes under test: the service's binary once per role and transport ([`LAYOUT`]),
//! each started on port 0 and reached through the run's fault proxies, and what the nemesis
//! does to them (SIGKILL, SIGSTOP/SIGCONT, SIGTERM and a restart with another configuration).
//! Every child is killed when the [`Cluster`] is dropped, whatever happened before.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

/// What a process runs (its subcommand).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Ingest,
    Consume,
    Relay,
    /// A synchronous API behind the Idempotency-Key layer (`soak_service api`).
    Api,
}

/// Which transport a process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    Database,
    Rabbitmq,
    Sqs,
}

pub struct ProcessSpec {
    pub name: &'static str,
    pub role: Role,
    pub lane: Lane,
}

const fn spec(name: &'static str, role: Role, lane: Lane) -> ProcessSpec {
    ProcessSpec { name, role, lane }
}

/// Two ingress and two consumers per transport, two API processes behind the Idempotency-Key
/// layer, two relays (relays and the API use the database transport: they never touch a
/// queue). The ingress processes come first, in the order the plan's `ingress` indexes them;
/// a relay comes last (the first process started, it applies the migrations).
pub const LAYOUT: [ProcessSpec; 16] = [
    spec("ingest-db-0", Role::Ingest, Lane::Database),
    spec("ingest-db-1", Role::Ingest, Lane::Database),
    spec("ingest-rabbit-0", Role::Ingest, Lane::Rabbitmq),
    spec("ingest-rabbit-1", Role::Ingest, Lane::Rabbitmq),
    spec("ingest-sqs-0", Role::Ingest, Lane::Sqs),
    spec("ingest-sqs-1", Role::Ingest, Lane::Sqs),
    spec("consume-db-0", Role::Consume, Lane::Database),
    spec("consume-db-1", Role::Consume, Lane::Database),
    spec("consume-rabbit-0", Role::Consume, Lane::Rabbitmq),
    spec("consume-rabbit-1", Role::Consume, Lane::Rabbitmq),
    spec("consume-sqs-0", Role::Consume, Lane::Sqs),
    spec("consume-sqs-1", Role::Consume, Lane::Sqs),
    spec("api-0", Role::Api, Lane::Database),
    spec("api-1", Role::Api, Lane::Database),
    spec("relay-0", Role::Relay, Lane::Database),
    spec("relay-1", Role::Relay, Lane::Database),
];

/// The ingress processes are `LAYOUT[0..INGRESS_COUNT]`.
pub const INGRESS_COUNT: usize = 6;

/// The API processes in [`LAYOUT`], in order (the plan's `ApiCall::process` indexes this).
pub const API_PROCESSES: [usize; 2] = [12, 13];

/// The settings a reload changes (a consumer's or a relay's batch, lease and parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuning {
    pub batch_size: u32,
    pub lease_secs: u64,
    pub workers: u32,
}

impl Tuning {
    /// What every process starts with; `workers` is the run's draw ([`Tuning::draw_workers`]).
    pub fn start(workers: u32) -> Tuning {
        Tuning {
            batch_size: 64,
            lease_secs: 5,
            workers,
        }
    }
    /// The longest lease [`Tuning::draw`] sets: a pause is longer.
    pub const MAX_LEASE_SECS: u64 = 8;

    pub fn draw(rng: &mut impl Rng) -> Tuning {
        Tuning {
            batch_size: *[16, 64, 256].choose(rng).expect("non-empty"),
            lease_secs: *[3, 5, Self::MAX_LEASE_SECS].choose(rng).expect("non-empty"),
            workers: Self::draw_workers(rng),
        }
    }

    /// A consumer's workers (`consumer.workers`), 1–4: 4 (the default) half the time, where two
    /// batches of one process contend for the same rows and locks; 1, 2 or 3 otherwise.
    pub fn draw_workers(rng: &mut impl Rng) -> u32 {
        *[1, 2, 3, 4, 4, 4].choose(rng).expect("non-empty")
    }

    /// The variables that set it for a process of `role`.
    fn env(&self, role: Role) -> Vec<(String, String)> {
        let section = match role {
            Role::Relay => "OUTBOX",
            Role::Ingest | Role::Consume => "CONSUMER",
            // The API reads none of them: a reload is a restart.
            Role::Api => return Vec::new(),
        };
        let parallel = match role {
            Role::Relay => ("CONCURRENCY", self.workers * 8),
            Role::Ingest | Role::Consume | Role::Api => ("WORKERS", self.workers),
        };
        [
            ("BATCH_SIZE", self.batch_size.to_string()),
            ("LEASE", format!("{}s", self.lease_secs)),
            (parallel.0, parallel.1.to_string()),
        ]
        .into_iter()
        .map(|(key, value)| (format!("DEDUP_{section}__{key}"), value))
        .collect()
    }
}

/// How long a start may take until the listening line (migrations included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a SIGTERM may take before SIGKILL (the service's grace, plus a margin).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// One process slot: the child running now (if any), and how.
struct Slot {
    child: Option<Child>,
    tuning: Tuning,
    paused: bool,
    starts: u32,
    /// A start or a stop is under way: nobody else starts it, and its exit is no crash.
    busy: bool,
}

/// Why a start failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("spawning {0}: {1}")]
    Spawn(String, #[source] std::io::Error),
    #[error("{0} exited before listening (see its log)")]
    ExitedEarly(String),
    #[error("{0} printed {1:?} instead of its listening line")]
    Unexpected(String, String),
    #[error("{0} did not listen within {1:?}")]
    TimedOut(String, Duration),
    #[error("{0} is running or being started or stopped already")]
    Busy(String),
}

pub struct Cluster {
    service: PathBuf,
    /// Variables every process gets, and per lane.
    common_env: Vec<(String, String)>,
    lane_env: Vec<(Lane, Vec<(String, String)>)>,
    log_dir: PathBuf,
    slots: Vec<Mutex<Slot>>,
    /// Where each process listens now (`None` while it is down), by its index in [`LAYOUT`]:
    /// for the sender (the ingress processes) and the API client.
    pub addresses: Arc<RwLock<Vec<Option<SocketAddr>>>>,
}

impl Cluster {
    pub fn new(
        workers: u32,
        service: PathBuf,
        common_env: Vec<(String, String)>,
        lane_env: Vec<(Lane, Vec<(String, String)>)>,
        log_dir: PathBuf,
    ) -> Self {
        let slots = LAYOUT
            .iter()
            .map(|_| {
                Mutex::new(Slot {
                    child: None,
                    tuning: Tuning::start(workers),
                    paused: false,
                    starts: 0,
                    busy: false,
                })
            })
            .collect();
        Cluster {
            service,
            common_env,
            lane_env,
            log_dir,
            slots,
            addresses: Arc::new(RwLock::new(vec![None; LAYOUT.len()])),
        }
    }

    fn slot(&self, process: usize) -> std::sync::MutexGuard<'_, Slot> {
        self.slots[process]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `process` and waits for its listening line; [`StartError::Busy`] if it runs, or
    /// another task starts or stops it.
    pub async fn start(&self, process: usize) -> Result<(), StartError> {
        {
            let mut slot = self.slot(process);
            if slot.busy || slot.child.is_some() {
                return Err(StartError::Busy(LAYOUT[process].name.into()));
            }
            slot.busy = true;
        }
        let started = self.spawn_and_listen(process).await;
        self.slot(process).busy = false;
        started
    }

    async fn spawn_and_listen(&self, process: usize) -> Result<(), StartError> {
        let spec = &LAYOUT[process];
        let log_path = self.log_dir.join(format!("{}.log", spec.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| StartError::Spawn(spec.name.into(), e))?;
        let mut command = Command::new(&self.service);
        let subcommand = match spec.role {
            Role::Ingest => "ingest",
            Role::Consume => "consume",
            Role::Relay => "relay",
            Role::Api => "api",
        };
        command
            .arg(subcommand)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.common_env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        for (lane, env) in &self.lane_env {
            if *lane == spec.lane {
                command.envs(env.iter().cloned());
            }
        }
        // If the driver itself is SIGKILLed, no guard runs: the kernel kills the children then.
        // (The signal follows the thread that spawned them: a runtime worker, alive as long as
        // the driver's runtime.)
        // SAFETY: prctl(2) is async-signal-safe, and this closure allocates nothing.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let stdout = {
            let mut slot = self.slot(process);
            slot.starts += 1;
            command
                .envs(slot.tuning.env(spec.role))
                .env("SOAK_PROCESS", format!("{}#{}", spec.name, slot.starts));
            let mut child = command
                .spawn()
                .map_err(|e| StartError::Spawn(spec.name.into(), e))?;
            let stdout = child.stdout.take().expect("piped stdout");
            slot.child = Some(child);
            slot.paused = false;
            stdout
        };

        let (line_tx, line_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = line_tx.send(lines.next().and_then(Result::ok));
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match tokio::time::timeout(START_TIMEOUT, line_rx).await {
            Ok(Ok(Some(line))) => line,
            Ok(_) => {
                self.reap(process);
                return Err(StartError::ExitedEarly(spec.name.into()));
            }
            Err(_) => {
                self.kill(process);
                return Err(StartError::TimedOut(spec.name.into(), START_TIMEOUT));
            }
        };
        let Some(addr) = line
            .strip_prefix("dedup-worker listening on http://")
            .and_then(|a| a.parse().ok())
        else {
            self.kill(process);
            return Err(StartError::Unexpected(spec.name.into(), line));
        };
        self.addresses.write().expect("addresses lock")[process] = Some(addr);
        Ok(())
    }

    /// Starts `process`, again and again (a dependency may be down) until it listens or
    /// `deadline` passes; the failures seen on the way.
    pub async fn start_until(&self, process: usize, deadline: Instant) -> Vec<String> {
        let mut failures = Vec::new();
        loop {
            match self.start(process).await {
                Ok(()) | Err(StartError::Busy(_)) => return failures,
                Err(error) => failures.push(error.to_string()),
            }
            if Instant::now() >= deadline {
                return failures;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn forget_address(&self, process: usize) {
        self.addresses.write().expect("addresses lock")[process] = None;
    }

    /// SIGKILL (after SIGCONT if paused) and reaped; whether a process was running.
    pub fn kill(&self, process: usize) -> bool {
        self.forget_address(process);
        let mut slot = self.slot(process);
        slot.paused = false;
        let Some(mut child) = slot.child.take() else {
            return false;
        };
        signal(&child, libc::SIGCONT);
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    /// Reaps a child that exited by itself.
    fn reap(&self, process: usize) {
        self.forget_address(process);
        if let Some(mut child) = self.slot(process).child.take() {
            let _ = child.wait();
        }
    }

    /// SIGSTOP; whether a process was running.
    pub fn pause(&self, process: usize) -> bool {
        let mut slot = self.slot(process);
        let Some(child) = &slot.child else {
            return false;
        };
        signal(child, libc::SIGSTOP);
        slot.paused = true;
        true
    }

    pub fn resume(&self, process: usize) {
        let mut slot = self.slot(process);
        if let Some(child) = &slot.child {
            signal(child, libc::SIGCONT);
        }
        slot.paused = false;
    }

    /// SIGTERM, polled until it exits or [`STOP_TIMEOUT`], then SIGKILL; whether it exited on
    /// its own.
    pub async fn stop(&self, process: usize) -> bool {
        self.forget_address(process);
        {
            let mut slot = self.slot(process);
            if slot.busy {
                return false;
            }
            let Some(child) = &slot.child else {
                return true;
            };
            signal(child, libc::SIGCONT);
            signal(child, libc::SIGTERM);
            slot.busy = true;
        }
        let stopped = self.wait_stopped(process).await;
        self.slot(process).busy = false;
        stopped
    }

    async fn wait_stopped(&self, process: usize) -> bool {
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            let exited = {
                let mut slot = self.slot(process);
                match slot.child.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(_))) | None => {
                        slot.child = None;
                        true
                    }
                    _ => false,
                }
            };
            if exited {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill(process);
        false
    }

    pub fn set_tuning(&self, process: usize, tuning: Tuning) {
        self.slot(process).tuning = tuning;
    }

    /// Processes whose child exited although nobody stopped it (reaped now): crashes.
    pub fn exited_by_themselves(&self) -> Vec<(usize, String)> {
        let mut exited = Vec::new();
        for process in 0..LAYOUT.len() {
            let status = {
                let mut slot = self.slot(process);
                if slot.busy {
                    continue;
                }
                match slot.child.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(status))) => {
                        slot.child = None;
                        Some(status.to_string())
                    }
                    _ => None,
                }
            };
            if let Some(status) = status {
                self.forget_address(process);
                exited.push((process, status));
            }
        }
        exited
    }

    /// Processes with no child running (killed, crashed, or failed to start).
    pub fn down(&self) -> Vec<usize> {
        (0..LAYOUT.len())
            .filter(|p| self.slot(*p).child.is_none())
            .collect()
    }

    pub fn paused(&self) -> Vec<usize> {
        (0..LAYOUT.len()).filter(|p| self.slot(*p).paused).collect()
    }

    /// Each running process's peak resident memory (`VmHWM`, kB) since it started: a process
    /// that grows without bound under faults shows here.
    pub fn peak_memory_kb(&self) -> Vec<(&'static str, u64)> {
        (0..LAYOUT.len())
            .filter_map(|p| {
                let pid = self.slot(p).child.as_ref()?.id();
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let kb = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()?;
                Some((LAYOUT[p].name, kb))
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for process in 0..LAYOUT.len() {
            self.kill(process);
        }
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on a child we spawned and have not reaped (its pid is still ours).
        unsafe {
            libc::kill(pid, signal);
        }
    }
}
