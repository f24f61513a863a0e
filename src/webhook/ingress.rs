//! `POST /webhooks/stripe` and `POST /webhooks/standard` (the operational routes are
//! [`crate::http::ops`]'s).
//!
//! Order of work per request: size limit (413), signature on the raw bytes (400), then parse
//! only what is needed (Stripe: `id`, `type`, and for a thin event `snapshot_event`, its dedup
//! key; 400 if the id is missing), then check them against the
//! rules of [`crate::event`] (400 for an id or type the store cannot hold, before it can share a
//! group commit with other events), then publish durably and wait for it (503 on failure), then
//! 200.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;

use super::standard::StandardProvider;
use super::stripe::StripeProvider;
use crate::event::{check_event_field, EventField, InvalidEventField};
use crate::http::problem::Problem;
use crate::http::status_class;
use crate::queue::{OutgoingMessage, Transport, TransportError};
use crate::signature::standard::{verify_standard_signature, StandardHeaders};
use crate::signature::stripe::verify_delivery;
use crate::stripe::{StripeEventHead, StripeShapeError};
use crate::telemetry::traces;
use tracing::Instrument;

/// Current Unix time in seconds; injectable so tests can verify published vectors.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// What the webhook routes share.
#[derive(Clone)]
pub struct IngressState {
    /// Where verified events are published.
    pub transport: Arc<dyn Transport>,
    /// `/webhooks/stripe`: Stripe's signing secrets and tolerance.
    pub stripe: StripeProvider,
    /// `/webhooks/standard`, when Standard Webhooks secrets or public keys are configured.
    pub standard: Option<StandardProvider>,
    /// The longest a publish may wait on the transport before the sender is told to retry.
    pub publish_timeout: Duration,
    pub clock: Clock,
}

/// Builds the webhook routes: `/webhooks/stripe`, and `/webhooks/standard` when configured.
pub fn router(state: IngressState, body_limit: usize) -> Router {
    let mut router = Router::new().route(
        "/webhooks/stripe",
        post(stripe_webhook).layer(DefaultBodyLimit::max(body_limit)),
    );
    if state.standard.is_some() {
        router = router.route(
            "/webhooks/standard",
            post(standard_webhook).layer(DefaultBodyLimit::max(body_limit)),
        );
    }
    router.with_state(state)
}

/// What Standard Webhooks ingress reads of a JSON payload: its `type`, borrowed.
#[derive(Deserialize)]
struct TypeOnly<'a> {
    #[serde(borrow, rename = "type")]
    event_type: Option<Cow<'a, str>>,
}

async fn stripe_webhook(
    State(state): State<IngressState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let span = receive_span(state.stripe.source, &headers);
    let started = Instant::now();
    let outcome = receive_stripe(&state, &headers, body)
        .instrument(span)
        .await;
    answer(crate::stripe::SOURCE, "/webhooks/stripe", started, outcome)
}

async fn standard_webhook(
    State(state): State<IngressState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let source = state
        .standard
        .as_ref()
        .map_or("standard", |p| p.source.as_str());
    let span = receive_span(source, &headers);
    let started = Instant::now();
    let outcome = receive_standard(&state, &headers, body)
        .instrument(span)
        .await;
    answer("standard", "/webhooks/standard", started, outcome)
}

/// The span of one webhook: its event's fields are recorded once read, so every line logged
/// while it is received carries them; it continues the sender's trace when the request has a
/// `traceparent`.
fn receive_span(source: &str, headers: &HeaderMap) -> tracing::Span {
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
fn record_event(event_id: &str, event_type: Option<&str>) {
    let span = tracing::Span::current();
    span.record("event_id", event_id);
    if let Some(event_type) = event_type {
        span.record("event_type", event_type);
    }
}

/// The one place an ingress outcome becomes HTTP: 200 with the event id, or the problem. Counts
/// it, and times it from `started` (the body read: a slow sender's upload is its own, bounded by
/// `http.body_read_timeout_ms`) to the answer: verification and the durable publish, what an
/// ingress latency objective is about.
fn answer(
    source: &'static str,
    route: &'static str,
    started: Instant,
    outcome: Result<String, Problem>,
) -> Response {
    let label = match &outcome {
        Ok(_) => "accepted",
        Err(p) if p.status == 400 => "rejected",
        Err(p) if p.status == 413 => "too_large",
        Err(_) => "unavailable",
    };
    metrics::counter!("dedup_webhooks_total", "source" => source, "outcome" => label).increment(1);
    let response = match outcome {
        Ok(id) => (
            StatusCode::OK,
            Json(serde_json::json!({ "received": true, "id": id })),
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
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Problem> {
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

fn invalid_signature(detail: String, check: &'static str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "urn:dedup-worker:problem:invalid-signature",
        "Invalid signature",
        detail,
    )
    .with_check(check)
}

/// A header as text; a header that is not visible ASCII fails like a malformed one.
fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, Problem> {
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

/// Publishes and waits until the transport says the message is durable; 503 otherwise (400 if
/// the transport refused this very message for what it carries).
async fn publish(state: &IngressState, mut message: OutgoingMessage) -> Result<(), Problem> {
    // Logged in the receive span, which carries the event's key and type. The message carries
    // the enqueue span's context, which the consumer's span continues.
    let span = tracing::info_span!("enqueue", otel.kind = "producer");
    message.traceparent = traces::traceparent_of(&span);
    bounded(state.publish_timeout, state.transport.publish(message))
        .instrument(span)
        .await
        .map_err(|error| match error {
            TransportError::Rejected(reason) => {
                tracing::warn!(%reason, "transport refused webhook; answering 400");
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "urn:dedup-worker:problem:invalid-payload",
                    "Invalid payload",
                    "the event cannot be stored as sent",
                )
                .with_check("payload_storable")
            }
            error => {
                // The cause is logged; the sender learns only that it should retry.
                tracing::warn!(%error, "could not enqueue webhook; answering 503");
                unavailable(&error)
            }
        })
}

/// 400 for a source, id or type that [`check_event_field`] refuses; `check` names the field.
fn checked(field: EventField, value: &str, check: &'static str) -> Result<(), Problem> {
    check_event_field(field, value).map_err(|error: InvalidEventField| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "urn:dedup-worker:problem:invalid-payload",
            "Invalid payload",
            error.to_string(),
        )
        .with_check(check)
    })
}

async fn receive_stripe(
    state: &IngressState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<String, Problem> {
    let body = read_body(body)?;
    let header = header_text(headers, "stripe-signature")?;
    let provider = &state.stripe;
    let verified = verify_delivery(
        header,
        &body,
        &provider.secrets,
        provider.tolerance_secs,
        (state.clock)(),
    )
    .map_err(|e| invalid_signature(e.to_string(), e.check()))?;
    // A snapshot event or a thin one (an event notification): the key of a thin event is the
    // snapshot event it stands beside, so the pair is handled once (see `crate::stripe::shape`).
    let head = StripeEventHead::read(&body).map_err(|error| {
        let check = match error {
            StripeShapeError::NotJson(_) => "payload_json",
            StripeShapeError::NoId => "payload_id",
            StripeShapeError::BadSnapshotEvent => "payload_snapshot_event",
        };
        Problem::new(
            StatusCode::BAD_REQUEST,
            "urn:dedup-worker:problem:invalid-payload",
            "Invalid payload",
            error.to_string(),
        )
        .with_check(check)
    })?;
    checked(EventField::Id, head.own_id(), "payload_id")?;
    let dedup_id = head.dedup_id().to_owned();
    checked(EventField::Id, &dedup_id, "payload_snapshot_event")?;
    if let Some(event_type) = &head.event_type {
        checked(EventField::Type, event_type, "payload_type")?;
    }
    record_event(&dedup_id, head.event_type.as_deref());
    let message = OutgoingMessage {
        source: Some(provider.source.to_owned()),
        message_id: Some(dedup_id.clone()),
        message_type: head.event_type.map(Cow::into_owned),
        payload: body,
        traceparent: None,
        // What verified, so the consumer can check that Stripe signed these bytes before it
        // trusts their `created` (see `crate::store::dedup`).
        stripe_signature: Some(verified.compact()),
    };
    publish(state, message).await?;
    Ok(dedup_id)
}

/// Standard Webhooks: the dedup key is the `webhook-id` header; the body is not required to be
/// JSON, but its `type` is kept when it is.
async fn receive_standard(
    state: &IngressState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<String, Problem> {
    let Some(provider) = &state.standard else {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "urn:dedup-worker:problem:not-configured",
            "Not configured",
            "no Standard Webhooks secret or public key is configured",
        ));
    };
    let body = read_body(body)?;
    let received = StandardHeaders {
        id: header_text(headers, "webhook-id")?,
        timestamp: header_text(headers, "webhook-timestamp")?,
        signature: header_text(headers, "webhook-signature")?,
    };
    verify_standard_signature(
        received,
        &body,
        provider.verifying_keys(),
        provider.tolerance_secs,
        (state.clock)(),
    )
    .map_err(|e| invalid_signature(e.to_string(), e.check()))?;
    let id = received.id.unwrap_or_default().to_owned();
    checked(EventField::Id, &id, "webhook_id")?;
    let event_type = serde_json::from_slice::<TypeOnly>(&body)
        .ok()
        .and_then(|e| e.event_type.map(Cow::into_owned));
    if let Some(event_type) = &event_type {
        checked(EventField::Type, event_type, "payload_type")?;
    }
    record_event(&id, event_type.as_deref());
    let message = OutgoingMessage {
        source: Some(provider.source.clone()),
        message_id: Some(id.clone()),
        message_type: event_type,
        payload: body,
        traceparent: None,
        stripe_signature: None,
    };
    publish(state, message).await?;
    Ok(id)
}

fn unavailable(_error: &TransportError) -> Problem {
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
