//! The headers this transport writes on each message, and how they are read back: what the
//! AMQP properties (`message_id`, `type`) cannot carry. A foreign producer may set any of them
//! to anything, so a header of an unexpected type reads as absent.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::queue::OutgoingMessage;
use crate::telemetry::traces;

/// Header carrying the event source (first half of the dedup key).
pub(super) const SOURCE_HEADER: &str = "x-dedup-source";
/// Header carrying how many deliveries a republished retry already had.
pub(super) const ATTEMPTS_HEADER: &str = "x-dedup-attempts";
/// Header carrying how many deliveries of the message ended unsettled (`x-delivery-count`)
/// before an unhandled give-back republished it, so the copy keeps counting towards
/// `transport.delivery_limit` from there (see `give_back.rs`).
pub(super) const RETURNED_HEADER: &str = "x-dedup-returned";
/// Header carrying when the message was first published (Unix ms; a retry's copy keeps it).
pub(super) const ENQUEUED_HEADER: &str = "x-dedup-enqueued-ms";
/// Header carrying the compact `Stripe-Signature` the ingress verified (a retry's copy keeps
/// it, so every delivery of a message is looked up the same way).
pub(super) const STRIPE_SIGNATURE_HEADER: &str = "x-dedup-stripe-signature";
/// Header carrying the sender's delivery headers (`X-GitHub-Delivery`, …), in
/// [`crate::event::SenderHeaders::to_wire`]'s form: one header, so a sender's names never mix
/// with this transport's own or the broker's `x-` headers.
pub(super) const SENDER_HEADERS_HEADER: &str = "x-dedup-sender-headers";

/// Milliseconds since the Unix epoch, for [`ENQUEUED_HEADER`].
pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub(super) fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// The headers of `message`, published after `attempts` deliveries (0: a new message) of which
/// `returned` ended unsettled (a give-back's copy), first published at `enqueued_at` (Unix ms;
/// `None` for a copy of a message that did not say).
pub(super) fn written(
    message: &OutgoingMessage,
    (attempts, returned): (u32, u32),
    enqueued_at: Option<i64>,
) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(source) = &message.source {
        headers.insert(SOURCE_HEADER.into(), long(source));
    }
    if let Some(at) = enqueued_at {
        headers.insert(ENQUEUED_HEADER.into(), AMQPValue::LongLongInt(at));
    }
    if let Some(traceparent) = &message.traceparent {
        headers.insert(traces::TRACEPARENT.into(), long(traceparent));
    }
    if let Some(signature) = &message.stripe_signature {
        headers.insert(STRIPE_SIGNATURE_HEADER.into(), long(signature));
    }
    if let Some(sender_headers) = message.sender_headers.to_wire() {
        headers.insert(SENDER_HEADERS_HEADER.into(), long(&sender_headers));
    }
    if attempts > 0 {
        headers.insert(
            ATTEMPTS_HEADER.into(),
            AMQPValue::LongLongInt(i64::from(attempts)),
        );
    }
    if returned > 0 {
        headers.insert(
            RETURNED_HEADER.into(),
            AMQPValue::LongLongInt(i64::from(returned)),
        );
    }
    headers
}

/// A text header (long or short string) of `headers`; `None` when absent or of another type.
pub(super) fn text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(&ShortString::from(name)) {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
        _ => None,
    }
}
