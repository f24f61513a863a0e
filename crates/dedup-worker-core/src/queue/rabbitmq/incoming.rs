//! What the consuming side receives: `<queue>` and `<queue>.dead` merged into one stream, and
//! each delivery converted, with the transport's verdict on whether to give up on it.
//!
//! The delivery limit is enforced here, whatever the queue was declared with (see
//! [`super::topology`]): a delivery of `<queue>` whose `x-delivery-count` (deliveries of this
//! copy that ended unsettled: a crashed consumer, a failed step's requeue) is over
//! `transport.delivery_limit` is marked [`Delivery::give_up`], and the consumer dead-letters it
//! into the store before running its handler. A message the broker parked in `<queue>.dead`
//! (over the backstop limit it was declared with) is consumed too and given up on the same way,
//! so it lands in the store's dead letters, where `dlq list` shows it and `dlq redrive` replays
//! it. A retry copy republished through a retry bucket starts a count of its own: the limit
//! bounds crash loops of each copy, `consumer.max_attempts` bounds handler retries.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::Channel;

use super::headers::{
    self, ATTEMPTS_HEADER, ENQUEUED_HEADER, RETURNED_HEADER, SENDER_HEADERS_HEADER, SOURCE_HEADER,
    STRIPE_SIGNATURE_HEADER,
};
use super::{broker_failed, unavailable, ConsumerSide};
use crate::event::SenderHeaders;
use crate::queue::{Delivery, DeliveryTag, TransportError};
use crate::telemetry::traces;

/// Which queue a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// `<queue>`: an event to handle.
    Main,
    /// `<queue>.dead`: the broker gave up on it (its `x-delivery-limit`); the consumer moves it
    /// into the store's dead letters.
    Parked,
}

/// One item of the merged consumer stream; `Err` when a consumer failed or ended.
pub(super) type Incoming = Result<(Origin, lapin::message::Delivery), TransportError>;

/// The dead letter reason of a message the broker moved to `<queue>.dead`.
pub const BROKER_DEAD_LETTERED: &str = "delivery limit exceeded (the broker dead-lettered it)";

/// A consumer of `queue` as a stream of [`Incoming`] that reports its own end as an error
/// (one queue's consumer cancelled must not go unnoticed while the other keeps going), and its
/// consumer tag (to cancel it).
pub(super) async fn consume(
    channel: &Channel,
    queue: &str,
    origin: Origin,
) -> Result<(ShortString, BoxStream<'static, Incoming>), TransportError> {
    let consumer = channel
        .basic_consume(
            queue.into(),
            ShortString::from(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(unavailable)?;
    let ended = broker_failed(format!("the consumer of {queue} ended"));
    let tag = consumer.tag();
    let stream = consumer
        .map(move |item| item.map(|d| (origin, d)).map_err(unavailable))
        .chain(futures::stream::once(async move { Err(ended) }))
        .boxed();
    Ok((tag, stream))
}

/// The transport's view of a delivery from `side`'s channel; the tag is recorded as unsettled.
pub(super) fn convert(
    side: &ConsumerSide,
    delivery_limit: u32,
    (origin, d): (Origin, lapin::message::Delivery),
) -> Delivery {
    let headers = d.properties.headers().clone().unwrap_or_default();
    let header = |name: &str| headers.inner().get(&ShortString::from(name)).cloned();
    let source = headers::text(&headers, SOURCE_HEADER);
    let as_u32 = |v: Option<AMQPValue>| -> u32 {
        match v {
            Some(AMQPValue::LongLongInt(n)) => u32::try_from(n).unwrap_or(0),
            Some(AMQPValue::LongInt(n)) => u32::try_from(n).unwrap_or(0),
            Some(AMQPValue::LongUInt(n)) => n,
            _ => 0,
        }
    };
    // Quorum queues count the deliveries of this copy that ended unsettled (a crashed or
    // failed consumer) in x-delivery-count; republished retries carry ours. A copy an unhandled
    // give-back republished carries the count of its original in RETURNED_HEADER.
    let returned = header("x-delivery-count");
    let limit = delivery_limit;
    let returned_before = as_u32(returned.clone()).saturating_add(as_u32(header(RETURNED_HEADER)));
    let give_up = match (origin, returned_before) {
        (Origin::Parked, _) => Some(BROKER_DEAD_LETTERED.to_owned()),
        // The broker's own limit may be another (the queue keeps the one it was declared
        // with), or none: the setting applies here, before any handler runs.
        (Origin::Main, returned) if returned > limit => Some(format!(
            "delivery limit exceeded: {returned} deliveries ended unsettled; \
             transport.delivery_limit is {limit}"
        )),
        (Origin::Main, _) => None,
    };
    let redelivered = match returned {
        None if d.redelivered => 1,
        other => as_u32(other),
    };
    let attempts = as_u32(header(ATTEMPTS_HEADER)) + redelivered + 1;
    // A foreign producer's header is parsed and formatted again, or dropped.
    let traceparent = match header(traces::TRACEPARENT) {
        Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(traces::valid_traceparent),
        Some(AMQPValue::ShortString(s)) => traces::valid_traceparent(s.as_str()),
        _ => None,
    };
    let enqueued_at = match header(ENQUEUED_HEADER) {
        Some(AMQPValue::LongLongInt(ms)) => Some(ms),
        _ => None,
    };
    if let Ok(mut tags) = side.tags.lock() {
        tags.received_returned(d.delivery_tag, returned_before);
    }
    Delivery {
        tag: DeliveryTag::Amqp {
            generation: side.generation,
            tag: d.delivery_tag,
        },
        source,
        message_id: d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned()),
        message_type: d.properties.kind().as_ref().map(|s| s.as_str().to_owned()),
        payload: Bytes::from(d.data),
        attempts,
        enqueued_at,
        defect: None,
        give_up,
        traceparent,
        stripe_signature: headers::text(&headers, STRIPE_SIGNATURE_HEADER),
        sender_headers: SenderHeaders::from_wire(
            headers::text(&headers, SENDER_HEADERS_HEADER).as_deref(),
        ),
    }
}
