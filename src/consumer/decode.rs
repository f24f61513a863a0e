//! From a received [`Delivery`] to an [`Event`]: where the dedup key comes from, and what is
//! refused.
//!
//! Messages come from our own ingress but also from foreign producers on a shared queue, so
//! anything may arrive: text that is not JSON, JSON without an id, binary, ids the store cannot
//! hold. [`decode_delivery`] turns every such message into a [`DecodeError`] naming the reason,
//! and the consumer dead-letters it: it never reaches the batch's shared statements, where it
//! would fail its neighbours, and it never comes back to fail again.
//!
//! Stripe's shapes ([`crate::stripe::shape`]) are keyed as Stripe keys them, whichever way they
//! arrive: a thin event under its `snapshot_event`, so that a change delivered as a snapshot
//! event and as a thin one is handled once; and with `consumer.envelope = "eventbridge"`, an
//! Amazon EventBridge envelope is unwrapped: its `detail` is the event (what the handler gets),
//! keyed as a Stripe event under source `stripe`, the key space of the webhook ingress.
//!
//! Where an earlier release or another setting keyed the same message differently, the event
//! carries that key as its [`Event::alias`], which the dedup insert looks up too (never
//! records): a thin event's other id (its own id, the key before thin events were keyed by
//! their snapshot event, or the reverse for a message that still carries its own id), and an
//! EventBridge envelope's other id (the envelope's `id` with `consumer.envelope = "none"`, the
//! `detail`'s key with `"eventbridge"`). So a message handled before such a change, and
//! delivered again after it, is a duplicate.
//!
//! Bounded work whatever the message: one size check first ([`ConsumerOptions`]'s
//! `max_message_bytes`), then at most one JSON parse, only when the transport carried no id or
//! no type, under serde_json's recursion limit (128 levels); an envelope costs one parse of the
//! envelope and one of its `detail`'s head; a Stripe event's head is read once more for its
//! alias.

use serde::Deserialize;

use crate::config::EnvelopeKind;
use crate::event::{check_event_field, Event, EventField, InvalidEventField};
use crate::queue::Delivery;
use crate::stripe::shape::EVENTBRIDGE_SOURCE_PREFIX;
use crate::stripe::shape::THIN_EVENT_OBJECT;
use crate::stripe::{
    eventbridge_envelope, EnvelopeError, EventBridgeEnvelope, StripeEventHead, StripeShapeError,
};

use super::ConsumerOptions;

/// Why a delivery cannot become an event. Its message is dead-lettered with this text.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The transport could not read the message as sent (see [`Delivery::defect`]).
    #[error("{0}")]
    Defect(String),
    /// Larger than `consumer.max_message_bytes`: not parsed at all.
    #[error("the message is {len} bytes; consumer.max_message_bytes is {max}")]
    TooLarge { len: usize, max: usize },
    /// No id from the transport, and the payload could not be read to find one.
    #[error("no message id, and the payload is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// No id from the transport, and none in the payload.
    #[error("no message id, and no non-empty string at {pointer} in the payload")]
    NoId { pointer: String },
    /// An id, type or source the store cannot hold.
    #[error(transparent)]
    Field(#[from] InvalidEventField),
    /// `consumer.envelope = "eventbridge"`: an envelope that is not one of Stripe's.
    #[error("EventBridge envelope: {0}")]
    Envelope(#[from] EnvelopeError),
    /// The `detail` of a Stripe EventBridge envelope is not a Stripe event that can be keyed.
    #[error("the EventBridge envelope's detail: {0}")]
    Detail(#[source] StripeShapeError),
}

/// The event a delivery carries: the dedup key is the transport's message id when it has one,
/// else the string at `options.dedup_key_pointer` in the JSON payload (for a Stripe thin event
/// and the default pointer `/id`, its `snapshot_event` when it has one); the type is the
/// transport's, else the payload's `type`; the source is the producer's, else
/// `options.source`. An EventBridge envelope (when `options.envelope` says so) is keyed by its
/// `detail` alone (`decode_eventbridge`). Each of them must pass [`check_event_field`].
pub fn decode_delivery(
    delivery: &Delivery,
    options: &ConsumerOptions,
) -> Result<Event, DecodeError> {
    if let Some(defect) = &delivery.defect {
        return Err(DecodeError::Defect(defect.clone()));
    }
    if delivery.payload.len() > options.max_message_bytes {
        return Err(DecodeError::TooLarge {
            len: delivery.payload.len(),
            max: options.max_message_bytes,
        });
    }
    if options.envelope == EnvelopeKind::Eventbridge {
        if let Some(envelope) = eventbridge_envelope(&delivery.payload)? {
            return decode_eventbridge(delivery, envelope);
        }
    }
    let source = delivery
        .source
        .clone()
        .unwrap_or_else(|| options.source.clone());
    check_event_field(EventField::Source, &source)?;

    let message_id = delivery.message_id.as_deref().filter(|id| !id.is_empty());
    // Parsed only when the transport did not carry both the id and the type (our own ingress
    // always carries the id), and at most once.
    let (json, json_error) = if message_id.is_none() || delivery.message_type.is_none() {
        match serde_json::from_slice::<serde_json::Value>(&delivery.payload) {
            Ok(value) => (Some(value), None),
            Err(error) => (None, Some(error)),
        }
    } else {
        (None, None)
    };
    let no_id = || DecodeError::NoId {
        pointer: options.dedup_key_pointer.clone(),
    };
    let id = match (message_id, &json) {
        (Some(id), _) => id.to_owned(),
        (None, Some(value)) => thin_event_snapshot(value, &source, options)
            .or_else(|| value.pointer(&options.dedup_key_pointer)?.as_str())
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .ok_or_else(no_id)?,
        (None, None) => return Err(json_error.map_or_else(no_id, DecodeError::NotJson)),
    };
    check_event_field(EventField::Id, &id)?;
    let event_type = match &delivery.message_type {
        Some(event_type) => event_type.clone(),
        None => json
            .as_ref()
            .and_then(|v| v.get("type"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    };
    check_event_field(EventField::Type, &event_type)?;
    let alias = alias_of(&delivery.payload, json.as_ref(), &source, &id);
    Ok(Event {
        source,
        id,
        event_type,
        payload: delivery.payload.clone(),
        delivery_attempt: delivery.attempts,
        alias,
    })
}

/// The key the same message had under the other rule (see the module docs), when it differs
/// from `key` and could be one: a Stripe thin event's other id (read from `payload`), or, for
/// a message keyed by its JSON (`value`), a Stripe EventBridge envelope's other id.
fn alias_of(
    payload: &[u8],
    value: Option<&serde_json::Value>,
    source: &str,
    key: &str,
) -> Option<String> {
    let thin = || {
        let head = StripeEventHead::read(payload).ok()?;
        head.other_key(key).map(str::to_owned)
    };
    let envelope = || {
        let value = value?;
        let from_stripe = value.get("source")?.as_str()?;
        if !from_stripe.starts_with(EVENTBRIDGE_SOURCE_PREFIX) {
            return None;
        }
        let detail = StripeEventHead::deserialize(value.get("detail")?).ok()?;
        let detail_key = detail.dedup_id();
        let envelope_id = value.get("id")?.as_str()?;
        match key {
            k if k == envelope_id => Some(detail_key.to_owned()),
            k if k == detail_key => Some(envelope_id.to_owned()),
            _ => None,
        }
    };
    let alias = if source == crate::stripe::SOURCE {
        thin().or_else(envelope)
    } else {
        envelope()
    };
    alias.filter(|alias| alias != key && check_event_field(EventField::Id, alias).is_ok())
}

/// The `snapshot_event` of a Stripe thin event keyed by the default pointer: the key its
/// snapshot event has, so the pair is one change (the ingress keys it the same way, through the
/// message id; this is for producers that publish Stripe's thin events without one).
fn thin_event_snapshot<'v>(
    value: &'v serde_json::Value,
    source: &str,
    options: &ConsumerOptions,
) -> Option<&'v str> {
    let keyed_as_stripe = source == crate::stripe::SOURCE && options.dedup_key_pointer == "/id";
    let thin = value.get("object").and_then(serde_json::Value::as_str) == Some(THIN_EVENT_OBJECT);
    (keyed_as_stripe && thin)
        .then(|| value.get("snapshot_event")?.as_str())
        .flatten()
        .filter(|id| !id.is_empty())
}

/// The Stripe event in an EventBridge envelope's `detail`: source `stripe`, the key Stripe's
/// shape gives ([`StripeEventHead::dedup_id`]), its type, and the `detail` as the payload. The
/// transport's own id and type are not used: on SQS they are EventBridge's, not Stripe's.
fn decode_eventbridge(
    delivery: &Delivery,
    envelope: EventBridgeEnvelope,
) -> Result<Event, DecodeError> {
    let EventBridgeEnvelope {
        id: envelope_id,
        detail,
    } = envelope;
    let head = StripeEventHead::read(&detail).map_err(DecodeError::Detail)?;
    let id = head.dedup_id().to_owned();
    check_event_field(EventField::Id, &id)?;
    let event_type = head.event_type.as_deref().unwrap_or_default().to_owned();
    check_event_field(EventField::Type, &event_type)?;
    drop(head);
    // With `consumer.envelope = "none"`, the envelope was keyed by its own id.
    let alias = envelope_id
        .filter(|alias| *alias != id && check_event_field(EventField::Id, alias).is_ok());
    Ok(Event {
        source: crate::stripe::SOURCE.to_owned(),
        id,
        event_type,
        payload: detail,
        delivery_attempt: delivery.attempts,
        alias,
    })
}

#[cfg(test)]
mod tests;
