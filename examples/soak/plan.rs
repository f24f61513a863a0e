//! The run's plan, drawn from the seed before anything starts: the event stream (what the
//! sender posts, to which ingress, when) and the fault schedule (what the nemesis does, when).
//! The same seed and parameters give the same plan, which is what makes a run replayable.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::cluster::{Lane, Role, Tuning, INGRESS_COUNT, LAYOUT};

/// Stripe event types the stream mixes (the handler does not care; the sink sees them).
const EVENT_TYPES: [&str; 4] = [
    "invoice.paid",
    "customer.subscription.updated",
    "charge.succeeded",
    "payment_intent.succeeded",
];

/// Share of events sent twice or more later (Stripe's duplicate deliveries and resends).
const DUPLICATED: f64 = 0.25;
/// Share of changes delivered as a snapshot event and its thin event (one change, two ids).
const THIN_PAIRS: f64 = 0.12;
/// Share of events whose `created` is hours in the past (retries of old events).
const OLD_EVENTS: f64 = 0.10;
/// Faults start no sooner than this into the run (the processes have just started).
const FIRST_FAULT_MS: u64 = 3_000;

/// Everything the run does that is chosen, not observed.
#[derive(Debug, Serialize)]
pub struct Plan {
    pub seed: u64,
    pub seconds: u64,
    pub rate: u32,
    pub window_secs: u64,
    /// Events a second sent to the SQS lane's ingress (at most `rate`; the rest split evenly
    /// between the database queue's and RabbitMQ's).
    pub sqs_rate: u32,
    pub events: Vec<PlannedEvent>,
    /// Sorted by `at_ms`.
    pub posts: Vec<Post>,
    /// Sorted by `at_ms`.
    pub faults: Vec<Fault>,
}

/// One change, as Stripe would report it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedEvent {
    /// The snapshot event's id: the dedup key of the change, whichever shape delivers it.
    pub key: String,
    pub event_type: &'static str,
    /// Seconds added to the run's start for `created` (negative: hours-old events).
    pub created_offset_secs: i64,
}

/// Which of Stripe's shapes a post carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// The snapshot event (`"object": "event"`), keyed by its own id.
    Snapshot,
    /// The thin event beside it (`"object": "v2.core.event"`), keyed by `snapshot_event`.
    Thin,
}

/// One delivery the sender makes (and retries until it is answered 2xx).
#[derive(Debug, Clone, Serialize)]
pub struct Post {
    pub at_ms: u64,
    /// Index into [`Plan::events`].
    pub event: usize,
    pub shape: Shape,
    /// Which ingress process (0..[`INGRESS_COUNT`]): decides the transport.
    pub ingress: usize,
    /// 0 for the first delivery of this shape, then 1, 2, … for duplicates.
    pub copy: u32,
}

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
    /// The current dedup generation sealed now (`Store::seal_dedup_generation`).
    Seal,
    /// A retention pass (generations sealed longer than the window ago emptied, outbox purged).
    Retention,
    /// SIGTERM, then a restart with another configuration.
    Reload { process: usize, tuning: Tuning },
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
            FaultKind::Cut { .. } => "cut",
            FaultKind::Latency { .. } => "latency",
            FaultKind::Seal => "seal",
            FaultKind::Retention => "retention",
            FaultKind::Reload { .. } => "reload",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: FaultKind,
}

impl Plan {
    pub fn generate(seed: u64, seconds: u64, rate: u32, window_secs: u64, sqs_rate: u32) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let sqs_share = f64::from(sqs_rate.min(rate)) / f64::from(rate.max(1));
        let (events, posts) = event_stream(&mut rng, seed, seconds, rate, sqs_share);
        let faults = fault_schedule(&mut rng, seconds);
        Plan {
            seed,
            seconds,
            rate,
            window_secs,
            sqs_rate,
            events,
            posts,
            faults,
        }
    }
}

fn event_stream(
    rng: &mut StdRng,
    seed: u64,
    seconds: u64,
    rate: u32,
    sqs_share: f64,
) -> (Vec<PlannedEvent>, Vec<Post>) {
    let (sqs, others): (Vec<usize>, Vec<usize>) =
        (0..INGRESS_COUNT).partition(|i| LAYOUT[*i].lane == Lane::Sqs);
    let ingress = |rng: &mut StdRng| {
        let lane = if rng.gen_bool(sqs_share) {
            &sqs
        } else {
            &others
        };
        lane[rng.gen_range(0..lane.len())]
    };
    let end_ms = seconds * 1_000;
    let count = seconds * u64::from(rate);
    let mut events = Vec::with_capacity(count as usize);
    let mut posts = Vec::new();
    for i in 0..count {
        let index = events.len();
        let base = i * 1_000 / u64::from(rate.max(1));
        let created_offset_secs = if rng.gen_bool(OLD_EVENTS) {
            -rng.gen_range(3_600..48 * 3_600)
        } else {
            (base / 1_000) as i64
        };
        events.push(PlannedEvent {
            key: format!("evt_soak{seed:x}_{i:07}"),
            event_type: EVENT_TYPES[rng.gen_range(0..EVENT_TYPES.len())],
            created_offset_secs,
        });
        // Reordering: each post leaves up to 1.5 s after its turn.
        let post = |rng: &mut StdRng, at_ms: u64, shape, copy| Post {
            at_ms: at_ms + rng.gen_range(0..1_500),
            event: index,
            shape,
            ingress: ingress(rng),
            copy,
        };
        let mut shapes = vec![Shape::Snapshot];
        posts.push(post(rng, base, Shape::Snapshot, 0));
        if rng.gen_bool(THIN_PAIRS) {
            shapes.push(Shape::Thin);
            let thin_at = (base + rng.gen_range(0..6_000)).saturating_sub(3_000);
            posts.push(post(rng, thin_at, Shape::Thin, 0));
        }
        if rng.gen_bool(DUPLICATED) {
            for copy in 1..=rng.gen_range(1..=3u32) {
                let shape = *shapes.choose(rng).expect("one shape at least");
                let at = base + rng.gen_range(100..25_000);
                posts.push(post(rng, at, shape, copy));
            }
        }
    }
    posts.retain(|p| p.at_ms < end_ms);
    posts.sort_by_key(|p| p.at_ms);
    (events, posts)
}

/// One fault every 2–6 s, none on a process or proxy another fault still holds.
fn fault_schedule(rng: &mut StdRng, seconds: u64) -> Vec<Fault> {
    let end_ms = seconds * 1_000;
    let mut busy = Busy::default();
    let mut faults = Vec::new();
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
    faults
}

fn draw_fault(rng: &mut StdRng, seconds: u64) -> FaultKind {
    let process = rng.gen_range(0..LAYOUT.len());
    let dependency = DEPENDENCIES[rng.gen_range(0..DEPENDENCIES.len())];
    // Weights: kill 3, pause 2, black hole 2, refuse 2, cut 2, latency 1, seal 2, retention 1,
    // reload 2.
    match rng.gen_range(0..17) {
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
        _ => FaultKind::Reload {
            process,
            tuning: Tuning::draw(rng),
        },
    }
}

/// Until when each process and each proxy is held by a fault.
#[derive(Default)]
struct Busy {
    processes: std::collections::HashMap<usize, u64>,
    proxies: std::collections::HashMap<Dependency, u64>,
}

impl Busy {
    fn process_free(&self, process: usize, at: u64) -> bool {
        self.processes
            .get(&process)
            .is_none_or(|until| *until <= at)
    }

    fn proxy_free(&self, dependency: Dependency, at: u64) -> bool {
        self.proxies
            .get(&dependency)
            .is_none_or(|until| *until <= at)
    }

    /// Takes what `kind` holds from `at` if it is all free; whether it was.
    fn claim(&mut self, at: u64, kind: &FaultKind) -> bool {
        // A restart may wait for its dependencies: a few seconds beyond the fault itself.
        const SETTLE_MS: u64 = 2_000;
        match kind {
            FaultKind::Kill { process, down_ms } => self.hold(at, *process, down_ms + SETTLE_MS),
            FaultKind::Pause { process, ms } => self.hold(at, *process, *ms),
            FaultKind::Reload { process, .. } => self.hold(at, *process, 15_000),
            FaultKind::Partition { dependency, ms, .. } => self.hold_proxy(at, *dependency, *ms),
            FaultKind::Cut { dependency } => self.hold_proxy(at, *dependency, 500),
            FaultKind::Latency {
                dependency,
                ms,
                backlog_ms,
                ..
            } => {
                let consumers: Vec<usize> = consumer_processes().collect();
                if !consumers.iter().all(|p| self.process_free(*p, at))
                    || !self.proxy_free(*dependency, at)
                {
                    return false;
                }
                for p in consumers {
                    self.processes.insert(p, at + backlog_ms);
                }
                self.proxies.insert(*dependency, at + backlog_ms + ms);
                true
            }
            FaultKind::Seal | FaultKind::Retention => true,
        }
    }

    fn hold(&mut self, at: u64, process: usize, ms: u64) -> bool {
        if !self.process_free(process, at) {
            return false;
        }
        self.processes.insert(process, at + ms);
        true
    }

    fn hold_proxy(&mut self, at: u64, dependency: Dependency, ms: u64) -> bool {
        if !self.proxy_free(dependency, at) {
            return false;
        }
        self.proxies.insert(dependency, at + ms);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn json(plan: &Plan) -> String {
        serde_json::to_string(plan).expect("a plan serialises")
    }

    #[test]
    fn a_seed_gives_one_plan_and_another_seed_another() {
        let plan = Plan::generate(42, 120, 30, 60, 4);
        assert_eq!(json(&plan), json(&Plan::generate(42, 120, 30, 60, 4)));
        assert_ne!(json(&plan), json(&Plan::generate(43, 120, 30, 60, 4)));
        assert!(!plan.faults.is_empty());
    }

    #[test]
    fn the_stream_mixes_duplicates_thin_events_and_old_events_in_order() {
        let plan = Plan::generate(7, 300, 30, 60, 6);
        assert_eq!(plan.events.len(), 9_000);
        assert!(plan.posts.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(plan.posts.iter().all(|p| p.at_ms < 300_000));
        let copies = plan.posts.iter().filter(|p| p.copy > 0).count();
        let thin = plan
            .posts
            .iter()
            .filter(|p| p.shape == Shape::Thin && p.copy == 0)
            .count();
        let old = plan
            .events
            .iter()
            .filter(|e| e.created_offset_secs < 0)
            .count();
        for (what, n, share) in [
            ("duplicates", copies, DUPLICATED * 2.0),
            ("thin events", thin, THIN_PAIRS),
            ("old events", old, OLD_EVENTS),
        ] {
            let expected = share * 9_000.0;
            assert!(
                (n as f64 - expected).abs() < expected * 0.2,
                "{what}: {n}, expected about {expected}"
            );
        }
        let to_sqs = plan.posts.iter().filter(|p| p.ingress >= 4).count() as f64;
        let share = to_sqs / plan.posts.len() as f64;
        assert!((0.17..0.23).contains(&share), "SQS share {share}");
        // Every thin post has its snapshot event posted too: one change, two shapes (except at
        // the very end, where the snapshot's turn may fall after the run).
        let thin_posts = plan.posts.iter().filter(|p| p.shape == Shape::Thin);
        for thin in thin_posts.filter(|p| p.at_ms < 295_000) {
            assert!(plan
                .posts
                .iter()
                .any(|p| p.event == thin.event && p.shape == Shape::Snapshot));
        }
    }

    #[test]
    fn faults_come_every_few_seconds_and_pauses_outlast_every_lease() {
        let plan = Plan::generate(9, 600, 10, 60, 4);
        assert!(plan.faults.windows(2).all(|w| {
            let gap = w[1].at_ms - w[0].at_ms;
            (2_000..=4 * 6_000).contains(&gap)
        }));
        let mut kinds = std::collections::HashSet::new();
        for fault in &plan.faults {
            kinds.insert(fault.kind.name());
            match fault.kind {
                FaultKind::Pause { ms, .. } => assert!(ms > Tuning::MAX_LEASE_SECS * 1_000),
                FaultKind::Latency { latency_ms, ms, .. } => {
                    assert!((200..2_000).contains(&latency_ms));
                    assert!((5_000..40_000).contains(&ms));
                }
                _ => {}
            }
        }
        assert_eq!(
            kinds.len(),
            9,
            "every kind of fault in ten minutes: {kinds:?}"
        );
    }
}
