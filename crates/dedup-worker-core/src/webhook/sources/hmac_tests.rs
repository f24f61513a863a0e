//! The declarative scheme against documented example vectors and its own edge cases.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use bytes::Bytes;

use super::*;
use crate::config::{resolve_hmac, SourceSettings};

/// The rules and keys of a source given as JSON (as `[sources.NAME]` would be).
fn source(settings: serde_json::Value) -> (Declarative, Vec<Vec<u8>>, SourceSettings) {
    let source: SourceSettings = serde_json::from_value(settings).expect("a source");
    let rules =
        resolve_hmac("test", source.preset.as_deref(), source.hmac.as_ref()).expect("rules");
    let keys = source
        .secrets
        .iter()
        .map(|s| rules.key_of(s.expose()).expect("a key"))
        .collect();
    (Declarative::new(rules), keys, source)
}

fn headers(list: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in list {
        map.insert(
            name.parse::<HeaderName>().unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn verify(
    scheme: &Declarative,
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &str,
    now: i64,
    tolerance_secs: u64,
) -> Result<(), Problem> {
    scheme.verify(
        &Delivery {
            query: None,
            headers,
            body: body.as_bytes(),
        },
        &Keys {
            secrets: keys,
            tolerance_secs,
            now,
            public_url: Some("https://example.com/webhooks/x"),
            webhook_id: None,
            certificate: None,
        },
    )
}

/// Svix's documented example (docs.svix.com/receiving/verifying-payloads/how-manual), which the
/// `clerk` and `resend` presets verify: the secret as given (`whsec_` and base64), the
/// signature among others of another version, the timestamp held to the preset's 300 s.
#[test]
fn svix_example_verifies_under_the_clerk_preset() {
    let (scheme, keys, source) = source(serde_json::json!({
        "scheme": "hmac", "preset": "clerk",
        "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    }));
    assert_eq!(source.tolerance_secs(), 300);
    let body = r#"{"test": 2432232314}"#;
    let sent = headers(&[
        ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("svix-timestamp", "1614265330"),
        (
            "svix-signature",
            "v1a,AAAA v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ]);
    verify(&scheme, &keys, &sent, body, 1_614_265_330, 300).expect("verifies");
    let check = |r: Result<(), Problem>| r.unwrap_err().check;
    assert_eq!(
        check(verify(
            &scheme,
            &keys,
            &sent,
            body,
            1_614_265_331 + 300,
            300
        )),
        Some("timestamp_tolerance")
    );
    assert_eq!(
        check(verify(
            &scheme,
            &keys,
            &sent,
            r#"{"test": 2432232315}"#,
            1_614_265_330,
            300
        )),
        Some("signature_mismatch")
    );
    let mut other_id = sent.clone();
    other_id.insert("svix-id", HeaderValue::from_static("msg_other"));
    assert_eq!(
        check(verify(&scheme, &keys, &other_id, body, 1_614_265_330, 300)),
        Some("signature_mismatch")
    );
}

/// GitHub's documented test vector (docs.github.com, validating webhook deliveries) under the
/// `bitbucket` preset, which signs alike (`sha256=<hex>` over the body).
#[test]
fn githubs_example_verifies_under_the_bitbucket_preset() {
    let (scheme, keys, _) = source(serde_json::json!({
        "scheme": "hmac", "preset": "bitbucket", "secrets": ["It's a Secret to Everybody"],
    }));
    let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let sent = headers(&[("x-hub-signature", signature)]);
    verify(&scheme, &keys, &sent, "Hello, World!", 0, 0).expect("verifies");
    for (header, check) in [
        ("sha256=757107ea", "malformed_header"),
        (
            "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "malformed_header",
        ),
        (
            "sha256=857107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "signature_mismatch",
        ),
    ] {
        let sent = headers(&[("x-hub-signature", header)]);
        assert_eq!(
            verify(&scheme, &keys, &sent, "Hello, World!", 0, 0)
                .unwrap_err()
                .check,
            Some(check),
            "{header}"
        );
    }
    let none = HeaderMap::new();
    assert_eq!(
        verify(&scheme, &keys, &none, "Hello, World!", 0, 0)
            .unwrap_err()
            .check,
        Some("missing_header")
    );
}

/// A header of many parts is refused before any HMAC is computed.
#[test]
fn a_header_of_too_many_parts_is_malformed() {
    let (scheme, keys, _) = source(serde_json::json!({
        "scheme": "hmac", "preset": "clerk", "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    }));
    let many = vec!["v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; 40].join(" ");
    let sent = headers(&[
        ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("svix-timestamp", "1614265330"),
        ("svix-signature", &many),
    ]);
    assert_eq!(
        verify(
            &scheme,
            &keys,
            &sent,
            r#"{"test": 2432232314}"#,
            1_614_265_330,
            300
        )
        .unwrap_err()
        .check,
        Some("malformed_header")
    );
}

#[test]
fn ids_and_types_from_headers_or_pointers() {
    let (scheme, _, _) = source(serde_json::json!({
        "scheme": "hmac", "preset": "calendly", "secrets": ["k"],
    }));
    let identify = |body: &str| {
        scheme.identify(&Delivery {
            query: None,
            headers: &HeaderMap::new(),
            body: body.as_bytes(),
        })
    };
    assert_eq!(
        identify(r#"{"event":"invitee.created","payload":{"uri":"https://api.calendly.com/i/1"}}"#)
            .unwrap(),
        Identified::Event {
            id: "invitee.created:https://api.calendly.com/i/1".into(),
            event_type: Some("invitee.created".into()),
        }
    );
    for (body, check) in [
        (r#"{"event":"invitee.created"}"#, "missing_id"),
        ("not json", "payload_json"),
        (r#"[1]"#, "missing_id"),
    ] {
        assert_eq!(identify(body).unwrap_err().check, Some(check), "{body}");
    }
    let (scheme, _, _) = source(serde_json::json!({
        "scheme": "hmac", "preset": "twitch", "secrets": ["k"],
    }));
    let sent = headers(&[
        (
            "twitch-eventsub-message-id",
            "befa7b53-d79d-478f-86b9-120f112b044e",
        ),
        ("twitch-eventsub-subscription-type", "channel.follow"),
    ]);
    assert_eq!(
        scheme
            .identify(&Delivery {
                query: None,
                headers: &sent,
                body: b"not even json",
            })
            .unwrap(),
        Identified::Event {
            id: "befa7b53-d79d-478f-86b9-120f112b044e".into(),
            event_type: Some("channel.follow".into()),
        }
    );
}

/// `items_pointer`: each element of the array it names is an event, its id and type read in
/// it, its payload its bytes exactly as sent (spacing, key order, number forms kept).
#[test]
fn a_batch_is_one_event_per_item_with_its_bytes_as_sent() {
    let identify = |settings: serde_json::Value, body: &str| {
        let (scheme, _, _) = source(settings);
        scheme.identify(&Delivery {
            query: None,
            headers: &HeaderMap::new(),
            body: body.as_bytes(),
        })
    };
    let hubspot = serde_json::json!({
        "scheme": "hmac", "preset": "hubspot", "secrets": ["k"],
        "public_url": "https://h.example/webhooks/hs",
    });
    let body = r#"[ {"eventId": 1, "subscriptionType":"contact.creation","x":1.50} ,{"subscriptionType":"deal.deletion","eventId":2}]"#;
    assert_eq!(
        identify(hubspot.clone(), body).unwrap(),
        Identified::Batch {
            events: vec![
                BatchEvent {
                    id: "1".into(),
                    event_type: Some("contact.creation".into()),
                    payload: Bytes::from_static(
                        br#"{"eventId": 1, "subscriptionType":"contact.creation","x":1.50}"#
                    ),
                },
                BatchEvent {
                    id: "2".into(),
                    event_type: Some("deal.deletion".into()),
                    payload: Bytes::from_static(
                        br#"{"subscriptionType":"deal.deletion","eventId":2}"#
                    ),
                },
            ],
            answer: None,
        }
    );
    for (body, check) in [
        ("[]", None),
        (r#"[{"eventId":1},{"objectId":2}]"#, Some("missing_id")),
        (r#"{"eventId":1}"#, Some("missing_items")),
        ("[1,", Some("payload_json")),
    ] {
        assert_eq!(
            identify(hubspot.clone(), body).err().and_then(|p| p.check),
            check,
            "{body}"
        );
    }
    // Nested, with an escaped token (`~1` is `/`) and an index.
    let nested = serde_json::json!({
        "scheme": "hmac", "secrets": ["k"],
        "hmac": {
            "signature_header": "S", "items_pointer": "/data/a~1b/0",
            "id_pointer": "/id", "type_header": "X-Kind",
        },
    });
    let Identified::Batch { events, .. } =
        identify(nested, r#"{"data":{"a/b":[[{"id":"e1"},{"id":"e2"}]]}}"#).unwrap()
    else {
        panic!("a batch");
    };
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2"]);
}

#[test]
fn timestamps_in_each_format() {
    assert_eq!(
        unix_seconds("1700000000", TimestampFormat::Unix),
        Some(1_700_000_000)
    );
    assert_eq!(
        unix_seconds("1700000000999", TimestampFormat::UnixMs),
        Some(1_700_000_000)
    );
    assert_eq!(
        unix_seconds("2019-11-16T10:11:12.634234626Z", TimestampFormat::Rfc3339),
        Some(1_573_899_072)
    );
    assert_eq!(unix_seconds("soon", TimestampFormat::Unix), None);
    assert_eq!(unix_seconds("1e3", TimestampFormat::UnixMs), None);
}

#[test]
fn signatures_decode_with_or_without_padding() {
    let bytes = vec![0xfb, 0xff, 0x01];
    assert_eq!(decode(HmacEncoding::Base64, "+/8B"), Some(bytes.clone()));
    assert_eq!(decode(HmacEncoding::Base64url, "-_8B"), Some(bytes.clone()));
    assert_eq!(decode(HmacEncoding::Base64, "+/8="), Some(vec![0xfb, 0xff]));
    assert_eq!(decode(HmacEncoding::Base64, "+/8"), Some(vec![0xfb, 0xff]));
    assert_eq!(decode(HmacEncoding::Base64url, "+/8B"), None);
    assert_eq!(decode(HmacEncoding::Hex, "FBff01"), Some(bytes));
    assert_eq!(decode(HmacEncoding::Hex, "fbf"), None);
}
