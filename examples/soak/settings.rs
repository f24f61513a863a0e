//! What each process of the service is given: the run's database, sink and dedup window,
//! limits that faults alone cannot exhaust, and per transport its queue, every address through
//! the run's fault proxies.

use crate::cluster::Lane;
use crate::infra::{Infra, DATABASE_QUEUE};

/// The Stripe secret every ingress verifies with and the sender signs with.
pub const SECRET: &str = "whsec_soak_0123456789abcdef0123456789abcdef";

/// The ordered sink's name (`outbox.sinks.ordered`, the outbox's `sink` column).
pub const ORDERED_SINK: &str = "ordered";
/// Its ordering key: the webhook events' customer ([`crate::workload::customer`]), a pool small
/// enough that every key carries many events. A thin event or a foreign message has none: its
/// row is delivered unordered.
pub const ORDERING_KEY: &str = "/data/object/customer";

/// What every process is given (the lanes add their transport).
pub fn common_env(infra: &Infra, window_secs: u64) -> Vec<(String, String)> {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let mut env: Vec<(String, String)> = [
        ("DATABASE_URL", infra.database_url_proxied.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_LISTEN", "127.0.0.1:0".to_owned()),
        ("DEDUP_SINK", infra.sink_url()),
        ("RUST_LOG", var("SOAK_RUST_LOG", "warn")),
        ("DEDUP_LOG__FORMAT", "text".to_owned()),
        ("DEDUP_DATABASE__MAX_CONNECTIONS", "4".to_owned()),
        ("DEDUP_CONSUMER__DEDUP_WINDOW", format!("{window_secs}s")),
        (
            "DEDUP_CONSUMER__ALLOW_SHORT_DEDUP_RETENTION",
            "true".to_owned(),
        ),
        ("DEDUP_CONSUMER__RETENTION_INTERVAL", "2s".to_owned()),
        // Limits infrastructure faults cannot exhaust in a run: a dead letter or a failed
        // outbox row is then a finding, not the nemesis's doing.
        ("DEDUP_CONSUMER__MAX_ATTEMPTS", "500".to_owned()),
        ("DEDUP_TRANSPORT__DELIVERY_LIMIT", "500".to_owned()),
        ("DEDUP_OUTBOX__MAX_ATTEMPTS", "500".to_owned()),
        ("DEDUP_CONSUMER__RETRY_BASE", "200ms".to_owned()),
        ("DEDUP_CONSUMER__RETRY_MAX", "5s".to_owned()),
        ("DEDUP_OUTBOX__RETRY_BASE", "200ms".to_owned()),
        ("DEDUP_OUTBOX__RETRY_MAX", "5s".to_owned()),
        ("DEDUP_OUTBOX__HTTP_TIMEOUT", "5s".to_owned()),
        // The sink's faults open its circuit (its rows then wait without spending attempts);
        // probes at most 10 s apart keep the drain's stall detector (60 s) seeing progress
        // once the sink is healed, where the default 5 min would outwait it.
        ("DEDUP_OUTBOX__BREAKER__PROBE_MAX", "10s".to_owned()),
        // A second sink, ordered by the event's customer, at the same receiver behind the same
        // proxy; a route sends every forwarded event to both (issue 39). Its rows stay in the
        // outbox after delivery (the default week of retention, written out here since the
        // checker reads the lane's commit order from them at the end).
        (
            "DEDUP_OUTBOX__SINKS__ORDERED__URL",
            infra.ordered_sink_url(),
        ),
        ("DEDUP_OUTBOX__SINKS__ORDERED__ORDERED", "true".to_owned()),
        (
            "DEDUP_OUTBOX__SINKS__ORDERED__ORDERING_KEY",
            ORDERING_KEY.to_owned(),
        ),
        (
            "DEDUP_OUTBOX__ROUTES",
            format!(r#"[{{name="all", sinks=["default", "{ORDERED_SINK}"]}}]"#),
        ),
        ("DEDUP_OUTBOX__RETENTION_HOURS", "168".to_owned()),
        ("DEDUP_TRANSPORT__SQS_WAIT_TIME", "5s".to_owned()),
        ("DEDUP_SHUTDOWN__GRACE", "10s".to_owned()),
        ("AWS_REGION", var("AWS_REGION", "us-east-1")),
        ("AWS_ACCESS_KEY_ID", var("AWS_ACCESS_KEY_ID", "test")),
        (
            "AWS_SECRET_ACCESS_KEY",
            var("AWS_SECRET_ACCESS_KEY", "test"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Ok(fault) = std::env::var("SOAK_SERVICE_FAULT") {
        env.push(("SOAK_SERVICE_FAULT".to_owned(), fault));
    }
    env
}

pub fn lane_env(infra: &Infra) -> Vec<(Lane, Vec<(String, String)>)> {
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    vec![
        (
            Lane::Database,
            pairs(&[
                ("DEDUP_TRANSPORT", "database"),
                ("DEDUP_QUEUE", DATABASE_QUEUE),
            ]),
        ),
        (
            Lane::Rabbitmq,
            pairs(&[
                ("DEDUP_TRANSPORT", "rabbitmq"),
                ("DEDUP_QUEUE", &infra.rabbit_queue),
                ("AMQP_URL", &infra.amqp_url_proxied),
            ]),
        ),
        (
            Lane::Sqs,
            pairs(&[
                ("DEDUP_TRANSPORT", "sqs"),
                // The queue also carries EventBridge envelopes of Stripe events (a change's
                // second channel); the ingress's own messages are not envelopes and pass as
                // they are.
                ("DEDUP_CONSUMER__ENVELOPE", "eventbridge"),
                ("DEDUP_QUEUE", &infra.sqs_queue_url_proxied),
                ("AWS_ENDPOINT_URL", &infra.aws_endpoint_proxied),
            ]),
        ),
    ]
}
