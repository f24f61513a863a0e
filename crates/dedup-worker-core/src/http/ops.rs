//! The operational routes, served by every role of `dedup-worker serve`:
//!
//! * `GET /healthz`: the process answers (liveness; no dependency is asked);
//! * `GET /readyz`: the store and the transport both answered within the check timeout (a load
//!   balancer stops routing webhooks to a process that would only answer 503);
//! * `GET /metrics`: Prometheus text, when a recorder is installed.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::problem::Problem;
use crate::queue::Transport;
use crate::store::Store;

/// What the operational routes read.
#[derive(Clone)]
pub struct OpsState {
    /// Asked by `/readyz`.
    pub store: Store,
    /// Asked by `/readyz`.
    pub transport: Arc<dyn Transport>,
    /// The longest `/readyz` waits for either answer: a dependency that stops answering makes
    /// the process not ready, rather than hold the probe.
    pub check_timeout: Duration,
    /// Renders `/metrics`; `None` when no recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// `/healthz`, `/readyz` and `/metrics`.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

/// Whether `call` answered `Ok` within `timeout`; the error (or the timeout) is logged as `what`.
async fn answered<E: std::fmt::Display>(
    what: &'static str,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<(), E>>,
) -> bool {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "readiness: {what} unreachable");
            false
        }
        Err(_) => {
            tracing::warn!(?timeout, "readiness: {what} did not answer in time");
            false
        }
    }
}

async fn readyz(State(state): State<OpsState>) -> Response {
    let (store, transport) = tokio::join!(
        answered("store", state.check_timeout, state.store.ping()),
        answered("transport", state.check_timeout, state.transport.ready()),
    );
    if store && transport {
        return (StatusCode::OK, "ready").into_response();
    }
    let status = |ok: bool| if ok { "ok" } else { "unreachable" };
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "urn:dedup-worker:problem:not-ready",
        "Not ready",
        format!("store: {}, transport: {}", status(store), status(transport)),
    )
    .into_response()
}

/// `GET /metrics` alone, rendering the process's recorder: for a service of its own that mounts
/// the Idempotency-Key layer (the checkout example), so its `idempotency_*` metrics are scraped
/// like the worker's.
pub fn metrics_router() -> Router {
    let handle = crate::telemetry::metrics_handle();
    Router::new().route(
        "/metrics",
        get(move || std::future::ready(render(handle.as_ref()))),
    )
}

async fn metrics_text(State(state): State<OpsState>) -> Response {
    render(state.metrics.as_ref())
}

fn render(metrics: Option<&metrics_exporter_prometheus::PrometheusHandle>) -> Response {
    match metrics {
        Some(handle) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics recorder installed").into_response(),
    }
}
