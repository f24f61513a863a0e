//! What a received SQS message becomes: a [`Delivery`], its attributes read back as
//! [`super::SqsQueue::publish`] wrote them. Everything here comes from the queue, so from
//! whoever can send to it: each value is checked (a body marked base64 that is not, a
//! `traceparent` that is not one) rather than trusted.

use aws_sdk_sqs::types::MessageSystemAttributeName;
use base64::Engine;
use bytes::Bytes;

use super::{
    ENCODING_ATTRIBUTE, ID_ATTRIBUTE, SENDER_HEADERS_ATTRIBUTE, SOURCE_ATTRIBUTE,
    STRIPE_SIGNATURE_ATTRIBUTE, TRACE_ATTRIBUTE, TYPE_ATTRIBUTE,
};
use crate::event::SenderHeaders;
use crate::queue::{Delivery, DeliveryTag};
use crate::telemetry::traces;

/// The delivery of `message`, or `None` for a message without a receipt handle (it could
/// never be acked; SQS always sends one).
pub(super) fn delivery_of(message: &aws_sdk_sqs::types::Message) -> Option<Delivery> {
    let receipt = message.receipt_handle()?.to_owned();
    let attributes = message.message_attributes();
    let attribute = |name: &str| {
        attributes
            .and_then(|a| a.get(name))
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    let body = message.body().unwrap_or_default();
    // A body marked base64 that is not is kept as received and dead-lettered with the
    // reason: dropped here, it would come back after every lease, forever.
    let mut defect = None;
    let payload = if attribute(ENCODING_ATTRIBUTE).as_deref() == Some("base64") {
        match base64::engine::general_purpose::STANDARD.decode(body) {
            Ok(bytes) => Bytes::from(bytes),
            Err(error) => {
                defect = Some(format!(
                    "the body is marked {ENCODING_ATTRIBUTE}=base64 but is not base64: {error}"
                ));
                Bytes::copy_from_slice(body.as_bytes())
            }
        }
    } else {
        Bytes::copy_from_slice(body.as_bytes())
    };
    let system = |name| message.attributes().and_then(|a| a.get(&name));
    let attempts = system(MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    // Unix milliseconds, when SQS accepted the send (a retry changes visibility only).
    let enqueued_at =
        system(MessageSystemAttributeName::SentTimestamp).and_then(|ms| ms.parse().ok());
    Some(Delivery {
        tag: DeliveryTag::Sqs {
            receipt_handle: receipt,
        },
        source: attribute(SOURCE_ATTRIBUTE),
        message_id: attribute(ID_ATTRIBUTE),
        message_type: attribute(TYPE_ATTRIBUTE),
        payload,
        attempts,
        enqueued_at,
        defect,
        give_up: None,
        // A foreign producer's value is parsed and formatted again, or dropped.
        traceparent: attribute(TRACE_ATTRIBUTE)
            .as_deref()
            .and_then(traces::valid_traceparent),
        // A claim until the consumer verifies it.
        stripe_signature: attribute(STRIPE_SIGNATURE_ATTRIBUTE),
        sender_headers: SenderHeaders::from_wire(attribute(SENDER_HEADERS_ATTRIBUTE).as_deref()),
    })
}
