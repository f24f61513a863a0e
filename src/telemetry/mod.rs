//! What an operator sees of the process: logs ([`logs`]: tracing, filtered by `RUST_LOG`,
//! default `info`, as text or JSON lines), traces ([`traces`]: OpenTelemetry over OTLP, and the
//! `traceparent` an event carries through every hop) and metrics (here: a process-wide
//! Prometheus recorder rendered at `/metrics`).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub mod logs;
pub mod traces;

pub use logs::{init, init_tracing, LogFormat, Telemetry};

/// The process's Prometheus recorder, installed on first use. `None` if another recorder was
/// installed first (a library user's own).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(handle) => Some(handle),
            Err(error) => {
                tracing::warn!(%error, "metrics recorder not installed; /metrics will answer 404");
                None
            }
        })
        .clone()
}
