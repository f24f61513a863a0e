//! `POST /webhooks/stripe` and `POST /webhooks/standard`, and the router that adds the named
//! sources' `POST /webhooks/{name}` ([`super::sources`]) beside them; what every route does
//! around its own verification is [`super::deliver`]'s, the operational routes
//! [`crate::http::ops`]'s.
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
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use serde::Deserialize;
use tracing::Instrument;

pub use super::deliver::Clock;
use super::deliver::{
    answer, checked, header_text, invalid_payload, invalid_signature, publish, read_body,
    receive_span, record_event, Accepted,
};
use super::sources::{self, Sources};
use super::standard::StandardProvider;
use super::stripe::StripeProvider;
use crate::event::EventField;
use crate::http::problem::Problem;
use crate::queue::{OutgoingMessage, Transport};
use crate::signature::standard::{verify_standard_signature, StandardHeaders};
use crate::signature::stripe::verify_delivery;
use crate::stripe::{StripeEventHead, StripeShapeError};

/// What the webhook routes share.
#[derive(Clone)]
pub struct IngressState {
    /// Where verified events are published.
    pub transport: Arc<dyn Transport>,
    /// `/webhooks/stripe`: Stripe's signing secrets and tolerance.
    pub stripe: StripeProvider,
    /// `/webhooks/standard`, when Standard Webhooks secrets or public keys are configured.
    pub standard: Option<StandardProvider>,
    /// `/webhooks/{name}`: the named sources (`[sources.NAME]`), none by default.
    pub sources: Sources,
    /// The longest a publish may wait on the transport before the sender is told to retry.
    pub publish_timeout: Duration,
    /// Now, for the schemes that sign a timestamp.
    pub clock: Clock,
}

/// Builds the webhook routes: `/webhooks/stripe`, `/webhooks/standard` when configured, and
/// `/webhooks/{name}` when a named source is (a fixed path wins over it, and the configuration
/// refuses a source named as one).
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
    let named = sources::router(
        sources::SourcesState {
            transport: state.transport.clone(),
            sources: state.sources.clone(),
            publish_timeout: state.publish_timeout,
            clock: state.clock.clone(),
        },
        body_limit,
    );
    router.with_state(state).merge(named)
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
    answer(
        crate::stripe::SOURCE,
        "/webhooks/stripe",
        started,
        outcome.map(Accepted::Received),
    )
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
    answer(
        "standard",
        "/webhooks/standard",
        started,
        outcome.map(Accepted::Received),
    )
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
        invalid_payload(error.to_string(), check)
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
        sender_headers: crate::event::SenderHeaders::default(),
    };
    publish(state.transport.as_ref(), state.publish_timeout, message).await?;
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
        sender_headers: crate::event::SenderHeaders::default(),
    };
    publish(state.transport.as_ref(), state.publish_timeout, message).await?;
    Ok(id)
}
