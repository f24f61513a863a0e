//! The HTTP server every listener of this crate runs (`dedup-worker serve` and the checkout
//! example): a router behind the limits a public endpoint needs, so that slow or hostile
//! clients cannot hold it.
//!
//! * **Header read** ([`ServerLimits::header_read_timeout`], hyper's own): the request line and
//!   headers must arrive in time, or the connection is closed. It also bounds how long a
//!   kept-alive connection may sit idle before its next request. (`axum::serve` sets no timer,
//!   so hyper applies none there: hence this loop.)
//! * **Header size** ([`ServerLimits::max_header_bytes`], hyper's): a larger request head is
//!   answered 431 before any of it reaches a route.
//! * **Body read** ([`ServerLimits::body_read_timeout`], tower-http's): the longest pause between
//!   two reads of a body, as nginx's `client_body_timeout`; the route then answers 408.
//! * **Request** ([`ServerLimits::request_timeout`], tower's): the whole request, body included,
//!   is answered within it; beyond, 503 problem+json with `Retry-After`, and the connection is
//!   closed if the body was not read to its end. This bounds a client that trickles a body a
//!   byte at a time, which no pause limit catches.
//! * **Concurrency** ([`ServerLimits::max_concurrent_requests`], tower's limit and load
//!   shedding): requests beyond the cap are answered 503 with `Retry-After` at once instead of
//!   queueing without bound.
//! * **Connections** ([`ServerLimits::max_connections`]): past the cap, new connections wait in
//!   the listen backlog until one closes, so descriptors and buffers stay bounded.
//!
//! Shutdown is graceful: on cancellation the listener stops accepting, idle connections close,
//! and requests in flight finish (each bounded by the request timeout).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::timeout::RequestBodyTimeoutLayer;

use super::problem::Problem;
use crate::config::HttpSettings;
use crate::retry::backoff_delay;

/// The limits [`serve`] enforces; `[http]` in config/default.toml documents the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Request line and headers must arrive within this (also an idle kept-alive connection's
    /// wait for its next request); then the connection is closed.
    pub header_read_timeout: Duration,
    /// Largest request line plus headers; larger get 431.
    pub max_header_bytes: usize,
    /// The longest pause between two reads of a body; then the route answers 408.
    pub body_read_timeout: Duration,
    /// The whole request is answered within this; then 503 with `Retry-After`.
    pub request_timeout: Duration,
    /// Requests handled at once; more are answered 503 with `Retry-After` at once.
    pub max_concurrent_requests: usize,
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    /// What a production user would pick for a public webhook endpoint: headers of at most
    /// 16 KiB (Node's default; Stripe's are a few hundred bytes) in 10 s, no
    /// pause in a body over 10 s, every answer within 15 s (Stripe waits longer than that
    /// before it counts a delivery as failed), 1,024 requests and 10,000 connections at once.
    fn default() -> Self {
        ServerLimits {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            body_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_concurrent_requests: 1024,
            max_connections: 10_000,
        }
    }
}

impl From<&HttpSettings> for ServerLimits {
    fn from(http: &HttpSettings) -> Self {
        ServerLimits {
            header_read_timeout: http.header_read_timeout,
            max_header_bytes: http.max_header_bytes,
            body_read_timeout: http.body_read_timeout,
            request_timeout: http.request_timeout,
            max_concurrent_requests: http.max_concurrent_requests,
            max_connections: http.max_connections,
        }
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` is cancelled, then stops
/// accepting and waits for the connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let service = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(refusal))
        .load_shed()
        .concurrency_limit(limits.max_concurrent_requests.max(1))
        .timeout(limits.request_timeout)
        .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout))
        .service(router);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut accept_failures = 0u32;
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    accept_failures = 0;
                    stream
                }
                Err(error) => {
                    // Out of descriptors or memory: wait a little (more each time) instead of
                    // spinning; a connection reset before it was accepted is nothing.
                    if !is_connection_error(&error) {
                        accept_failures = accept_failures.saturating_add(1);
                        let delay = backoff_delay(
                            Duration::from_millis(10),
                            Duration::from_secs(1),
                            accept_failures,
                        );
                        tracing::warn!(%error, ?delay, "accepting a connection failed");
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                    continue;
                }
            },
        };
        let connection = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(service.clone()),
        );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                // Header timeouts, resets and malformed requests end here: the client's doing.
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// Requests the server itself refused: over the concurrency cap, or past the request timeout.
async fn refusal(error: BoxError) -> Result<Response, Infallible> {
    let problem = if error.is::<tower::load_shed::error::Overloaded>() {
        metrics::counter!("http_requests_refused_total", "reason" => "overloaded").increment(1);
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:dedup-worker:problem:overloaded",
            "Too many requests in progress",
            "the server is handling as many requests as it is configured to; retry later",
        )
        .with_retry_after(1)
    } else if error.is::<tower::timeout::error::Elapsed>() {
        metrics::counter!("http_requests_refused_total", "reason" => "timeout").increment(1);
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:dedup-worker:problem:request-timeout",
            "Request timed out",
            "the request was not answered within the server's request timeout; nothing \
             answered 2xx, so retry later",
        )
        .with_retry_after(5)
    } else {
        tracing::error!(%error, "request failed in the server's middleware");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "urn:dedup-worker:problem:internal",
            "Internal error",
            "the request failed; retry later",
        )
    };
    Ok(problem.into_response())
}
