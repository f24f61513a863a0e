//! Decoding what a foreign producer put on the queue never panics, and every event it accepts
//! has a source, id and type the store can hold (the consumer's batch statements can then never
//! be refused because of one message's key). With EventBridge envelopes on, what it hands the
//! handler is the envelope's `detail`, a part of the message, byte for byte.
#![no_main]

use std::time::Duration;

use bytes::Bytes;
use dedup_worker_core::config::EnvelopeKind;
use dedup_worker_core::consumer::{decode_delivery, ConsumerOptions};
use dedup_worker_core::event::{check_event_field, EventField};
use dedup_worker_core::queue::{Delivery, DeliveryTag};
use libfuzzer_sys::fuzz_target;

#[path = "support.rs"]
mod support;

fuzz_target!(init: support::catch_stack_overflow(), |input: (Option<String>, Option<String>, Option<String>, bool, bool, &[u8])| {
    let (source, message_id, message_type, nested_pointer, eventbridge, payload) = input;
    let options = ConsumerOptions {
        source: "stripe".into(),
        dedup_key_pointer: if nested_pointer { "/data/object/id" } else { "/id" }.into(),
        batch_size: 1,
        poll_interval: Duration::from_millis(1),
        max_attempts: 1,
        retry_base: Duration::from_millis(1),
        retry_max: Duration::from_millis(1),
        max_message_bytes: 64 * 1024,
        lease: Duration::from_secs(10),
        step_timeout: Duration::from_secs(30),
        envelope: if eventbridge { EnvelopeKind::Eventbridge } else { EnvelopeKind::None },
        outbox_plan: Default::default(),
    };
    let delivery = Delivery {
        tag: DeliveryTag::Row {
            id: 1,
            claim_token: 1,
        },
        source,
        message_id,
        message_type,
        payload: Bytes::copy_from_slice(payload),
        attempts: 1,
        enqueued_at: None,
        defect: None,
        give_up: None,
        traceparent: None,
        stripe_signature: None,
        sender_headers: Default::default(),
    };
    if let Ok(event) = decode_delivery(&delivery, &options) {
        for (field, value) in [
            (EventField::Source, &event.source),
            (EventField::Id, &event.id),
            (EventField::Type, &event.event_type),
        ] {
            assert!(check_event_field(field, value).is_ok(), "{field:?} {value:?}");
        }
        if eventbridge {
            let whole = delivery.payload.as_ptr_range();
            let part = event.payload.as_ptr_range();
            assert!(whole.start <= part.start && part.end <= whole.end, "not a part of the message");
        } else {
            assert_eq!(event.payload, delivery.payload);
        }
    }
});
