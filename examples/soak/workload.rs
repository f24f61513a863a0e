//! What the driver puts on the queues itself, beside the webhooks: a change's second channel
//! sent at the moment of its webhook, and a foreign producer's messages. Drawn into the plan
//! ([`foreign_stream`], and per change in `plan::event_stream`); carried out by
//! [`crate::producer`]. Also the counts of every kind of workload the summary prints.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use serde_json::json;

use crate::cluster::Lane;
use crate::plan::{Plan, Shape};

/// Foreign messages a second: one for every this many events of the rate (at least one).
const FOREIGN_EVERY: u32 = 20;
/// Share of foreign messages their producer publishes a second time (its own retry).
const FOREIGN_REPUBLISHED: f64 = 0.2;

/// The second channel of a change sent on two at once (Stripe sends both at the same moment
/// to anyone subscribed to both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Twin {
    /// An Amazon EventBridge envelope of the snapshot event on SQS (the SQS consumers run with
    /// `consumer.envelope = "eventbridge"`): keyed by its `detail`, the envelope's id an alias.
    EventBridge,
    /// The thin event, put on the webhook's queue under its own id (as a release before the
    /// thin-event keying published it, or another relay of Stripe's thin events): keyed by that
    /// id, the snapshot event's id an alias. Two keys for one change.
    ThinOwnId,
    /// The thin event as a second webhook, to any ingress (keyed by its snapshot event there).
    ThinWebhook,
}

impl Twin {
    pub fn draw(rng: &mut StdRng) -> Twin {
        match rng.gen_range(0..5) {
            0..=1 => Twin::EventBridge,
            2..=3 => Twin::ThinOwnId,
            _ => Twin::ThinWebhook,
        }
    }
}

/// What a direct message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectKind {
    /// [`Twin::EventBridge`].
    EventBridge,
    /// [`Twin::ThinOwnId`].
    ThinOwnId,
    /// A foreign message with the transport's id (AMQP `message_id`, the SQS attribute, the
    /// queue's column): keyed by it, handled once.
    ForeignId,
    /// A foreign message without one, whose body has an `id` (the default pointer): keyed by
    /// it, handled once.
    ForeignBodyId,
    /// A foreign message with no id anywhere: not an event; the promise is a dead letter
    /// ("no message id"), at least once (a second send cannot be told from a redelivery).
    ForeignNoId,
}

impl DirectKind {
    /// The name counted in the summary's `workload`, and written into the history.
    pub fn name(self) -> &'static str {
        match self {
            DirectKind::EventBridge => "two_channels_eventbridge",
            DirectKind::ThinOwnId => "two_channels_thin_own_id",
            DirectKind::ForeignId => "foreign_with_id",
            DirectKind::ForeignBodyId => "foreign_body_id",
            DirectKind::ForeignNoId => "foreign_no_id",
        }
    }
}

const ALL_DIRECT: [DirectKind; 5] = [
    DirectKind::EventBridge,
    DirectKind::ThinOwnId,
    DirectKind::ForeignId,
    DirectKind::ForeignBodyId,
    DirectKind::ForeignNoId,
];

/// Customers the webhook events' objects belong to (`data.object.customer`): the ordered sink's
/// ordering key, so each key carries many events and their order is exercised.
pub const CUSTOMERS: u8 = 32;

/// The customer of the change `key` (its snapshot event's id): derived from the id, so the plan's
/// draws are untouched and every channel of the change names the same customer.
pub fn customer(key: &str) -> String {
    let hash = dedup_worker_core::store::dedup_key("soak-customer", key);
    format!("cus_soak_{:02}", hash[0] % CUSTOMERS)
}

/// One message the driver puts on a queue itself.
#[derive(Debug, Clone, Serialize)]
pub struct Direct {
    pub at_ms: u64,
    /// The key the checker counts it under: the change's key, or the foreign message's.
    pub key: String,
    pub lane: Lane,
    pub kind: DirectKind,
    /// The change (index into [`Plan::events`]) of a twin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<usize>,
    /// 0, then 1 for the foreign producer's second publish.
    pub copy: u32,
}

/// The foreign producer's messages: `rate / FOREIGN_EVERY` a second, to the database queue and
/// RabbitMQ two times in five each, to SQS once in five (the emulator's capacity), half with the
/// transport's id, three in ten with only a body id, two in ten with none.
pub fn foreign_stream(rng: &mut StdRng, seed: u64, seconds: u64, rate: u32) -> Vec<Direct> {
    let per_second = (rate / FOREIGN_EVERY).max(1);
    let mut direct = Vec::new();
    for i in 0..seconds * u64::from(per_second) {
        let at_ms = i * 1_000 / u64::from(per_second) + rng.gen_range(0..1_000);
        let lane = match rng.gen_range(0..5) {
            0..=1 => Lane::Database,
            2..=3 => Lane::Rabbitmq,
            _ => Lane::Sqs,
        };
        let kind = match rng.gen_range(0..10) {
            0..=4 => DirectKind::ForeignId,
            5..=7 => DirectKind::ForeignBodyId,
            _ => DirectKind::ForeignNoId,
        };
        let message = Direct {
            at_ms,
            key: format!("fgn{seed:x}_{i:06}"),
            lane,
            kind,
            event: None,
            copy: 0,
        };
        if rng.gen_bool(FOREIGN_REPUBLISHED) {
            direct.push(Direct {
                at_ms: at_ms + rng.gen_range(100..10_000),
                copy: 1,
                ..message.clone()
            });
        }
        direct.push(message);
    }
    direct
}

/// A foreign message's body (its `soak_key` tells the sink and the dead letters whose it is).
pub fn foreign_body(message: &Direct) -> Vec<u8> {
    let mut body = json!({
        "soak_key": message.key,
        "type": "foreign.order.created",
        "note": "published by the soak's foreign producer",
    });
    match message.kind {
        DirectKind::ForeignBodyId => body["id"] = json!(message.key),
        DirectKind::ForeignNoId => body["type"] = json!("foreign.note"),
        _ => {}
    }
    serde_json::to_vec(&body).expect("JSON serialises")
}

/// The EventBridge envelope of `detail` as the partner event source puts it on SQS; its id
/// derived from the key, as stable as the plan.
pub fn eventbridge_envelope(key: &str, detail: &[u8]) -> Vec<u8> {
    let detail: serde_json::Value = serde_json::from_slice(detail).expect("a JSON event");
    let id = uuid::Uuid::from_bytes(dedup_worker_core::store::dedup_key("eventbridge", key));
    serde_json::to_vec(&json!({
        "version": "0",
        "id": id.to_string(),
        "detail-type": detail["type"],
        "source": "aws.partner/stripe.com/ed_test_soak",
        "account": "000000000000",
        "time": chrono::Utc::now().to_rfc3339(),
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    }))
    .expect("JSON serialises")
}

/// How many of each kind of workload the plan sends within the run (the summary's
/// `workload`).
pub fn counts(plan: &Plan) -> BTreeMap<&'static str, u64> {
    let mut counts: BTreeMap<&'static str, u64> = [
        "webhook_snapshot",
        "webhook_thin",
        "webhook_duplicate",
        "two_channels_thin_webhook",
        "foreign_republished",
    ]
    .into_iter()
    .chain(ALL_DIRECT.map(DirectKind::name))
    .map(|name| (name, 0))
    .collect();
    let mut add = |name: &'static str| *counts.entry(name).or_insert(0) += 1;
    for post in &plan.posts {
        add(match (post.shape, post.copy) {
            (Shape::Snapshot, 0) => "webhook_snapshot",
            (Shape::Thin, 0) => "webhook_thin",
            _ => "webhook_duplicate",
        });
        if post.copy == 0 && post.shape == Shape::Thin && post.at_once {
            add("two_channels_thin_webhook");
        }
    }
    for direct in &plan.direct {
        add(direct.kind.name());
        if direct.copy > 0 {
            add("foreign_republished");
        }
    }
    let old = plan
        .events
        .iter()
        .filter(|e| e.created_offset_secs < 0)
        .count();
    counts.insert("old_created", old as u64);
    counts
}
