//! From a received [`Delivery`] to an [`Event`]: where the dedup key comes from, and what is
//! refused.
//!
//! Messages come from our own ingress but also from foreign producers on a shared queue, so
//! anything may arrive: text that is not JSON, JSON without an id, binary, ids the store cannot
//! hold. [`decode_delivery`] turns every such message into a [`DecodeError`] naming the reason,
//! and the consumer dead-letters it: it never reaches the batch's shared statements, where it
//! would fail its neighbours, and it never comes back to fail again.
//!
//! Stripe's shapes ([`crate::stripe::shape`]) are keyed by the change they carry, whichever
//! way they arrive and whatever id the transport carries ([`stripe_change`]): a snapshot event
//! by its id, a thin event by its `snapshot_event`, an Amazon EventBridge envelope of either by
//! its `detail`'s key. So every copy of one change (a webhook, its thin event, an EventBridge
//! copy on SQS, a foreign producer's republication under its own message id) claims one key,
//! and the dedup insert that claims it decides, whatever the interleaving: two copies in one
//! batch, or in two batches committing at once, are one new event and one duplicate. This
//! holds with the default `consumer.dedup_key_pointer` (`/id`); a pointer of the user's keys
//! every message by it. With `consumer.envelope = "eventbridge"` an envelope is also
//! unwrapped: its `detail` is the event (what the handler gets), under source `stripe`, the key
//! space of the webhook ingress; with `"none"` the handler gets the envelope.
//!
//! Where an earlier release keyed the same message differently, the event carries that key as
//! its [`Event::alias`], which the dedup insert looks up too (never records): the transport's
//! message id when it is not the change's key (releases before this one keyed by it), else the
//! message's other id (a thin event's own id, an envelope's `id`, which releases before the
//! change keying gave it). So a message handled before the upgrade, delivered again after it,
//! is a duplicate. An alias is a lookup of what is already committed: it cannot decide between
//! two copies in flight, which is why the key, not the alias, names the change.
//!
//! Bounded work whatever the message: one size check first ([`ConsumerOptions`]'s
//! `max_message_bytes`), then at most one JSON parse, only when the transport carried no id or
//! no type, under serde_json's recursion limit (128 levels); an envelope costs one parse of the
//! envelope and one of its `detail`'s head; a message under source `stripe`, or without a
//! message id, is read once more for its change (one borrowed parse, plus its `detail`'s head).

use std::collections::HashSet;

use crate::config::EnvelopeKind;
use crate::event::{check_event_field, Event, EventField, InvalidEventField};
use crate::queue::Delivery;
use crate::stripe::{
    eventbridge_envelope, stripe_change, EnvelopeError, EventBridgeEnvelope, StripeChange,
    StripeEventHead, StripeShapeError,
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

/// A batch decoded: its events, one per dedup key, and the deliveries that are not events.
pub(super) struct Decoded<'d> {
    /// The first delivery of each key in the batch, as an event.
    pub(super) events: Vec<(Event, &'d Delivery)>,
    /// Another delivery of a key already taken in the batch: a duplicate.
    pub(super) repeated: Vec<(Event, &'d Delivery)>,
    /// The deliveries that cannot become events, with the reason (they are dead-lettered).
    pub(super) undecodable: Vec<(&'d Delivery, DecodeError)>,
}

/// Stage 1 of the pipeline: each delivery [`decode_delivery`]d, in the batch's order.
pub(super) fn decode_batch<'d>(
    deliveries: &'d [Delivery],
    options: &ConsumerOptions,
) -> Decoded<'d> {
    let mut decoded = Decoded {
        events: Vec::new(),
        repeated: Vec::new(),
        undecodable: Vec::new(),
    };
    let mut keys_in_batch: HashSet<(String, String)> = HashSet::new();
    for delivery in deliveries {
        match decode_delivery(delivery, options) {
            Ok(event) => {
                if keys_in_batch.insert((event.source.clone(), event.id.clone())) {
                    decoded.events.push((event, delivery));
                } else {
                    decoded.repeated.push((event, delivery));
                }
            }
            Err(reason) => decoded.undecodable.push((delivery, reason)),
        }
    }
    decoded
}

/// The event a delivery carries: the dedup key is the change's key for Stripe's shapes (see
/// the module docs), else the transport's message id when it has one, else the string at
/// `options.dedup_key_pointer` in the JSON payload; the type is the transport's, else the
/// payload's `type`; the source is the producer's, else `options.source`. An EventBridge
/// envelope (when `options.envelope` says so) is unwrapped (`decode_eventbridge`). Each of them
/// must pass [`check_event_field`].
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
    let stripe_source = source == crate::stripe::SOURCE;
    // Read for a change only where one can be: under source `stripe` (any message may be a
    // Stripe event), or without a message id (an envelope names its source inside).
    let change = (options.dedup_key_pointer == "/id" && (stripe_source || message_id.is_none()))
        .then(|| stripe_change(&delivery.payload, stripe_source))
        .flatten()
        // A change whose key the store cannot hold is keyed by the general rule.
        .filter(|change| check_event_field(EventField::Id, &change.key).is_ok());
    // Parsed only when the transport did not carry both the id and the type and the message is
    // not a change (our own ingress always carries the id), and at most once.
    let needs_json = (message_id.is_none() && change.is_none()) || delivery.message_type.is_none();
    let (json, json_error) = if needs_json {
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
    let (id, alias) = match (change, message_id, &json) {
        (Some(StripeChange { key, other }), message_id, _) => {
            // The message id is the key releases before the change keying gave the message.
            let alias = match message_id {
                Some(id) if id != key => Some(id.to_owned()),
                _ => other,
            };
            (key, alias)
        }
        (None, Some(id), _) => (id.to_owned(), None),
        (None, None, Some(value)) => {
            let id = value
                .pointer(&options.dedup_key_pointer)
                .and_then(serde_json::Value::as_str)
                .filter(|id| !id.is_empty())
                .ok_or_else(no_id)?;
            (id.to_owned(), None)
        }
        (None, None, None) => return Err(json_error.map_or_else(no_id, DecodeError::NotJson)),
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
    // An alias the store could not hold is dropped, never a reason to refuse the message.
    let alias =
        alias.filter(|alias| *alias != id && check_event_field(EventField::Id, alias).is_ok());
    Ok(Event {
        source,
        id,
        event_type,
        payload: delivery.payload.clone(),
        delivery_attempt: delivery.attempts,
        alias,
        headers: delivery.sender_headers.clone(),
    })
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
        // The envelope's transport carried no sender's headers of Stripe's.
        headers: crate::event::SenderHeaders::default(),
    })
}

#[cfg(test)]
mod tests;
