//! The gauges an alert uses, sampled by a background task rather than on each scrape, so a
//! store or broker that is slow to answer never makes `/metrics` slow (a scrape only renders
//! what is in memory):
//!
//! * `dedup_queue_depth{transport, queue}`: messages waiting (see [`Backlog`] for how each
//!   transport counts them);
//! * `dedup_queue_oldest_message_age_seconds{transport, queue}`: how long the oldest message
//!   not yet acked has waited; database queue only, 0 when empty (RabbitMQ and SQS cannot tell
//!   it without another service, so it is not exported for them rather than guessed);
//! * `dedup_dead_letters`, `dedup_outbox_pending`, `dedup_outbox_failed`: current rows;
//! * `dedup_history_partition_days_ahead{table}`: how many days past today each history table
//!   has day partitions for (PostgreSQL; 3 when retention runs, -1 when today's is missing).
//!
//! Every process samples them, whatever its roles: the queue's depth must stay visible when
//! every consumer is down, which is when it grows. Replicas report the same values, so
//! dashboards and alerts take `max` over them. One sample every [`SAMPLE_INTERVAL`], each call
//! bounded by `timeout`; after a failure the task waits twice as long each time (at most
//! [`MAX_INTERVAL`]), counts `dedup_gauge_sample_failures_total{source}` and leaves the
//! gauges at their last values (the store or broker being down shows in `/readyz` and the error
//! rates). Each tick also runs the recorder's upkeep, which folds recorded histogram samples
//! into their buckets, so memory stays bounded when nothing scrapes.

use std::sync::Arc;
use std::time::Duration;

use metrics::Label;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::config::lane_label;
use crate::queue::{Backlog, Transport};
use crate::store::{Circuit, SinkState, Store, PARTITIONED};

/// How often the gauges are sampled while their sources answer: a few times per scrape at
/// Prometheus's usual 15–30 s, one small statement and one broker call each time.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// The longest wait between samples after failures in a row.
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// What the sampler reads, and where.
#[derive(Clone)]
pub struct GaugeSources {
    pub store: Store,
    pub transport: Arc<dyn Transport>,
    /// The `transport` label: `database`, `rabbitmq` or `sqs`.
    pub transport_kind: &'static str,
    /// The longest each call may take (`transport.publish_timeout`, as for `/readyz`).
    pub timeout: Duration,
    /// The recorder whose upkeep runs on each tick, when one is installed.
    pub metrics: Option<PrometheusHandle>,
}

/// Samples every [`SAMPLE_INTERVAL`] (longer after failures) until `shutdown`.
pub async fn run_gauges(sources: GaugeSources, shutdown: CancellationToken) {
    let queue = [
        Label::new("transport", sources.transport_kind),
        Label::new("queue", sources.transport.queue_name().to_owned()),
    ];
    // Registered at 0, so an alert on its increase has a series before the first failure.
    for source in ["transport", "store"] {
        metrics::counter!("dedup_gauge_sample_failures_total", "source" => source).increment(0);
    }
    // The same for history rows not kept (`DedupHistoryNotKept` alerts on their increase).
    for table in PARTITIONED {
        metrics::counter!("dedup_history_not_kept_total", "table" => *table).increment(0);
    }
    let mut failures = 0u32;
    loop {
        let sampled = tokio::select! {
            _ = shutdown.cancelled() => return,
            sampled = sample(&sources, &queue) => sampled,
        };
        if let Some(handle) = &sources.metrics {
            handle.run_upkeep();
        }
        failures = if sampled {
            0
        } else {
            failures.saturating_add(1)
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(next_wait(failures)) => {}
        }
    }
}

/// [`SAMPLE_INTERVAL`], doubled for each failure in a row, at most [`MAX_INTERVAL`].
pub fn next_wait(failures: u32) -> Duration {
    SAMPLE_INTERVAL
        .saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX))
        .min(MAX_INTERVAL)
}

/// One sample of both sources, at once; whether both answered.
async fn sample(sources: &GaugeSources, queue: &[Label; 2]) -> bool {
    let (backlog, counts, lanes) = tokio::join!(
        tokio::time::timeout(sources.timeout, sources.transport.backlog()),
        tokio::time::timeout(sources.timeout, sources.store.reads().alert_counts()),
        tokio::time::timeout(sources.timeout, sources.store.sinks().list()),
    );
    let backlog_ok = match backlog {
        Ok(Ok(backlog)) => {
            set_backlog(&backlog, queue);
            true
        }
        Ok(Err(error)) => failed("transport", &error),
        Err(_) => failed(
            "transport",
            &format!("no answer within {:?}", sources.timeout),
        ),
    };
    let counts_ok = match counts {
        Ok(Ok(counts)) => {
            metrics::gauge!("dedup_dead_letters").set(counts.dead_letters as f64);
            metrics::gauge!("dedup_outbox_pending").set(counts.outbox_pending as f64);
            metrics::gauge!("dedup_outbox_failed").set(counts.outbox_failed as f64);
            true
        }
        Ok(Err(error)) => failed("store", &error),
        Err(_) => failed("store", &format!("no answer within {:?}", sources.timeout)),
    };
    let lanes_ok = match lanes {
        Ok(Ok(lanes)) => {
            set_lanes(&lanes);
            true
        }
        Ok(Err(error)) => failed("store", &error),
        Err(_) => failed("store", &format!("no answer within {:?}", sources.timeout)),
    };
    let partitions_ok = set_partition_days(&sources.store, sources.timeout).await;
    backlog_ok && counts_ok && lanes_ok && partitions_ok
}

/// Each history table's days of partitions ahead (PostgreSQL; nothing on SQLite, whose tables
/// are plain).
async fn set_partition_days(store: &Store, timeout: std::time::Duration) -> bool {
    for table in PARTITIONED {
        let ahead = tokio::time::timeout(timeout, store.partitions().days_ahead(table)).await;
        match ahead {
            Ok(Ok(Some(days))) => {
                metrics::gauge!("dedup_history_partition_days_ahead", "table" => *table)
                    .set(days as f64);
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => return failed("store", &error),
            Err(_) => return failed("store", &format!("no answer within {timeout:?}")),
        }
    }
    true
}

/// Each lane's shared state (`outbox_sinks`), the same in every process: its circuit (1 on the
/// current state), whether it is paused, and how long the receiver's hold still lasts. A lane
/// never paused, held or opened has no row, and no gauges.
fn set_lanes(lanes: &[SinkState]) {
    for lane in lanes {
        let label = lane_label(&lane.sink);
        for circuit in [Circuit::Closed, Circuit::Open, Circuit::HalfOpen] {
            let on = if lane.circuit == circuit { 1.0 } else { 0.0 };
            metrics::gauge!("dedup_outbox_sink_circuit", "lane" => label.clone(), "state" => circuit.as_str()).set(on);
        }
        let paused = if lane.paused { 1.0 } else { 0.0 };
        metrics::gauge!("dedup_outbox_sink_paused", "lane" => label.clone()).set(paused);
        let held = lane.held_for().unwrap_or_default().as_secs_f64();
        metrics::gauge!("dedup_outbox_sink_held_seconds", "lane" => label).set(held);
    }
}

/// Sets what the transport could tell; a gauge it cannot tell is never registered (a gauge
/// registered and not set would render as 0, a value nobody measured).
fn set_backlog(backlog: &Backlog, queue: &[Label; 2]) {
    if let Some(depth) = backlog.depth {
        metrics::gauge!("dedup_queue_depth", queue.to_vec()).set(depth as f64);
    }
    if let Some(age) = backlog.oldest_age {
        metrics::gauge!("dedup_queue_oldest_message_age_seconds", queue.to_vec())
            .set(age.as_secs_f64());
    }
}

fn failed(source: &'static str, error: &dyn std::fmt::Display) -> bool {
    tracing::warn!(%error, "sampling the {source} gauges failed; they keep their last values");
    metrics::counter!("dedup_gauge_sample_failures_total", "source" => source).increment(1);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_after_each_failure_up_to_the_cap() {
        assert_eq!(next_wait(0), SAMPLE_INTERVAL);
        assert_eq!(next_wait(1), SAMPLE_INTERVAL * 2);
        assert_eq!(next_wait(2), SAMPLE_INTERVAL * 4);
        assert_eq!(next_wait(4), MAX_INTERVAL);
        assert_eq!(next_wait(u32::MAX), MAX_INTERVAL);
    }
}
