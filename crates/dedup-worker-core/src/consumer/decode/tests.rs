//! What becomes of each kind of message: its key, its alias, or the reason it is refused.

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
        outbox_plan: Default::default(),
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
        sender_headers: crate::event::SenderHeaders::default(),
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
    let event = decode_delivery(&delivery(None, envelope(thin).as_bytes()), &eventbridge).unwrap();
    assert_eq!(event.id, "evt_1");
    // Without the setting the handler gets the envelope, keyed as its change; a plain event
    // passes either way.
    let plain = decode_delivery(&delivery(None, envelope(detail).as_bytes()), &options()).unwrap();
    assert_eq!(plain.id, "evt_1");
    assert_eq!(plain.payload, envelope(detail).as_bytes());
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

#[test]
fn a_message_keyed_otherwise_before_carries_that_key_as_its_alias() {
    let keyed = |d: &Delivery, o: &ConsumerOptions| {
        let event = decode_delivery(d, o).expect("decodes");
        (event.id, event.alias)
    };
    let pair = |id: &str, alias: Option<&str>| (id.to_owned(), alias.map(str::to_owned));
    // A thin event is keyed by its snapshot event whatever the message id: its own id was
    // its key before thin events were keyed so, and a message id that is neither was the key
    // before the change keying.
    let thin = br#"{"id":"evt_thin","object":"v2.core.event","type":"v1.invoice.paid","snapshot_event":"evt_A"}"#;
    let o = options();
    assert_eq!(
        keyed(&delivery(Some("evt_A"), thin), &o),
        pair("evt_A", Some("evt_thin"))
    );
    assert_eq!(
        keyed(&delivery(None, thin), &o),
        pair("evt_A", Some("evt_thin"))
    );
    assert_eq!(
        keyed(&delivery(Some("evt_thin"), thin), &o),
        pair("evt_A", Some("evt_thin"))
    );
    // Snapshot events, v2 thin events (one id), other sources, other keys: no alias.
    let snapshot = br#"{"id":"evt_A","object":"event","snapshot_event":"evt_B"}"#;
    assert_eq!(keyed(&delivery(None, snapshot), &o), pair("evt_A", None));
    let v2 = br#"{"id":"evt_v2","object":"v2.core.event"}"#;
    assert_eq!(keyed(&delivery(None, v2), &o), pair("evt_v2", None));
    let mut github = delivery(None, thin);
    github.source = Some("github".into());
    assert_eq!(keyed(&github, &o), pair("evt_thin", None));
    assert_eq!(
        keyed(&delivery(Some("other"), thin), &o),
        pair("evt_A", Some("other"))
    );
    // An alias the store could not hold is dropped, never a reason to refuse the message.
    let nul = br#"{"id":"evt_\u0000","object":"v2.core.event","snapshot_event":"evt_A"}"#;
    assert_eq!(
        keyed(&delivery(Some("evt_A"), nul), &o),
        pair("evt_A", None)
    );

    // An EventBridge envelope: keyed by its detail with the setting or without; its own id
    // (the key without the setting before the change keying) is the alias.
    let envelope = br#"{"version":"0","id":"6a7e8feb-b491","source":"aws.partner/stripe.com/ed_1","detail":{"id":"evt_1","object":"event","type":"invoice.paid"}}"#;
    let eventbridge = ConsumerOptions {
        envelope: EnvelopeKind::Eventbridge,
        ..options()
    };
    assert_eq!(
        keyed(&delivery(None, envelope), &eventbridge),
        pair("evt_1", Some("6a7e8feb-b491"))
    );
    assert_eq!(
        keyed(&delivery(None, envelope), &o),
        pair("evt_1", Some("6a7e8feb-b491"))
    );
    // A thin event's envelope: its detail's key is the snapshot event.
    let thin_envelope = br#"{"id":"eb-2","source":"aws.partner/stripe.com/ed_1","detail":{"id":"evt_t","object":"v2.core.event","snapshot_event":"evt_S"}}"#;
    assert_eq!(
        keyed(&delivery(None, thin_envelope), &eventbridge),
        pair("evt_S", Some("eb-2"))
    );
    assert_eq!(
        keyed(&delivery(None, thin_envelope), &o),
        pair("evt_S", Some("eb-2"))
    );
    // Not from Stripe, or an envelope id that is not a string: no alias.
    let foreign = br#"{"id":"x-1","source":"aws.ec2","detail":{"id":"i-1"}}"#;
    assert_eq!(keyed(&delivery(None, foreign), &o), pair("x-1", None));
    let numeric = br#"{"id":7,"source":"aws.partner/stripe.com/ed_1","detail":{"id":"evt_1","object":"event"}}"#;
    assert_eq!(
        keyed(&delivery(None, numeric), &eventbridge),
        pair("evt_1", None)
    );
}

/// Issue 36, item 1: every copy of one change, on every channel and under every message id
/// a transport or a producer may give it, claims the same key (under source `stripe`), so the
/// insert that claims it is the one place they meet.
#[test]
fn every_copy_of_a_change_claims_one_key() {
    let snapshot = r#"{"id":"evt_A","object":"event","type":"invoice.paid"}"#;
    let thin = r#"{"id":"evt_thin","object":"v2.core.event","type":"v1.invoice.paid","snapshot_event":"evt_A"}"#;
    let envelope = |detail: &str, id: &str| {
        format!(
            r#"{{"version":"0","id":"{id}","detail-type":"x","source":"aws.partner/stripe.com/ed_1","detail":{detail}}}"#
        )
    };
    let bodies = [
        snapshot.to_owned(),
        thin.to_owned(),
        envelope(snapshot, "eb-1"),
        envelope(thin, "eb-2"),
    ];
    let none = options();
    let eventbridge = ConsumerOptions {
        envelope: EnvelopeKind::Eventbridge,
        ..options()
    };
    for body in &bodies {
        for message_id in [
            None,
            Some("evt_A"),
            Some("evt_thin"),
            Some("eb-1"),
            Some("f00-uuid"),
        ] {
            for (setting, o) in [("none", &none), ("eventbridge", &eventbridge)] {
                let event = decode_delivery(&delivery(message_id, body.as_bytes()), o)
                    .unwrap_or_else(|e| panic!("{body} under {message_id:?}: {e}"));
                assert_eq!(
                    (event.source.as_str(), event.id.as_str()),
                    ("stripe", "evt_A"),
                    "{body} with message id {message_id:?}, envelope {setting}"
                );
            }
        }
    }
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
