use super::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const T: i64 = 1_614_265_330;
const PAYLOAD: &[u8] = br#"{"test": 2432232314}"#;
const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn headers<'a>(signature: &'a str, t: &'a str) -> StandardHeaders<'a> {
    StandardHeaders {
        id: Some(ID),
        timestamp: Some(t),
        signature: Some(signature),
    }
}

#[test]
fn official_vector() {
    let key = decode_secret(SECRET).unwrap();
    assert_eq!(standard_signature(&key, ID, T, PAYLOAD), EXPECTED);
    let t = T.to_string();
    assert_eq!(
        verify_standard_signature(
            headers(EXPECTED, &t),
            PAYLOAD,
            StandardKeys::hmac(std::slice::from_ref(&key)),
            300,
            T
        ),
        Ok(())
    );
    // Rotation: any listed signature may match.
    let both = format!("v1,AAAA {EXPECTED}");
    assert_eq!(
        verify_standard_signature(
            headers(&both, &t),
            PAYLOAD,
            StandardKeys::hmac(&[key]),
            300,
            T + 299
        ),
        Ok(())
    );
}

#[test]
fn failures_are_told_apart() {
    let key = decode_secret(SECRET).unwrap();
    let t = T.to_string();
    let keys = [key];
    let verify =
        |h, p: &[u8], now| verify_standard_signature(h, p, StandardKeys::hmac(&keys), 300, now);
    assert_eq!(
        verify(headers(EXPECTED, &t), b"{}", T),
        Err(StandardSignatureError::NoMatchingSignature { malformed: 0 })
    );
    assert_eq!(
        verify(headers("v2,abc", &t), PAYLOAD, T),
        Err(StandardSignatureError::NoV1Signature)
    );
    assert_eq!(
        verify(headers(EXPECTED, "soon"), PAYLOAD, T),
        Err(StandardSignatureError::MalformedTimestamp)
    );
    assert!(matches!(
        verify(headers(EXPECTED, &t), PAYLOAD, T + 301),
        Err(StandardSignatureError::TimestampOutsideTolerance { .. })
    ));
    assert!(matches!(
        verify(headers(EXPECTED, &t), PAYLOAD, T - 301),
        Err(StandardSignatureError::TimestampOutsideTolerance { .. })
    ));
    let no_id = StandardHeaders {
        id: None,
        ..headers(EXPECTED, &t)
    };
    assert_eq!(
        verify(no_id, PAYLOAD, T),
        Err(StandardSignatureError::MissingHeader("webhook-id"))
    );
    assert!(decode_secret("whsec_not base64!").is_err());
}

#[test]
fn oversized_headers_are_refused_before_any_hmac() {
    let key = decode_secret(SECRET).unwrap();
    let t = T.to_string();
    let keys = [key];
    let verify = |signature: &str, timestamp: &str| {
        verify_standard_signature(
            headers(signature, timestamp),
            PAYLOAD,
            StandardKeys::hmac(&keys),
            300,
            T,
        )
    };
    // Even with the matching signature among them: the limits apply before comparing.
    let many = format!("{}{EXPECTED}", "v1,AAAA ".repeat(MAX_SIGNATURES));
    assert_eq!(
        verify(&many, &t),
        Err(StandardSignatureError::TooManySignatures)
    );
    let at_limit = format!("{}{EXPECTED}", "v1,AAAA ".repeat(MAX_SIGNATURES - 1));
    assert_eq!(verify(&at_limit, &t), Ok(()));
    // Other schemes are not candidates and do not count.
    let others = format!("{}{EXPECTED}", "v2,AAAA ".repeat(100));
    assert_eq!(verify(&others, &t), Ok(()));
    let padded = |len: usize| format!("{EXPECTED}{}", " ".repeat(len - EXPECTED.len()));
    assert_eq!(verify(&padded(MAX_SIGNATURE_HEADER_BYTES), &t), Ok(()));
    assert_eq!(
        verify(&padded(MAX_SIGNATURE_HEADER_BYTES + 1), &t),
        Err(StandardSignatureError::SignatureHeaderTooLong)
    );
    let spaced = format!("{t:>32}");
    assert_eq!(verify(EXPECTED, &spaced), Ok(()));
    assert_eq!(
        verify(EXPECTED, &format!(" {spaced}")),
        Err(StandardSignatureError::TimestampTooLong)
    );
    for (error, limit) in [
        (StandardSignatureError::TimestampTooLong, "32"),
        (StandardSignatureError::SignatureHeaderTooLong, "8192"),
        (StandardSignatureError::TooManySignatures, "16"),
    ] {
        assert_eq!(error.check(), "malformed_header");
        assert!(error.to_string().contains(limit), "{error}");
    }
}

use crate::proptest_support::{config, extreme_i64};
use proptest::prelude::*;
use proptest::sample::Index;

fn signature_like() -> impl Strategy<Value = String> {
    let item = prop_oneof![
        "v1,[A-Za-z0-9+/=]{0,50}",
        "v[0-9],[ -~]{0,10}",
        "[ -~]{0,12}",
    ];
    prop::collection::vec(item, 0..24).prop_map(|items| items.join(" "))
}

fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..64)
}

proptest! {
    #![proptest_config(config(256))]

    /// Whatever the headers, payload, keys and clock: an answer, never a panic.
    #[test]
    fn never_panics(
        id in proptest::option::of(any::<String>()),
        timestamp in proptest::option::of(prop_oneof![
            any::<String>(),
            " ?-?[0-9]{0,40} ?",
            "(-9223372036854775808|9223372036854775807|0)",
        ]),
        signature in proptest::option::of(prop_oneof![any::<String>(), signature_like()]),
        payload in prop::collection::vec(any::<u8>(), 0..64),
        keys in prop::collection::vec(key_bytes(), 0..3),
        tolerance in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX)],
        now in prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), Just(0)],
    ) {
        let headers = StandardHeaders {
            id: id.as_deref(),
            timestamp: timestamp.as_deref(),
            signature: signature.as_deref(),
        };
        let _ = verify_standard_signature(headers, &payload, StandardKeys::hmac(&keys), tolerance, now);
    }

    /// `decode_secret` never panics, and a `whsec_` secret decodes to the key it encodes.
    #[test]
    fn secrets_decode(key in key_bytes(), garbage in any::<String>()) {
        let _ = decode_secret(&garbage);
        prop_assert_eq!(decode_secret(&format!("whsec_{}", BASE64.encode(&key))), Ok(key.clone()));
        prop_assert_eq!(decode_secret(&BASE64.encode(&key)), Ok(key));
    }

    /// Sign, then verify: accepted within the tolerance, refused as stale outside it.
    #[test]
    fn signed_deliveries_verify_within_tolerance_only(
        key in key_bytes(),
        id in "[!-~]{1,40}",
        payload in prop::collection::vec(any::<u8>(), 0..256),
        t in -(1i64 << 40)..(1i64 << 40),
        tolerance in 0u64..1_000_000,
        skew in -2_000_000i64..2_000_000,
    ) {
        let signature = standard_signature(&key, &id, t, &payload);
        let t_header = t.to_string();
        let headers = StandardHeaders { id: Some(&id), timestamp: Some(&t_header), signature: Some(&signature) };
        let result = verify_standard_signature(headers, &payload, StandardKeys::hmac(std::slice::from_ref(&key)), tolerance, t + skew);
        if skew.unsigned_abs() <= tolerance {
            prop_assert_eq!(result, Ok(()));
        } else {
            prop_assert_eq!(
                result,
                Err(StandardSignatureError::TimestampOutsideTolerance { skew_secs: skew, tolerance_secs: tolerance })
            );
        }
    }

    /// Extreme timestamps and clocks: no overflow, and the verdict follows the exact
    /// distance between them (for any tolerance below i64::MAX, where the saturated
    /// distance is exact enough).
    #[test]
    fn extreme_timestamps_follow_the_exact_skew(
        t in extreme_i64(),
        now in extreme_i64(),
        tolerance in prop_oneof![0u64..(i64::MAX as u64), Just(0), Just(i64::MAX as u64 - 1)],
    ) {
        let key = decode_secret(SECRET).unwrap();
        let signature = standard_signature(&key, ID, t, PAYLOAD);
        let t_header = t.to_string();
        let result = verify_standard_signature(headers(&signature, &t_header), PAYLOAD, StandardKeys::hmac(&[key]), tolerance, now);
        let within = (i128::from(now) - i128::from(t)).unsigned_abs() <= u128::from(tolerance);
        prop_assert_eq!(result.is_ok(), within, "{:?}", result);
    }

    /// Rotation: among up to 16 candidates (other keys' signatures, garbage, other
    /// schemes anywhere), one by any of the verifier's keys is enough; none is not.
    #[test]
    fn rotation_any_listed_signature_by_any_key(
        keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 32), 1..4),
        signer in any::<Index>(),
        others in prop::collection::vec(prop::collection::vec(any::<u8>(), 32), 0..4),
        garbage in prop::collection::vec("v1,[A-Za-z0-9+/=]{0,50}|v2,[!-~]{0,10}", 0..8),
        at in any::<Index>(),
    ) {
        let t = T.to_string();
        let signer = &keys[signer.index(keys.len())];
        let mut items: Vec<String> = others
            .iter()
            .map(|k| standard_signature(k, ID, T, PAYLOAD))
            .chain(garbage)
            .collect();
        let others_only = items.join(" ");
        items.insert(at.index(items.len() + 1), standard_signature(signer, ID, T, PAYLOAD));
        let all = items.join(" ");
        prop_assert_eq!(verify_standard_signature(headers(&all, &t), PAYLOAD, StandardKeys::hmac(&keys), 300, T), Ok(()));
        // Random 32-byte keys never collide in practice; skip the impossible case anyway.
        prop_assume!(!others.iter().any(|o| keys.contains(o)));
        let refused = verify_standard_signature(headers(&others_only, &t), PAYLOAD, StandardKeys::hmac(&keys), 300, T);
        prop_assert!(matches!(
            refused,
            Err(StandardSignatureError::NoMatchingSignature { .. } | StandardSignatureError::NoV1Signature)
        ), "refused as not matching");
    }

    /// More than 16 `v1,` candidates is refused for the count, the matching one included.
    #[test]
    fn more_than_sixteen_candidates_are_refused(n in (MAX_SIGNATURES + 1)..200, at in any::<Index>()) {
        let key = decode_secret(SECRET).unwrap();
        let t = T.to_string();
        let mut items = vec!["v1,"; n - 1];
        items.insert(at.index(n), EXPECTED);
        let signature = items.join(" ");
        prop_assert_eq!(
            verify_standard_signature(headers(&signature, &t), PAYLOAD, StandardKeys::hmac(&[key]), 300, T),
            Err(StandardSignatureError::TooManySignatures)
        );
    }
}
