//! Traces: OpenTelemetry spans exported over OTLP/HTTP, and the W3C `traceparent` that carries
//! one event's trace across processes.
//!
//! Off unless the standard variables say where to send them: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), with `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`,
//! the default, or `http/json`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`
//! (10 s: every export is bounded), `OTEL_SERVICE_NAME` (default `dedup-worker`),
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turns them off. Spans are batched on the SDK's own thread: an
//! exporter that hangs or fails drops spans (the SDK logs it), never holds a request.
//!
//! One event's trace: `receive` (ingress) → `enqueue` → `handle` (consumer) → `deliver` (relay).
//! The context travels as a `traceparent` with the message (a queue row's column, an AMQP
//! header, an SQS message attribute), then with the outbox row, then in the sink's request. A
//! `traceparent` is only ever written as this module formats it: a value read from outside (a
//! request header, a foreign producer's message) is parsed, and what is not a valid W3C
//! `traceparent` is dropped, so a hostile value never reaches a column or a header.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header (and queue property) name.
pub const TRACEPARENT: &str = "traceparent";

/// Why traces could not be set up (the process runs on without them).
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported (http/protobuf or http/json)")]
    Protocol(String),
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// Whether the environment asks for traces.
fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let is = |name: &str, value: &str| {
        std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
    };
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// The tracer provider the environment asks for, or `None` when traces are off.
pub fn provider_from_env() -> Result<Option<SdkTracerProvider>, TracesError> {
    if !configured() {
        return Ok(None);
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default()
        .trim()
    {
        "" | "http/protobuf" => Protocol::HttpBinary,
        "http/json" => Protocol::HttpJson,
        other => return Err(TracesError::Protocol(other.to_owned())),
    };
    // Endpoint, headers, timeout and compression come from the OTEL_* variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()
        .map_err(TracesError::Exporter)?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("dedup-worker");
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build(),
    ))
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("dedup-worker"))
}

/// Makes `span` a child of the trace `traceparent` names, when it names a valid one.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The `traceparent` of `span` (for the next hop to continue its trace), or `None` when it has
/// no trace (traces off).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// A `traceparent` read from outside, kept only if it is one: parsed and formatted again.
pub fn valid_traceparent(value: &str) -> Option<String> {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), value.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut out: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut out);
    out.remove(TRACEPARENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_traceparents_are_kept() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(valid_traceparent(good).as_deref(), Some(good));
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx: y",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            &"0".repeat(5000),
        ] {
            assert_eq!(valid_traceparent(bad), None, "{bad:?}");
        }
        // Without a tracing layer a span has no trace to hand on.
        assert_eq!(traceparent_of(&tracing::info_span!("x")), None);
    }
}
