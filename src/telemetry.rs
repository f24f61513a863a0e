//! Logs (tracing, filtered by `RUST_LOG`, default `info`) and metrics (a process-wide
//! Prometheus recorder rendered at `/metrics`).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// Installs the tracing subscriber once; later calls are no-ops (tests start many apps).
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

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
