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
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use proptest::prelude::*;

    use crate::proptest_support::config;

    use super::*;
    use crate::queue::DeliveryTag;

    fn options() -> ConsumerOptions {
        ConsumerOptions {
            source: "stripe".into(),
            dedup_key_pointer: "/id".into(),
            batch_size: 10,
            poll_interval: Duration::from_millis(10),
            max_attempts: 3,
            retry_base: Duration::from_millis(10),
            retry_max: Duration::from_millis(10),
            max_message_bytes: 1024,
            lease: Duration::from_secs(10),
            step_timeout: Duration::from_secs(30),
            envelope: EnvelopeKind::None,
        }
    }

    fn delivery(message_id: Option<&str>, payload: &[u8]) -> Delivery {
        Delivery {
            tag: DeliveryTag::Row {
                id: 1,
                claim_token: 1,
            },
            source: None,
            message_id: message_id.map(str::to_owned),
            message_type: None,
            payload: Bytes::copy_from_slice(payload),
            attempts: 1,
            enqueued_at: None,
            defect: None,
            give_up: None,
            traceparent: None,
            stripe_signature: None,
        }
    }

    fn reason(d: &Delivery) -> String {
        match decode_delivery(d, &options()) {
            Ok(event) => panic!("decoded {event:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn the_key_comes_from_the_message_id_or_the_pointer() {
        let from_property = decode_delivery(&delivery(Some("evt_1"), b"not json"), &options());
        assert_eq!(from_property.map(|e| e.id).ok(), Some("evt_1".into()));
        let from_body = decode_delivery(
            &delivery(None, br#"{"id":"evt_2","type":"invoice.paid"}"#),
            &options(),
        )
        .expect("decodes");
        assert_eq!(
            (from_body.id.as_str(), from_body.event_type.as_str()),
            ("evt_2", "invoice.paid")
        );
        assert_eq!(from_body.source, "stripe");
    }

    #[test]
    fn foreign_messages_are_refused_with_their_reason() {
        assert!(reason(&delivery(None, b"hello")).contains("not JSON"));
        assert!(reason(&delivery(None, br#"{"type":"x"}"#)).contains("no non-empty string at /id"));
        assert!(reason(&delivery(None, &[0xff, 0x00, 0x9c])).contains("not JSON"));
        assert!(reason(&delivery(None, br#"{"id":"evt_\u0000x"}"#)).contains("U+0000"));
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(300));
        assert!(reason(&delivery(None, long.as_bytes())).contains("300 bytes"));
        assert!(reason(&delivery(None, &[b'['; 2000])).contains("max_message_bytes"));
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        assert!(reason(&delivery(None, deep.as_bytes())).contains("recursion limit"));
        let mut broken = delivery(Some("evt_1"), b"!!");
        broken.defect = Some("not base64".into());
        assert_eq!(reason(&broken), "not base64");
        let mut bad_type = delivery(Some("evt_1"), b"{}");
        bad_type.message_type = Some("a\u{0}".into());
        assert!(reason(&bad_type).contains("event type"));
        let mut bad_source = delivery(Some("evt_1"), b"{}");
        bad_source.source = Some(String::new());
        assert!(reason(&bad_source).contains("event source is empty"));
    }

    #[test]
    fn a_thin_event_without_a_message_id_is_keyed_by_its_snapshot_event() {
        let thin = br#"{"id":"evt_thin","object":"v2.core.event","type":"v1.invoice.paid","snapshot_event":"evt_A"}"#;
        let event = decode_delivery(&delivery(None, thin), &options()).expect("decodes");
        assert_eq!(
            (event.id.as_str(), event.source.as_str()),
            ("evt_A", "stripe")
        );
        // Only as Stripe keys it: another source, or a pointer of the user's, keeps its own rule.
        let mut other = delivery(None, thin);
        other.source = Some("github".into());
        assert_eq!(decode_delivery(&other, &options()).unwrap().id, "evt_thin");
        let nested = ConsumerOptions {
            dedup_key_pointer: "/related_object/id".into(),
            ..options()
        };
        let with_object = br#"{"id":"evt_thin","object":"v2.core.event","snapshot_event":"evt_A","related_object":{"id":"in_1"}}"#;
        assert_eq!(
            decode_delivery(&delivery(None, with_object), &nested)
                .unwrap()
                .id,
            "in_1"
        );
        // A v2 thin event (no snapshot) and a snapshot event keep their own ids.
        let v2 = br#"{"id":"evt_v2","object":"v2.core.event","snapshot_event":""}"#;
        assert_eq!(
            decode_delivery(&delivery(None, v2), &options()).unwrap().id,
            "evt_v2"
        );
        let snapshot = br#"{"id":"evt_A","object":"event","snapshot_event":"evt_B"}"#;
        assert_eq!(
            decode_delivery(&delivery(None, snapshot), &options())
                .unwrap()
                .id,
            "evt_A"
        );
    }

    #[test]
    fn an_eventbridge_envelope_is_its_stripe_event() {
        let eventbridge = ConsumerOptions {
            envelope: EnvelopeKind::Eventbridge,
            source: "queue-default".into(),
            ..options()
        };
        let detail = r#"{"id":"evt_1","object":"event","type":"invoice.paid"}"#;
        let envelope = |detail: &str| {
            format!(
                r#"{{"version":"0","id":"6a7e8feb-b491","detail-type":"x","source":"aws.partner/stripe.com/ed_1","detail":{detail}}}"#
            )
        };
        // EventBridge's own id and a transport id are not the key; the detail is the payload.
        let mut d = delivery(Some("sqs-message-id"), envelope(detail).as_bytes());
        d.message_type = Some("sqs-type".into());
        let event = decode_delivery(&d, &eventbridge).expect("decodes");
        assert_eq!(
            (
                event.source.as_str(),
                event.id.as_str(),
                event.event_type.as_str()
            ),
            ("stripe", "evt_1", "invoice.paid")
        );
        assert_eq!(event.payload, detail.as_bytes());
        let thin = r#"{"id":"evt_thin","object":"v2.core.event","type":"v1.invoice.paid","snapshot_event":"evt_1"}"#;
        let event =
            decode_delivery(&delivery(None, envelope(thin).as_bytes()), &eventbridge).unwrap();
        assert_eq!(event.id, "evt_1");
        // Without the setting an envelope is a plain message; a plain event passes either way.
        let plain =
            decode_delivery(&delivery(None, envelope(detail).as_bytes()), &options()).unwrap();
        assert_eq!(plain.id, "6a7e8feb-b491");
        assert_eq!(
            decode_delivery(&delivery(None, detail.as_bytes()), &eventbridge)
                .unwrap()
                .id,
            "evt_1"
        );
        // What cannot be keyed is refused with its reason (and dead-lettered).
        let refuse = |body: String| {
            decode_delivery(&delivery(None, body.as_bytes()), &eventbridge)
                .unwrap_err()
                .to_string()
        };
        assert!(refuse(envelope(r#"{"object":"event"}"#)).contains("no string `id`"));
        assert!(refuse(envelope(r#""evt_1""#)).contains("not a JSON object"));
        let nul = r#"{"id":"evt_\u0000","object":"event"}"#;
        assert!(refuse(envelope(nul)).contains("U+0000"));
        let foreign = r#"{"source":"aws.ec2","detail":{"id":"i-1"}}"#.to_owned();
        assert!(refuse(foreign).contains("not a Stripe partner event source"));
    }

    proptest! {
        #![proptest_config(config(256))]
        /// Whatever arrives, decoding returns, and what it accepts can be stored.
        #[test]
        fn never_panics_and_accepts_only_storable_keys(
            payload in proptest::collection::vec(any::<u8>(), 0..2048),
            message_id in proptest::option::of(any::<String>()),
            message_type in proptest::option::of(any::<String>()),
        ) {
            let mut d = delivery(message_id.as_deref(), &payload);
            d.message_type = message_type;
            if let Ok(event) = decode_delivery(&d, &options()) {
                for (field, value) in [
                    (EventField::Source, &event.source),
                    (EventField::Id, &event.id),
                    (EventField::Type, &event.event_type),
                ] {
                    prop_assert!(check_event_field(field, value).is_ok());
                }
            }
        }
    }
}
