//! FIFO queues (`….fifo`): which messages SQS keeps in order, and which it drops as duplicates.
//!
//! * **Message group.** SQS delivers a group's messages in order, one in-flight batch at a time,
//!   and holds the group's later messages until earlier ones are deleted. One group for all
//!   events would serialise everything behind the slowest; so the group is the event's *object*
//!   (the value at `transport.sqs_message_group_pointer`, by default `/data/object/id`: the
//!   customer, subscription or invoice): one object's events stay in order, other objects'
//!   events do not wait behind them. An event without that value (not JSON, no object) is its
//!   own group: nothing to keep it in order with.
//! * **Deduplication id.** `source:id`: SQS drops a second send of the same event within its
//!   5-minute window; a duplicate arriving later is sent, and the consumer's dedup drops it.
//!   The same id under two sources is two events.
//!
//! Both are at most 128 characters of ASCII punctuation and alphanumerics for SQS; a value
//! outside that (an id with spaces, a long object id) is replaced by its SHA-256 in hex, which
//! keeps it unique and stable.

use sha2::{Digest, Sha256};

use crate::queue::OutgoingMessage;

/// `MessageGroupId` for `message`: the object at `pointer`, else the message id, else the
/// source.
pub(super) fn message_group_id(message: &OutgoingMessage, pointer: &str) -> String {
    let object = serde_json::from_slice::<serde_json::Value>(&message.payload)
        .ok()
        .and_then(|payload| match payload.pointer(pointer)? {
            serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
    let group = object
        .or_else(|| message.message_id.clone())
        .or_else(|| message.source.clone())
        .unwrap_or_else(|| "events".to_owned());
    fifo_token(&group)
}

/// `MessageDeduplicationId` for the event `id` of `source`.
pub(super) fn message_deduplication_id(source: Option<&str>, id: &str) -> String {
    fifo_token(&format!("{}:{id}", source.unwrap_or("events")))
}

/// `value` if SQS accepts it as a group or deduplication id, else its SHA-256 in hex.
fn fifo_token(value: &str) -> String {
    let acceptable =
        !value.is_empty() && value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic());
    if acceptable {
        value.to_owned()
    } else {
        Sha256::digest(value.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &str) -> OutgoingMessage {
        OutgoingMessage {
            source: Some("stripe".into()),
            message_id: Some("evt_1".into()),
            message_type: Some("customer.subscription.updated".into()),
            payload: bytes::Bytes::from(payload.to_owned()),
            traceparent: None,
            stripe_signature: None,
            sender_headers: crate::event::SenderHeaders::default(),
        }
    }

    #[test]
    fn the_group_is_the_object_else_the_event_and_ids_sqs_refuses_are_hashed() {
        let pointer = "/data/object/id";
        assert_eq!(
            message_group_id(&message(r#"{"data":{"object":{"id":"sub_1"}}}"#), pointer),
            "sub_1"
        );
        assert_eq!(
            message_group_id(&message(r#"{"data":{"object":{"id":7}}}"#), pointer),
            "7"
        );
        assert_eq!(
            message_group_id(&message(r#"{"id":"evt_1"}"#), pointer),
            "evt_1"
        );
        assert_eq!(message_group_id(&message("not json"), pointer), "evt_1");
        let long = "x".repeat(129);
        let hashed = message_group_id(
            &message(&format!(r#"{{"data":{{"object":{{"id":"{long}"}}}}}}"#)),
            pointer,
        );
        assert_eq!(hashed.len(), 64);
        assert!(hashed.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(
            message_deduplication_id(Some("stripe"), "evt_1"),
            "stripe:evt_1"
        );
        assert_ne!(
            message_deduplication_id(Some("stripe"), "evt 1"),
            message_deduplication_id(Some("stripe"), "evt_1")
        );
        assert_eq!(message_deduplication_id(Some("stripe"), "evt 1").len(), 64);
    }
}
