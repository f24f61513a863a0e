//! Logs: the tracing subscriber, filtered by `RUST_LOG` (default `info`), written to stderr.

use tracing_subscriber::EnvFilter;

/// Installs the tracing subscriber once; later calls are no-ops (tests start many apps).
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
