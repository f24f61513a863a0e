//! The fault schedule, drawn from the seed with the rest of the plan: what the nemesis does and
//! when. One fault every 2–6 s, none on a process, a proxy or the database server that another
//! fault holds at that time; every run of 20 s or more gets at least one crash of PostgreSQL and
//! one duplicating SQS receive (placed first, in the middle third), so a short soak (CI's
//! minute) reaches both.

use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;

use crate::cluster::{Role, Tuning, LAYOUT};

/// Faults start no sooner than this into the run (the processes have just started).
const FIRST_FAULT_MS: u64 = 3_000;
/// A run at least this long gets every fault in [`REQUIRED`].
const REQUIRED_FROM_SECONDS: u64 = 20;

/// A dependency the processes reach through a fault proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dependency {
    Postgres,
    Rabbitmq,
    Sqs,
    Sink,
}

pub const DEPENDENCIES: [Dependency; 4] = [
    Dependency::Postgres,
    Dependency::Rabbitmq,
    Dependency::Sqs,
    Dependency::Sink,
];

/// What a fault proxy does during a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Partition {
    BlackHole,
    Refuse,
    /// Requests reach the dependency and its answers are lost (issue 40: a mark, a batch, an
    /// enqueue committed whose answer never came, so the process retries work that happened).
    LoseAnswers,
}

/// One thing the nemesis does.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL, then a restart after `down_ms`.
    Kill { process: usize, down_ms: u64 },
    /// SIGSTOP for longer than any lease, then SIGCONT.
    Pause { process: usize, ms: u64 },
    /// The dependency's proxy black-holes or refuses for `ms`.
    Partition {
        dependency: Dependency,
        mode: Partition,
        ms: u64,
    },
    /// Every open connection to the dependency reset once.
    Cut { dependency: Dependency },
    /// Every consumer paused for `backlog_ms` (a backlog builds), then every call to the
    /// dependency `latency_ms` late each way for `ms`.
    Latency {
        dependency: Dependency,
        latency_ms: u64,
        ms: u64,
        backlog_ms: u64,
    },
    /// The current dedup generation sealed now (`store.dedup().seal`).
    Seal,
    /// A retention pass (generations sealed longer than the window ago emptied, outbox purged).
    Retention,
    /// SIGTERM, then a restart with another configuration.
    Reload { process: usize, tuning: Tuning },
    /// The run's PostgreSQL server SIGKILLed (postmaster and backends: the database host
    /// crashing), started again after `down_ms` (crash recovery from its WAL).
    PgCrash { down_ms: u64 },
    /// For `ms`, one in `one_in` of the messages each `ReceiveMessage` hands out is made visible
    /// again at once (its lease lost while it is handled), so another receive gets it too.
    SqsDuplicate { ms: u64, one_in: u32 },
}

impl FaultKind {
    /// The name counted in the summary's `faults`.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Kill { .. } => "kill",
            FaultKind::Pause { .. } => "pause",
            FaultKind::Partition {
                mode: Partition::BlackHole,
                ..
            } => "black_hole",
            FaultKind::Partition {
                mode: Partition::Refuse,
                ..
            } => "refuse",
            FaultKind::Partition {
                mode: Partition::LoseAnswers,
                ..
            } => "lose_answers",
            FaultKind::Cut { .. } => "cut",
            FaultKind::Latency { .. } => "latency",
            FaultKind::Seal => "seal",
            FaultKind::Retention => "retention",
            FaultKind::Reload { .. } => "reload",
            FaultKind::PgCrash { .. } => "pg_kill",
            FaultKind::SqsDuplicate { .. } => "sqs_duplicate",
        }
    }
}

/// Every fault name a schedule can hold.
pub const FAULT_NAMES: [&str; 12] = [
    "kill",
    "pause",
    "black_hole",
    "refuse",
    "lose_answers",
    "cut",
    "latency",
    "seal",
    "retention",
    "reload",
    "pg_kill",
    "sqs_duplicate",
];

#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: FaultKind,
}

/// The [`REQUIRED`] faults first, each at a drawn time in the run's middle third; then one
/// fault every 2–6 s, none on a target another fault holds at any time of its own (the held
/// times are intervals, so the draws keep clear of the required faults too).
pub fn fault_schedule(rng: &mut StdRng, seconds: u64) -> Vec<Fault> {
    let end_ms = seconds * 1_000;
    let mut busy = Busy::default();
    let mut faults = Vec::new();
    if seconds >= REQUIRED_FROM_SECONDS {
        for required in REQUIRED {
            let kind = required(rng);
            // Two of them hold PostgreSQL: another time if the first overlaps.
            for _ in 0..16 {
                let at_ms = rng.gen_range(end_ms / 3..end_ms * 2 / 3);
                if busy.claim(at_ms, &kind) {
                    faults.push(Fault { at_ms, kind });
                    break;
                }
            }
        }
    }
    let mut at_ms = FIRST_FAULT_MS;
    while at_ms < end_ms {
        for _ in 0..4 {
            let kind = draw_fault(rng, seconds);
            if busy.claim(at_ms, &kind) {
                faults.push(Fault { at_ms, kind });
                break;
            }
        }
        at_ms += rng.gen_range(2_000..6_000);
    }
    faults.sort_by_key(|f| f.at_ms);
    faults
}

/// The faults every run of [`REQUIRED_FROM_SECONDS`] or more has (drawn if the schedule lacks
/// them): the mechanisms only they reach.
const REQUIRED: [fn(&mut StdRng) -> FaultKind; 3] = [pg_crash, sqs_duplicate, pg_answers_lost];

fn pg_crash(rng: &mut StdRng) -> FaultKind {
    FaultKind::PgCrash {
        down_ms: rng.gen_range(500..5_000),
    }
}

/// PostgreSQL's answers lost for 2–6 s, in bursts (the nemesis), so the relays' marks
/// and the consumers' batches that committed are retried (the marks under the same claim: their
/// attempts and counts must be recorded once, `history_check`).
fn pg_answers_lost(rng: &mut StdRng) -> FaultKind {
    FaultKind::Partition {
        dependency: Dependency::Postgres,
        mode: Partition::LoseAnswers,
        ms: rng.gen_range(2_000..6_000),
    }
}

fn sqs_duplicate(rng: &mut StdRng) -> FaultKind {
    FaultKind::SqsDuplicate {
        ms: rng.gen_range(3_000..12_000),
        one_in: rng.gen_range(1..=3),
    }
}

fn draw_fault(rng: &mut StdRng, seconds: u64) -> FaultKind {
    let process = rng.gen_range(0..LAYOUT.len());
    let dependency = DEPENDENCIES[rng.gen_range(0..DEPENDENCIES.len())];
    // Weights: kill 3, pause 2, black hole 2, refuse 2, cut 2, latency 1, seal 2, retention 1,
    // reload 2, PostgreSQL crash 2, SQS duplicate 2.
    match rng.gen_range(0..21) {
        0..=2 => FaultKind::Kill {
            process,
            down_ms: rng.gen_range(200..3_000),
        },
        3..=4 => FaultKind::Pause {
            process,
            // Longer than the longest lease a reload sets (consumer and relay leases).
            ms: Tuning::MAX_LEASE_SECS * 1_000 + rng.gen_range(1_000..6_000),
        },
        5..=8 => FaultKind::Partition {
            dependency,
            mode: if rng.gen_bool(0.5) {
                Partition::BlackHole
            } else {
                Partition::Refuse
            },
            ms: rng.gen_range(2_000..10_000),
        },
        9..=10 => FaultKind::Cut { dependency },
        11 => FaultKind::Latency {
            dependency,
            latency_ms: rng.gen_range(200..2_000),
            // 10–40 s, but at most half the run: a short run still sees the system recover.
            ms: rng.gen_range(10_000..40_000).min(seconds * 500).max(5_000),
            backlog_ms: rng.gen_range(3_000..8_000),
        },
        12..=13 => FaultKind::Seal,
        14 => FaultKind::Retention,
        15..=16 => FaultKind::Reload {
            process,
            tuning: Tuning::draw(rng),
        },
        17..=18 => pg_crash(rng),
        _ => sqs_duplicate(rng),
    }
}

/// What a fault holds while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Target {
    Process(usize),
    /// A dependency's proxy; `Postgres` is also the server itself (a crash and a partition of
    /// it never overlap, so each fault's effect stays readable).
    Proxy(Dependency),
    /// The SQS duplicating proxy.
    SqsReceive,
}

/// The intervals each target is held for, so a fault placed later in time than others (the
/// required ones) never overlaps them either.
#[derive(Default)]
struct Busy {
    held: std::collections::HashMap<Target, Vec<(u64, u64)>>,
}

impl Busy {
    fn free(&self, target: Target, from: u64, until: u64) -> bool {
        self.held
            .get(&target)
            .is_none_or(|spans| spans.iter().all(|(a, b)| until <= *a || *b <= from))
    }

    /// Takes what `kind` holds from `at` if it is all free; whether it was.
    fn claim(&mut self, at: u64, kind: &FaultKind) -> bool {
        // A restart may wait for its dependencies: a few seconds beyond the fault itself.
        const SETTLE_MS: u64 = 2_000;
        let holds: Vec<(Target, u64)> = match kind {
            FaultKind::Kill { process, down_ms } => {
                vec![(Target::Process(*process), down_ms + SETTLE_MS)]
            }
            FaultKind::Pause { process, ms } => vec![(Target::Process(*process), *ms)],
            FaultKind::Reload { process, .. } => vec![(Target::Process(*process), 15_000)],
            // Lost answers slow the sink too (the nemesis).
            FaultKind::Partition {
                dependency,
                mode: Partition::LoseAnswers,
                ms,
            } => vec![
                (Target::Proxy(*dependency), *ms),
                (Target::Proxy(Dependency::Sink), *ms),
            ],
            FaultKind::Partition { dependency, ms, .. } => vec![(Target::Proxy(*dependency), *ms)],
            FaultKind::Cut { dependency } => vec![(Target::Proxy(*dependency), 500)],
            FaultKind::Latency {
                dependency,
                ms,
                backlog_ms,
                ..
            } => {
                let mut holds: Vec<(Target, u64)> = consumer_processes()
                    .map(|p| (Target::Process(p), *backlog_ms))
                    .collect();
                holds.push((Target::Proxy(*dependency), backlog_ms + ms));
                holds
            }
            // Crash recovery and the processes' reconnects take a few seconds more.
            FaultKind::PgCrash { down_ms } => {
                vec![(Target::Proxy(Dependency::Postgres), down_ms + 3 * SETTLE_MS)]
            }
            FaultKind::SqsDuplicate { ms, .. } => vec![(Target::SqsReceive, *ms)],
            FaultKind::Seal | FaultKind::Retention => Vec::new(),
        };
        if !holds.iter().all(|(t, ms)| self.free(*t, at, at + ms)) {
            return false;
        }
        for (target, ms) in holds {
            self.held.entry(target).or_default().push((at, at + ms));
        }
        true
    }
}

/// The indexes of the consumer processes in [`LAYOUT`].
pub fn consumer_processes() -> impl Iterator<Item = usize> {
    LAYOUT
        .iter()
        .enumerate()
        .filter(|(_, spec)| spec.role == Role::Consume)
        .map(|(i, _)| i)
}
