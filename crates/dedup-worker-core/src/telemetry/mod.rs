//! What an operator sees of the process: logs ([`logs`]: tracing, filtered by `RUST_LOG`,
//! default `info`, as text or JSON lines), traces ([`traces`]: OpenTelemetry over OTLP, and the
//! `traceparent` an event carries through every hop) and metrics (here: a process-wide
//! Prometheus recorder rendered at `/metrics`).
//!
//! Every histogram is exported as a Prometheus histogram (`_bucket`, `_sum`, `_count`), never as
//! a summary: client-side quantiles cannot be added up across replicas, buckets can, so
//! `histogram_quantile(0.99, sum by (le) (rate(…_bucket[5m])))` is the p99 of the whole fleet.
//! The buckets of each histogram are in [`HISTOGRAM_BUCKETS`], chosen for what it measures.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub mod logs;
pub mod traces;

pub use logs::{init, init_tracing, LogFormat, Telemetry};

/// One webhook request, body read to answer (`dedup_ingress_request_seconds`). BENCHMARKS.md:
/// p50 1.4–4.5 ms and p99 3.6–9.2 ms at 64 connections (a group commit or a publisher confirm
/// per request), so the buckets are dense from 1 to 10 ms; 3.5 s sits just past
/// `transport.publish_timeout` (3 s), so the requests answered 503 because the transport
/// did not answer fall in a bucket of their own, apart from slow successes.
const INGRESS_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 3.5, 10.0,
];

/// One consumer batch: transaction, handlers, commit and ack (`dedup_consumer_batch_seconds`).
/// BENCHMARKS.md: p50 5–12 ms, p99 15–46 ms (a 256-event batch; more with a large dedup
/// window), so the buckets are dense from 5 to 50 ms; the last ones reach
/// `consumer.step_timeout` (30 s), past which a batch is rolled back.
const CONSUMER_BATCH_BUCKETS: &[f64] = &[
    0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
    30.0,
];

/// One outbox row's delivery (`dedup_relay_delivery_seconds`): a file sink's write and fsync
/// (shared by its batch) or a log line take a millisecond or less, an AMQP confirm or an SQS
/// `SendMessage` a few, an HTTP receiver whatever it takes, up to `outbox.http_timeout`
/// (10 s by default), where a delivery fails; so from 1 ms up to that timeout and past it.
const RELAY_DELIVERY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One request through the Idempotency-Key layer (`idempotency_request_seconds`), the
/// handler's own work included. BENCHMARKS.md: a replay from Redis p99 about 1 ms, from
/// PostgreSQL 2–3 ms, a first execution 4–12 ms, the transactional mode 15–26 ms; a statement
/// is cut after 10 s (`statement_timeout`) and a body after 30 s (`body_read_timeout`).
const IDEMPOTENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

/// Group sizes, in requests per commit (`dedup_queue_group_commit_size`,
/// `idempotency_group_size`): median 4 and p99 49 at 64 connections (BENCHMARKS.md), at most
/// `transport.publish_batch_max` (512), so powers of two.
const GROUP_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Any other `*_seconds` histogram (a library user's own, a later one of ours): a general
/// latency range, so it is a histogram too rather than a summary.
const OTHER_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Every histogram the process records, by exact name, and its buckets (upper bounds, in the
/// histogram's unit). The book's "Metrics" chapter (docs/src/operations/metrics.md) lists what
/// each measures.
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    ("dedup_ingress_request_seconds", INGRESS_BUCKETS),
    ("dedup_consumer_batch_seconds", CONSUMER_BATCH_BUCKETS),
    ("dedup_relay_delivery_seconds", RELAY_DELIVERY_BUCKETS),
    ("idempotency_request_seconds", IDEMPOTENCY_BUCKETS),
    ("dedup_queue_group_commit_size", GROUP_SIZE_BUCKETS),
    ("idempotency_group_size", GROUP_SIZE_BUCKETS),
];

/// The builder with every histogram's buckets. Exact names first (the exporter tries full
/// matches before suffixes), then the `_seconds` fallback.
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in HISTOGRAM_BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)?;
    }
    builder.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), OTHER_SECONDS_BUCKETS)
}

/// The process's Prometheus recorder, installed on first use. `None` if another recorder was
/// installed first (a library user's own).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match prometheus_builder().and_then(|b| b.install_recorder()) {
            Ok(handle) => Some(handle),
            Err(error) => {
                tracing::warn!(%error, "metrics recorder not installed; /metrics will answer 404");
                None
            }
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each histogram renders as buckets of its own, and nothing renders as a summary.
    #[test]
    fn every_histogram_renders_buckets_never_quantiles() {
        let recorder = prometheus_builder()
            .expect("buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for (name, _) in HISTOGRAM_BUCKETS {
                metrics::histogram!(*name).record(0.004);
            }
            metrics::histogram!("some_other_seconds").record(0.004);
        });
        let text = handle.render();
        assert!(!text.contains("quantile="), "a summary in:\n{text}");
        for (name, buckets) in HISTOGRAM_BUCKETS {
            assert!(
                text.contains(&format!("# TYPE {name} histogram")),
                "{name}:\n{text}"
            );
            for le in *buckets {
                assert!(
                    text.contains(&format!("{name}_bucket{{le=\"{le}\"}}")),
                    "{name} lacks le={le}:\n{text}"
                );
            }
        }
        assert!(text.contains("some_other_seconds_bucket{le=\"0.005\"} 1"));
        // 4 ms is counted from the ingress's 5 ms bucket on, not below.
        assert!(text.contains("dedup_ingress_request_seconds_bucket{le=\"0.003\"} 0"));
        assert!(text.contains("dedup_ingress_request_seconds_bucket{le=\"0.005\"} 1"));
    }

    #[test]
    fn buckets_ascend() {
        for (name, buckets) in HISTOGRAM_BUCKETS {
            assert!(
                buckets.windows(2).all(|w| w[0] < w[1]),
                "{name}: {buckets:?}"
            );
        }
    }
}
