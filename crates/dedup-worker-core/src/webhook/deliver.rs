//! What every webhook route does around its own verification, in one place so the Stripe, the
//! Standard Webhooks and the named sources' routes answer alike: the receive span, the body read
//! (413 / 400), the problems a forgery gets, the durable publish (503 with `Retry-After` when
//! the transport cannot take it), and the answer with its metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use tracing::Instrument;

use crate::event::{check_event_field, EventField, InvalidEventField};
use crate::http::problem::Problem;
use crate::http::status_class;
use crate::queue::{OutgoingMessage, Transport, TransportError};
use crate::telemetry::traces;

/// Current Unix time in seconds; injectable so tests can verify published vectors.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// What a route answers 2xx with.
#[derive(Debug)]
pub enum Accepted {
    /// The event is durable under this id: `{"received": true, "id": …}`.
    Received(String),
    /// A sender's handshake (Slack's `url_verification`, Zoom's `endpoint.url_validation`),
    /// answered with this JSON body and nothing enqueued.
    Challenge(serde_json::Value),
    /// Every event of the delivery is durable, and the sender expects this plain text answer
    /// (Adyen's `[accepted]`).
    Text(&'static str),
}

/// The span of one webhook: its event's fields are recorded once read, so every line logged
/// while it is received carries them; it continues the sender's trace when the request has a
/// `traceparent`.
pub(super) fn receive_span(source: &str, headers: &HeaderMap) -> tracing::Span {
    let span = tracing::info_span!(
        "receive",
        otel.kind = "server",
        source,
        event_id = tracing::field::Empty,
        event_type = tracing::field::Empty,
    );
    let traceparent = headers
        .get(traces::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    traces::continue_trace(&span, traceparent);
    span
}

/// Records the event's key and type on the current (receive) span.
pub(super) fn record_event(event_id: &str, event_type: Option<&str>) {
    let span = tracing::Span::current();
    span.record("event_id", event_id);
    if let Some(event_type) = event_type {
        span.record("event_type", event_type);
    }
}

/// The one place an ingress outcome becomes HTTP: 200 with the event id (or the challenge), or
/// the problem. Counts it under `source`, and times it under `route` (a path template, so the
/// histogram's series stay few) from `started` (the body read: a slow sender's upload is its
/// own, bounded by `http.body_read_timeout`) to the answer: verification and the durable
/// publish, what an ingress latency objective is about.
pub(super) fn answer(
    source: &str,
    route: &'static str,
    started: Instant,
    outcome: Result<Accepted, Problem>,
) -> Response {
    let label = match &outcome {
        Ok(Accepted::Received(_) | Accepted::Text(_)) => "accepted",
        Ok(Accepted::Challenge(_)) => "challenge",
        Err(p) if p.status == 400 => "rejected",
        Err(p) if p.status == 413 => "too_large",
        Err(_) => "unavailable",
    };
    metrics::counter!("dedup_webhooks_total", "source" => source.to_owned(), "outcome" => label)
        .increment(1);
    let response = match outcome {
        Ok(Accepted::Received(id)) => (
            StatusCode::OK,
            Json(serde_json::json!({ "received": true, "id": id })),
        )
            .into_response(),
        Ok(Accepted::Challenge(reply)) => (StatusCode::OK, Json(reply)).into_response(),
        Ok(Accepted::Text(text)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text,
        )
            .into_response(),
        Err(problem) => problem.into_response(),
    };
    metrics::histogram!(
        "dedup_ingress_request_seconds",
        "route" => route,
        "status" => status_class(response.status()),
    )
    .record(started.elapsed().as_secs_f64());
    response
}

/// The body, or 413 / 400 problems when it could not be read.
pub(super) fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Problem> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(
                status,
                "urn:dedup-worker:problem:payload-too-large",
                "Payload too large",
                rejection.body_text(),
            )
        } else {
            Problem::new(
                status,
                "urn:dedup-worker:problem:unreadable-body",
                "Unreadable body",
                rejection.body_text(),
            )
        }
    })
}

/// 400: the delivery is not signed as its sender signs; `check` names the step that failed.
pub(super) fn invalid_signature(detail: impl Into<String>, check: &'static str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "urn:dedup-worker:problem:invalid-signature",
        "Invalid signature",
        detail,
    )
    .with_check(check)
}

/// 400: a verified delivery whose content cannot be taken in (no id, not JSON); `check` names
/// what is missing.
pub(super) fn invalid_payload(detail: impl Into<String>, check: &'static str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "urn:dedup-worker:problem:invalid-payload",
        "Invalid payload",
        detail,
    )
    .with_check(check)
}

/// A header as text; a header that is not visible ASCII fails like a malformed one.
pub(super) fn header_text<'h>(
    headers: &'h HeaderMap,
    name: &str,
) -> Result<Option<&'h str>, Problem> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value.to_str().map(Some).map_err(|_| {
            invalid_signature(
                format!("the {name} header is not visible ASCII"),
                "malformed_header",
            )
        }),
    }
}

/// Publishes on `transport` and waits until it says the message is durable, at most `timeout`;
/// 503 otherwise (400 if the transport refused this very message for what it carries).
pub(super) async fn publish(
    transport: &dyn Transport,
    timeout: Duration,
    mut message: OutgoingMessage,
) -> Result<(), Problem> {
    // Logged in the receive span, which carries the event's key and type. The message carries
    // the enqueue span's context, which the consumer's span continues.
    let span = tracing::info_span!("enqueue", otel.kind = "producer");
    message.traceparent = traces::traceparent_of(&span);
    bounded(timeout, transport.publish(message))
        .instrument(span)
        .await
        .map_err(|error| match error {
            TransportError::Rejected(reason) => {
                tracing::warn!(%reason, "transport refused webhook; answering 400");
                invalid_payload("the event cannot be stored as sent", "payload_storable")
            }
            error => {
                // The cause is logged; the sender learns only that it should retry.
                tracing::warn!(%error, "could not enqueue webhook; answering 503");
                unavailable()
            }
        })
}

/// 400 for a source, id or type that [`check_event_field`] refuses; `check` names the field.
pub(super) fn checked(field: EventField, value: &str, check: &'static str) -> Result<(), Problem> {
    check_event_field(field, value)
        .map_err(|error: InvalidEventField| invalid_payload(error.to_string(), check))
}

fn unavailable() -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "urn:dedup-worker:problem:unavailable",
        "Temporarily unavailable",
        "the event could not be stored durably; retry later",
    )
    .with_retry_after(5)
}

/// `call`'s result, or `Unavailable` if it has not answered within `timeout`.
async fn bounded<T, E>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, TransportError>
where
    TransportError: From<E>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(TransportError::from),
        Err(_) => Err(TransportError::Unavailable(
            format!("no answer within {timeout:?}").into(),
        )),
    }
}
