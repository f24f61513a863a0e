//! The run's plan, drawn from the seed before anything starts: the run's settings (the
//! database's default isolation, the consumers' workers), the event stream (what the sender
//! posts, to which ingress, when), what the direct producer puts on the queues itself (a change's
//! second channel, a foreign producer's messages: [`crate::workload`]) and the fault schedule
//! (what the nemesis does, when: [`crate::faults`]). The same seed and parameters give the same
//! plan, which is what makes a run replayable.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::api::ApiCall;
use crate::cluster::{Lane, Tuning, INGRESS_COUNT, LAYOUT};
pub use crate::faults::{
    consumer_processes, Dependency, Fault, FaultKind, Partition, DEPENDENCIES,
};
use crate::workload::{self, Direct, DirectKind, Twin};

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
/// Share of changes sent on two channels at the same moment (a webhook and an EventBridge copy
/// on SQS, or a thin event beside it: [`Twin`]).
pub const TWO_CHANNELS: f64 = 0.06;

/// The run's PostgreSQL's `default_transaction_isolation`: the pipeline must be correct under
/// each, whatever a connection's first statement assumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl Isolation {
    pub const ALL: [Isolation; 3] = [
        Isolation::ReadCommitted,
        Isolation::RepeatableRead,
        Isolation::Serializable,
    ];

    /// As `postgresql.conf` spells it.
    pub fn setting(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read committed",
            Isolation::RepeatableRead => "repeatable read",
            Isolation::Serializable => "serializable",
        }
    }
}

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
    /// The PostgreSQL server's `default_transaction_isolation` for the run.
    pub isolation: Isolation,
    /// Every consumer's and ingress's `consumer.workers` at the start (a reload draws again).
    pub workers: u32,
    pub events: Vec<PlannedEvent>,
    /// Sorted by `at_ms`.
    pub posts: Vec<Post>,
    /// What the driver puts on the queues itself, as other producers would; sorted by `at_ms`.
    pub direct: Vec<Direct>,
    /// Sorted by `at_ms`.
    pub faults: Vec<Fault>,
    /// The API clients' calls ([`crate::api`]), sorted by `at_ms`; none until [`Plan::with_api`].
    pub api: Vec<ApiCall>,
    /// Their rate, calls a second.
    pub api_rate: u32,
}

/// One change, as Stripe would report it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedEvent {
    /// The snapshot event's id: the dedup key of the change, whichever shape delivers it.
    pub key: String,
    pub event_type: &'static str,
    /// Seconds added to the run's start for `created` (negative: hours-old events).
    pub created_offset_secs: i64,
    /// The second channel the change is sent on at the moment of its first webhook, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub twin: Option<Twin>,
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
    /// Sent at the same moment as the change's other channel (no reordering delay).
    pub at_once: bool,
}

impl Plan {
    pub fn generate(seed: u64, seconds: u64, rate: u32, window_secs: u64, sqs_rate: u32) -> Plan {
        // The run's settings from a stream of their own, so a change of rate or length keeps
        // them (and they keep the stream).
        let mut settings = StdRng::seed_from_u64(seed ^ 0x5eed_5e77_1265);
        let isolation = *Isolation::ALL.choose(&mut settings).expect("non-empty");
        let workers = Tuning::draw_workers(&mut settings);
        let mut rng = StdRng::seed_from_u64(seed);
        let sqs_share = f64::from(sqs_rate.min(rate)) / f64::from(rate.max(1));
        let (events, posts, mut direct) = event_stream(&mut rng, seed, seconds, rate, sqs_share);
        direct.extend(workload::foreign_stream(&mut rng, seed, seconds, rate));
        direct.retain(|d| d.at_ms < seconds * 1_000);
        direct.sort_by_key(|d| d.at_ms);
        let faults = crate::faults::fault_schedule(&mut rng, seconds);
        Plan {
            seed,
            seconds,
            rate,
            window_secs,
            sqs_rate,
            isolation,
            workers,
            events,
            posts,
            direct,
            faults,
            api: Vec::new(),
            api_rate: 0,
        }
    }

    /// With `api_rate` API calls a second (from a stream of their own: the rest of the plan
    /// stays as it is).
    pub fn with_api(mut self, api_rate: u32) -> Plan {
        self.api = crate::api::draw_calls(self.seed, self.seconds, api_rate);
        self.api_rate = api_rate;
        self
    }
}

fn event_stream(
    rng: &mut StdRng,
    seed: u64,
    seconds: u64,
    rate: u32,
    sqs_share: f64,
) -> (Vec<PlannedEvent>, Vec<Post>, Vec<Direct>) {
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
    let mut direct = Vec::new();
    for i in 0..count {
        let index = events.len();
        let base = i * 1_000 / u64::from(rate.max(1));
        let created_offset_secs = if rng.gen_bool(OLD_EVENTS) {
            -rng.gen_range(3_600..48 * 3_600)
        } else {
            (base / 1_000) as i64
        };
        let key = format!("evt_soak{seed:x}_{i:07}");
        let twin = rng.gen_bool(TWO_CHANNELS).then(|| Twin::draw(rng));
        events.push(PlannedEvent {
            key: key.clone(),
            event_type: EVENT_TYPES[rng.gen_range(0..EVENT_TYPES.len())],
            created_offset_secs,
            twin,
        });
        // Reordering: each post leaves up to 1.5 s after its turn.
        let post = |rng: &mut StdRng, at_ms: u64, shape, copy| Post {
            at_ms: at_ms + rng.gen_range(0..1_500),
            event: index,
            shape,
            ingress: ingress(rng),
            copy,
            at_once: false,
        };
        let mut shapes = vec![Shape::Snapshot];
        let first = match twin {
            // Both channels at `base` exactly: the two deliveries race through the pipeline.
            Some(twin) => {
                let snapshot = Post {
                    at_ms: base,
                    at_once: true,
                    ..post(rng, base, Shape::Snapshot, 0)
                };
                match twin {
                    Twin::ThinWebhook => {
                        shapes.push(Shape::Thin);
                        posts.push(Post {
                            at_ms: base,
                            at_once: true,
                            ..post(rng, base, Shape::Thin, 0)
                        });
                    }
                    Twin::EventBridge => direct.push(Direct {
                        at_ms: base,
                        key: key.clone(),
                        lane: Lane::Sqs,
                        kind: DirectKind::EventBridge,
                        event: Some(index),
                        copy: 0,
                    }),
                    // Half on the queue the webhook goes to (the two may share a batch), half
                    // on another (two consumers' batches at once, each in its transaction).
                    Twin::ThinOwnId => direct.push(Direct {
                        at_ms: base,
                        key: key.clone(),
                        lane: other_lane(rng, LAYOUT[snapshot.ingress].lane),
                        kind: DirectKind::ThinOwnId,
                        event: Some(index),
                        copy: 0,
                    }),
                }
                snapshot
            }
            None => post(rng, base, Shape::Snapshot, 0),
        };
        posts.push(first);
        if twin.is_none() && rng.gen_bool(THIN_PAIRS) {
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
    (events, posts, direct)
}

/// `lane` half the time; else the database queue or RabbitMQ, whichever it is not (SQS is
/// kept to its share: the emulator's capacity).
fn other_lane(rng: &mut StdRng, lane: Lane) -> Lane {
    match (rng.gen_bool(0.5), lane) {
        (true, _) => lane,
        (false, Lane::Database) => Lane::Rabbitmq,
        (false, Lane::Rabbitmq) => Lane::Database,
        (false, Lane::Sqs) => *[Lane::Database, Lane::Rabbitmq].choose(rng).expect("two"),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
