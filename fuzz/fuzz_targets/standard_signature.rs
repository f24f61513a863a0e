//! Standard Webhooks verification and key decoding never panic; a `v1` signature made by
//! `standard_signature` with a decoded key, and a `v1a` one made by a `whsk_` key, verify (and
//! only for their own payload), among any other items within the bounds.
//!
//! Input: newline-separated fields, so seeds stay readable text:
//! `webhook-id \n webhook-timestamp \n webhook-signature \n keys (space-separated: whsec_…,
//! whpk_…, whsk_…) \n now \n tolerance \n payload (rest, any bytes)`. A missing or unparsable
//! number is 0.
#![no_main]

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use dedup_worker_core::signature::ed25519::{StandardPublicKey, StandardSigningKey, MAX_PUBLIC_KEYS};
use dedup_worker_core::signature::standard::{
    decode_secret, standard_signature, verify_standard_signature, StandardHeaders, StandardKeys,
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
    let keys_line = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let now: i64 = number(fields.next());
    let tolerance: u64 = number(fields.next());
    let payload = fields.next().unwrap_or_default();

    // Arbitrary keys: decoded or refused, never a panic. Keep the ones that decode, at most as
    // many public keys as the configuration accepts (one fewer: ours is added below).
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut public_keys: Vec<StandardPublicKey> = Vec::new();
    let mut signing: Option<StandardSigningKey> = None;
    for item in keys_line.split(' ') {
        if item.starts_with("whpk_") {
            match StandardPublicKey::parse(item) {
                Ok(key) if public_keys.len() < MAX_PUBLIC_KEYS - 1 => public_keys.push(key),
                Ok(_) => {}
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        } else if item.starts_with("whsk_") {
            match StandardSigningKey::parse(item) {
                Ok(key) => signing = Some(key),
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        } else {
            match decode_secret(item) {
                Ok(key) => keys.push(key),
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
    // With no decodable secret, sign with the raw bytes of the line (HMAC takes any key); with
    // no `whsk_` key, with the seed its first 32 bytes make.
    if keys.is_empty() {
        keys.push(keys_line.as_bytes().to_vec());
    }
    let signing = signing.unwrap_or_else(|| {
        let mut seed = [0u8; 32];
        let line = keys_line.as_bytes();
        seed[..line.len().min(32)].copy_from_slice(&line[..line.len().min(32)]);
        StandardSigningKey::from_seed(&seed)
    });
    // Its public key round-trips through `whpk_` and joins the trusted keys.
    let public = signing.public_key();
    assert_eq!(StandardPublicKey::parse(&public.to_string()).ok(), Some(public));
    public_keys.push(public);
    // A key re-encoded as a secret decodes to itself.
    let key = keys[0].clone();
    assert_eq!(decode_secret(&format!("whsec_{}", BASE64.encode(&key))), Ok(key.clone()));
    assert_eq!(decode_secret(&BASE64.encode(&key)), Ok(key.clone()));
    let trusted = StandardKeys { secrets: &keys, public_keys: &public_keys };

    // 1. Arbitrary headers, payload, keys, clock: an answer, never a panic.
    let headers = StandardHeaders {
        id: Some(&id),
        timestamp: Some(&timestamp),
        signature: Some(&signature),
    };
    let result = verify_standard_signature(headers, payload, trusted, tolerance, now);
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
            verify_standard_signature(missing, payload, trusted, tolerance, now),
            Err(StandardSignatureError::MissingHeader(_))
        ));
    }

    // 2. Round trips at `now` with zero tolerance, v1 by the first secret and v1a by the signing
    // key, each verifying with the keys in any order.
    let t = now.to_string();
    let mut rotated = keys.clone();
    rotated.rotate_left(1);
    let mut public_rotated = public_keys.clone();
    public_rotated.rotate_right(1);
    for signed in [
        standard_signature(&key, &id, now, payload),
        signing.sign(&id, now, payload),
    ] {
        let own = StandardHeaders {
            id: Some(&id),
            timestamp: Some(&t),
            signature: Some(&signed),
        };
        if id.is_empty() {
            assert_eq!(
                verify_standard_signature(own, payload, trusted, 0, now),
                Err(StandardSignatureError::MissingHeader("webhook-id"))
            );
            continue;
        }
        assert_eq!(
            verify_standard_signature(own, payload, trusted, 0, now),
            Ok(()),
            "own signature {signed:?} did not verify"
        );
        let reordered = StandardKeys { secrets: &rotated, public_keys: &public_rotated };
        assert_eq!(verify_standard_signature(own, payload, reordered, 0, now), Ok(()));
        // During rotation the header lists several signatures; ours may be anywhere. Beside
        // arbitrary items it verifies unless they take the header over a bound.
        let listed = format!("{signature} {signed}");
        let both = StandardHeaders { signature: Some(&listed), ..own };
        let result = verify_standard_signature(both, payload, trusted, 0, now);
        assert!(
            matches!(
                result,
                Ok(())
                    | Err(StandardSignatureError::TooManySignatures
                        | StandardSignatureError::TooManyEd25519Checks { .. }
                        | StandardSignatureError::SignatureHeaderTooLong)
            ),
            "{listed:?}: {result:?}"
        );
        // Never for another payload.
        let mut other = payload.to_vec();
        other.push(b'x');
        assert!(matches!(
            verify_standard_signature(own, &other, trusted, 0, now),
            Err(StandardSignatureError::NoMatchingSignature { malformed: 0 })
        ));
    }
});

fn number<T: std::str::FromStr + Default>(field: Option<&[u8]>) -> T {
    field
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_default()
}
