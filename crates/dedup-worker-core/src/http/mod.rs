//! HTTP plumbing every listener of this crate shares, apart from what any route does:
//!
//! * [`server`]: the server loop with the limits a public endpoint needs (header, body and
//!   request timeouts, concurrency and connection caps, graceful shutdown);
//! * [`problem`]: RFC 9457 `application/problem+json` answers, the one shape every error of
//!   ours takes on the wire (4xx for what the sender got wrong, 503 with `Retry-After` for what
//!   we cannot do now);
//! * [`ops`]: the operational routes (`/healthz`, `/readyz`, `/metrics`) that every role serves,
//!   whether or not it receives webhooks (those routes are [`crate::webhook`]'s).

pub mod ops;
pub mod problem;
pub mod server;

pub use server::{serve, ServerLimits};

/// A status's class, `2xx`, `4xx`, `5xx`: the `status` label of the request histograms
/// (`dedup_ingress_request_seconds`, `idempotency_request_seconds`), few enough values for a
/// histogram per route, and what an error-rate alert divides by.
pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
