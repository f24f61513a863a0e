//! Logs: the tracing subscriber, filtered by `RUST_LOG` (default `info`), written to stderr as
//! text or as JSON lines (`log.format`), with the traces layer beside it when traces are on.
//! `RUST_LOG` filters the log lines only: the traces layer takes every span at `info` and above
//! whatever it says, so quieting the logs (`RUST_LOG=warn`) never silently drops the traces.
//!
//! JSON lines carry the fields of the spans they are logged in at the top level, so a line
//! logged while an event is received, handled or delivered has `source`, `event_id` and
//! `event_type` (the spans of [`crate::telemetry`]'s callers record them), and, when traces are
//! on, `openTelemetry.traceId` / `spanId`. Text is coloured only on a terminal.

use std::io::IsTerminal;

use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::traces;

/// `log.format`: how log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text on a terminal, JSON lines otherwise (a container's log collector, a file).
    #[default]
    Auto,
    Json,
    Text,
}

impl LogFormat {
    /// Whether this format writes JSON, given whether stderr is a terminal.
    fn is_json(self, terminal: bool) -> bool {
        match self {
            LogFormat::Json => true,
            LogFormat::Text => false,
            LogFormat::Auto => !terminal,
        }
    }
}

/// What was installed; [`Telemetry::shutdown`] flushes the spans not exported yet.
#[must_use = "shut it down before the process exits, or the last spans are lost"]
pub struct Telemetry {
    /// The traces' provider, when traces are on.
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is batched (bounded by the exporter's timeout) and stops.
    pub fn shutdown(self) {
        if let Some(provider) = self.traces {
            if let Err(error) = provider.shutdown() {
                tracing::warn!(%error, "traces: the last spans could not be exported");
            }
        }
    }
}

/// The lines written when `RUST_LOG` is not set: `info`, except PostgreSQL's own notices
/// ("relation … already exists, skipping" on every `migrate`), which say nothing an operator
/// acts on; its warnings still show.
const DEFAULT_FILTER: &str = "info,sqlx::postgres::notice=warn";

/// Installs the subscriber once (later calls install nothing: tests start many apps) with the
/// traces layer when the environment asks for traces (see [`traces`]).
pub fn init(format: LogFormat) -> Telemetry {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let terminal = std::io::stderr().is_terminal();
    // Per-layer filters: `RUST_LOG` for the lines written, `info` for the spans exported. No
    // `Option` layers: a `None` one is interested in every callsite, which would enable every
    // span (and its cost) that the filter was meant to turn off.
    let lines: Box<dyn Layer<Registry> + Send + Sync> = if format.is_json(terminal) {
        let mut json = json_subscriber::JsonLayer::stderr();
        json.with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime)
            .with_level("level")
            .with_target("target")
            .with_flattened_event()
            .with_top_level_flattened_span_list()
            .with_opentelemetry_ids(true);
        json.boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(terminal)
            .boxed()
    };
    let (provider, traces_error) = match traces::provider_from_env() {
        Ok(provider) => (provider, None),
        Err(error) => (None, Some(error)),
    };
    let registry = tracing_subscriber::registry().with(lines.with_filter(filter));
    let installed = match &provider {
        Some(provider) => registry
            .with(traces::layer(provider).with_filter(LevelFilter::INFO))
            .try_init(),
        None => registry.try_init(),
    }
    .is_ok();
    if let Some(error) = traces_error {
        tracing::warn!(%error, "traces are off");
    }
    if provider.is_some() {
        // The context a `traceparent` carries is W3C's.
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
    }
    Telemetry {
        traces: provider.filter(|_| installed),
    }
}

/// [`init`] with the default format: for callers without settings.
pub fn init_tracing() -> Telemetry {
    init(LogFormat::Auto)
}
