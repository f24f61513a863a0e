//! Standard Webhooks verification and secret decoding never panic; a signature made by
//! `standard_signature` with a decoded key verifies (and only for its own payload).
//!
//! Input: newline-separated fields, so seeds stay readable text:
//! `webhook-id \n webhook-timestamp \n webhook-signature \n secrets (space-separated, whsec_…)
//!  \n now \n tolerance \n payload (rest, any bytes)`. A missing or unparsable number is 0.
#![no_main]

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use dedup_worker::webhook::standard::{
    decode_secret, standard_signature, verify_standard_signature, StandardHeaders,
    StandardSignatureError,
};
use libfuzzer_sys::fuzz_target;

#[path = "support.rs"]
mod support;

fuzz_target!(init: support::catch_stack_overflow(), |data: &[u8]| {
    let mut fields = data.splitn(7, |&b| b == b'\n');
    let id = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let timestamp = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let signature = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let secrets_line = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let now: i64 = number(fields.next());
    let tolerance: u64 = number(fields.next());
    let payload = fields.next().unwrap_or_default();

    // Arbitrary secrets: decoded or refused, never a panic. Keep the ones that decode.
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for secret in secrets_line.split(' ') {
        match decode_secret(secret) {
            Ok(key) => keys.push(key),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    // With no decodable secret, sign with the raw bytes of the line (HMAC takes any key).
    if keys.is_empty() {
        keys.push(secrets_line.as_bytes().to_vec());
    }
    // A key re-encoded as a secret decodes to itself.
    let key = keys[0].clone();
    assert_eq!(decode_secret(&format!("whsec_{}", BASE64.encode(&key))), Ok(key.clone()));
    assert_eq!(decode_secret(&BASE64.encode(&key)), Ok(key.clone()));

    // 1. Arbitrary headers, payload, keys, clock: an answer, never a panic.
    let headers = StandardHeaders {
        id: Some(&id),
        timestamp: Some(&timestamp),
        signature: Some(&signature),
    };
    let result = verify_standard_signature(headers, payload, &keys, tolerance, now);
    if let Err(e) = &result {
        let _ = e.to_string();
        let _ = e.check();
        if let StandardSignatureError::TimestampOutsideTolerance { skew_secs, tolerance_secs } = e {
            assert_eq!(*tolerance_secs, tolerance);
            assert!(skew_secs.unsigned_abs() > tolerance);
        }
    }
    for missing in [
        StandardHeaders { id: None, ..headers },
        StandardHeaders { timestamp: None, ..headers },
        StandardHeaders { signature: None, ..headers },
    ] {
        assert!(matches!(
            verify_standard_signature(missing, payload, &keys, tolerance, now),
            Err(StandardSignatureError::MissingHeader(_))
        ));
    }

    // 2. Round trip at `now` with zero tolerance, the key anywhere in the list.
    let signed = standard_signature(&key, &id, now, payload);
    let t = now.to_string();
    let own = StandardHeaders {
        id: Some(&id),
        timestamp: Some(&t),
        signature: Some(&signed),
    };
    let mut rotated = keys.clone();
    rotated.rotate_left(1);
    if id.is_empty() {
        assert_eq!(
            verify_standard_signature(own, payload, &keys, 0, now),
            Err(StandardSignatureError::MissingHeader("webhook-id"))
        );
    } else {
        assert_eq!(
            verify_standard_signature(own, payload, &keys, 0, now),
            Ok(()),
            "own signature {signed:?} did not verify"
        );
        assert_eq!(verify_standard_signature(own, payload, &rotated, 0, now), Ok(()));
        // During rotation the header lists several signatures; ours may be anywhere.
        let listed = format!("{signature} {signed}");
        let both = StandardHeaders { signature: Some(&listed), ..own };
        assert_eq!(verify_standard_signature(both, payload, &keys, 0, now), Ok(()));
        // Never for another payload.
        let mut other = payload.to_vec();
        other.push(b'x');
        assert_eq!(
            verify_standard_signature(own, &other, &keys, 0, now),
            Err(StandardSignatureError::NoMatchingSignature)
        );
    }
});

fn number<T: std::str::FromStr + Default>(field: Option<&[u8]>) -> T {
    field
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_default()
}
