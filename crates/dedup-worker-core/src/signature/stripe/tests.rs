//! The verifier's rules, published vector and properties.

use super::*;

const VECTOR: &[u8] =
    include_bytes!("../../../../../tests/vectors/stripe_invoiceitem_created.json");
const VECTOR_T: i64 = 1_533_204_620;
const VECTOR_SIG: &str = "d7373bc68f4bd320b253cd7461f87af6e1cdf1b4d7db1614d8d1d746972d2d0a";

#[test]
fn published_vector_computes_and_verifies_at_its_own_time() {
    assert_eq!(VECTOR.len(), 569);
    assert_eq!(compute_signature("secret", VECTOR_T, VECTOR), VECTOR_SIG);
    let header = format!("t={VECTOR_T},v1={VECTOR_SIG}");
    assert_eq!(
        verify_stripe_signature(Some(&header), VECTOR, &["secret"], 300, VECTOR_T),
        Ok(())
    );
    // Ten minutes later it is stale.
    assert!(matches!(
        verify_stripe_signature(Some(&header), VECTOR, &["secret"], 300, VECTOR_T + 600),
        Err(SignatureError::TimestampOutsideTolerance { .. })
    ));
}

#[test]
fn authenticity_has_no_tolerance_and_names_the_v1_that_matched() {
    let sig = compute_signature("whsec_b", 100, b"{}");
    let header = format!("t=100,v1={},v0=ab,v1={sig}", "00".repeat(32));
    let ten_years = 100 + 10 * 365 * 86_400;
    // At the door, ten years late is a replay; as a carried signature it is still Stripe's.
    assert!(matches!(
        verify_delivery(Some(&header), b"{}", &["whsec_b"], 300, ten_years),
        Err(SignatureError::TimestampOutsideTolerance { .. })
    ));
    let verified = verify_authenticity(&header, b"{}", &["whsec_a", "whsec_b"]).unwrap();
    assert_eq!(verified.timestamp, 100);
    // The compact form keeps only what verifies, and verifies again.
    assert_eq!(verified.compact(), format!("t=100,v1={sig}"));
    assert_eq!(
        verify_authenticity(&verified.compact(), b"{}", &["whsec_b"]),
        Ok(verified.clone())
    );
    assert_eq!(
        verify_delivery(Some(&header), b"{}", &["whsec_b"], 300, 100),
        Ok(verified)
    );
    // Everything else is refused as at the door.
    for (header, payload, secrets, expected) in [
        (
            format!("t=100,v1={sig}"),
            &b"{ }"[..],
            &["whsec_b"][..],
            SignatureError::NoMatchingSignature,
        ),
        (
            format!("t=101,v1={sig}"),
            b"{}",
            &["whsec_b"],
            SignatureError::NoMatchingSignature,
        ),
        (
            format!("t=100,v1={sig}"),
            b"{}",
            &[],
            SignatureError::NoMatchingSignature,
        ),
        (
            "t=100,v0=ab".to_owned(),
            b"{}",
            &["whsec_b"],
            SignatureError::NoV1Signature,
        ),
        (
            format!("v1={sig}"),
            b"{}",
            &["whsec_b"],
            SignatureError::MalformedHeader,
        ),
        (
            "v1=,".repeat(3000),
            b"{}",
            &["whsec_b"],
            SignatureError::HeaderTooLong,
        ),
    ] {
        assert_eq!(
            verify_authenticity(&header, payload, secrets),
            Err(expected),
            "{header:.40}"
        );
    }
}

#[test]
fn any_v1_may_match_and_v0_and_unknown_keys_are_ignored() {
    let good = compute_signature("whsec_b", 100, b"{}");
    let header = format!("t=100,v0=abc,v1={},v1={good},foo=bar", "00".repeat(32));
    assert_eq!(
        verify_stripe_signature(Some(&header), b"{}", &["whsec_a", "whsec_b"], 300, 100),
        Ok(())
    );
}

#[test]
fn each_failure_has_its_own_error() {
    let sig = compute_signature("s", 100, b"{}");
    let cases: Vec<(Option<String>, SignatureError)> = vec![
        (None, SignatureError::MissingHeader),
        (Some("garbage".into()), SignatureError::MalformedHeader),
        (Some(format!("v1={sig}")), SignatureError::MalformedHeader),
        (
            Some(format!("t=abc,v1={sig}")),
            SignatureError::MalformedHeader,
        ),
        (Some("t=100,v0=abcd".into()), SignatureError::NoV1Signature),
        (
            Some("t=100,v1=zz".into()),
            SignatureError::NoMatchingSignature,
        ),
        (
            Some(format!(
                "t=100,v1={}",
                compute_signature("other", 100, b"{}")
            )),
            SignatureError::NoMatchingSignature,
        ),
    ];
    for (header, expected) in cases {
        assert_eq!(
            verify_stripe_signature(header.as_deref(), b"{}", &["s"], 300, 100),
            Err(expected)
        );
    }
    let future = verify_stripe_signature(
        Some(&format!("t=100,v1={sig}")),
        b"{}",
        &["s"],
        300,
        100 - 301,
    );
    assert!(matches!(
        future,
        Err(SignatureError::TimestampOutsideTolerance { .. })
    ));
    let edge = verify_stripe_signature(Some(&format!("t=100,v1={sig}")), b"{}", &["s"], 300, 400);
    assert_eq!(edge, Ok(()));
}

#[test]
fn the_whole_secret_string_is_the_key() {
    let with_prefix = compute_signature("whsec_abc", 1, b"x");
    let without = compute_signature("abc", 1, b"x");
    assert_ne!(with_prefix, without);
}

#[test]
fn oversized_headers_are_refused_before_any_hmac() {
    let sig = compute_signature("s", 100, b"{}");
    // Even with the matching signature among them: the limits apply before comparing.
    let many = format!("t=100{},v1={sig}", ",v1=".repeat(MAX_V1_SIGNATURES));
    assert_eq!(
        verify_stripe_signature(Some(&many), b"{}", &["s"], 300, 100),
        Err(SignatureError::TooManySignatures)
    );
    let at_limit = format!("t=100{},v1={sig}", ",v1=".repeat(MAX_V1_SIGNATURES - 1));
    assert_eq!(
        verify_stripe_signature(Some(&at_limit), b"{}", &["s"], 300, 100),
        Ok(())
    );
    let base = format!("t=100,v1={sig},x=");
    let padded = |len: usize| format!("{base}{}", "y".repeat(len - base.len()));
    assert_eq!(
        verify_stripe_signature(
            Some(&padded(MAX_SIGNATURE_HEADER_BYTES)),
            b"{}",
            &["s"],
            300,
            100
        ),
        Ok(())
    );
    let long = padded(MAX_SIGNATURE_HEADER_BYTES + 1);
    let refused = verify_stripe_signature(Some(&long), b"{}", &["s"], 300, 100);
    assert_eq!(refused, Err(SignatureError::HeaderTooLong));
    let refused = refused.unwrap_err();
    assert_eq!(refused.check(), "malformed_header");
    assert!(refused.to_string().contains("8192"));
    assert_eq!(
        SignatureError::TooManySignatures.check(),
        "malformed_header"
    );
    assert!(SignatureError::TooManySignatures.to_string().contains("16"));
}

use crate::proptest_support::{config, extreme_i64};
use proptest::prelude::*;

/// Header-like strings: items of keys and values in any order, garbage included.
fn header_like() -> impl Strategy<Value = String> {
    let item = prop_oneof![
        "t=-?[0-9]{0,20}",
        "t=(-9223372036854775808|9223372036854775807|0)",
        "v1=[0-9a-f]{0,70}",
        "v0=[0-9a-f]{0,10}",
        "[a-z0-9 ]{0,4}=[ -~]{0,10}",
        "[ -~]{0,10}",
    ];
    prop::collection::vec(item, 0..24).prop_map(|items| items.join(","))
}

/// Items a verifier must ignore: `v0` and unknown keys (never `t` or `v1`).
fn ignored_item() -> impl Strategy<Value = String> {
    prop_oneof![
        "v0=[0-9a-f]{0,64}",
        "[a-z_][a-z0-9_]{0,6}=[!-+\\--~]{0,20}"
            .prop_filter("a key that counts", |i| !i.starts_with("t=")
                && !i.starts_with("v1=")),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Whatever the header, payload, secrets and clock: an answer, never a panic.
    #[test]
    fn never_panics(
        header in prop_oneof![any::<String>(), header_like()],
        payload in prop::collection::vec(any::<u8>(), 0..64),
        secrets in prop::collection::vec(any::<String>(), 0..3),
        tolerance in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX)],
        now in prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), Just(0)],
    ) {
        let _ = verify_stripe_signature(Some(&header), &payload, &secrets, tolerance, now);
    }

    /// A header from `signature_header` verifies within the tolerance, in the past or the
    /// future, and is refused as stale outside it.
    #[test]
    fn signed_headers_verify_within_tolerance_only(
        secret in any::<String>(),
        payload in prop::collection::vec(any::<u8>(), 0..256),
        t in -(1i64 << 40)..(1i64 << 40),
        tolerance in 0u64..1_000_000,
        skew in -2_000_000i64..2_000_000,
    ) {
        let header = signature_header(&secret, t, &payload);
        let result = verify_stripe_signature(Some(&header), &payload, &[&secret], tolerance, t + skew);
        if skew.unsigned_abs() <= tolerance {
            prop_assert_eq!(result, Ok(()));
        } else {
            prop_assert_eq!(
                result,
                Err(SignatureError::TimestampOutsideTolerance { skew_secs: skew, tolerance_secs: tolerance })
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
        let header = signature_header("s", t, b"{}");
        let result = verify_stripe_signature(Some(&header), b"{}", &["s"], tolerance, now);
        let within = (i128::from(now) - i128::from(t)).unsigned_abs() <= u128::from(tolerance);
        prop_assert_eq!(result.is_ok(), within, "{:?}", result);
    }

    /// `v0` and unknown items, inserted anywhere, change nothing.
    #[test]
    fn ignored_items_do_not_change_the_outcome(
        header in prop_oneof![
            (any::<String>(), -1000i64..1000).prop_map(|(s, t)| signature_header(&s, t, b"{}")),
            header_like(),
        ],
        secret in any::<String>(),
        inserts in prop::collection::vec((any::<prop::sample::Index>(), ignored_item()), 1..6),
        now in -1000i64..1000,
    ) {
        let verify = |h: &str| verify_stripe_signature(Some(h), b"{}", &[&secret], 300, now);
        let mut items: Vec<String> = header.split(',').map(String::from).collect();
        for (at, item) in inserts {
            items.insert(at.index(items.len() + 1), item);
        }
        prop_assert_eq!(verify(&items.join(",")), verify(&header));
    }
}

proptest! {
    // Each case builds a header of up to 680 KB: a few cases cover both kinds.
    #![proptest_config(config(16))]

    /// Ten thousand `v1` items, empty or full hex, and the header is refused unread.
    #[test]
    fn ten_thousand_signatures_are_refused(full in any::<bool>(), t in -1000i64..1000) {
        let sig = compute_signature("s", t, b"{}");
        let v1 = if full { sig.as_str() } else { "" };
        let header = format!("t={t}{}", format!(",v1={v1}").repeat(10_000));
        let result = verify_stripe_signature(Some(&header), b"{}", &["s"], 300, t);
        prop_assert!(matches!(result, Err(SignatureError::HeaderTooLong | SignatureError::TooManySignatures)));
    }

    /// More than 16 `v1` items in a header short enough is refused for the count.
    #[test]
    fn more_than_sixteen_signatures_are_refused(n in (MAX_V1_SIGNATURES + 1)..200, t in -1000i64..1000) {
        let sig = compute_signature("s", t, b"{}");
        let header = format!("t={t},v1={sig}{}", ",v1=".repeat(n - 1));
        prop_assert_eq!(
            verify_stripe_signature(Some(&header), b"{}", &["s"], 300, t),
            Err(SignatureError::TooManySignatures)
        );
    }
}
