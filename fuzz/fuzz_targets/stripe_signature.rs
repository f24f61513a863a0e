//! `Stripe-Signature` verification never panics, and a header made by `signature_header`
//! verifies (and only for its own payload).
//!
//! Input: newline-separated fields, so seeds stay readable text:
//! `header \n secrets (space-separated) \n now \n tolerance \n payload (rest, any bytes)`.
//! A missing or unparsable number field becomes 0.
#![no_main]

use dedup_worker_core::signature::stripe::{signature_header, verify_stripe_signature, SignatureError};
use libfuzzer_sys::fuzz_target;

#[path = "support.rs"]
mod support;

fuzz_target!(init: support::catch_stack_overflow(), |data: &[u8]| {
    let mut fields = data.splitn(5, |&b| b == b'\n');
    let header = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let secrets_line = String::from_utf8_lossy(fields.next().unwrap_or_default());
    let now: i64 = number(fields.next());
    let tolerance: u64 = number(fields.next());
    let payload = fields.next().unwrap_or_default();
    let secrets: Vec<&str> = secrets_line.split(' ').collect();

    // 1. Arbitrary header, payload, secrets, clock: an answer, never a panic.
    let result = verify_stripe_signature(Some(&header), payload, &secrets, tolerance, now);
    if let Err(e) = &result {
        let _ = e.to_string();
        let _ = e.check();
        if let SignatureError::TimestampOutsideTolerance { skew_secs, tolerance_secs } = e {
            assert_eq!(*tolerance_secs, tolerance);
            assert!(skew_secs.unsigned_abs() > tolerance);
        }
    }
    assert_eq!(
        verify_stripe_signature(None, payload, &secrets, tolerance, now),
        Err(SignatureError::MissingHeader)
    );
    // No secret, no match.
    assert!(verify_stripe_signature(Some(&header), payload, &[] as &[&str], tolerance, now).is_err());

    // 2. Round trip: signed with one of the secrets at `now`, it verifies at `now` even with
    //    zero tolerance, whichever position that secret has in the list...
    let secret = secrets[0];
    let signed = signature_header(secret, now, payload);
    assert_eq!(
        verify_stripe_signature(Some(&signed), payload, &secrets, 0, now),
        Ok(()),
        "own header {signed:?} did not verify"
    );
    let mut rotated = secrets.clone();
    rotated.rotate_left(1);
    assert_eq!(verify_stripe_signature(Some(&signed), payload, &rotated, 0, now), Ok(()));
    // ...and never for another payload.
    let mut other = payload.to_vec();
    other.push(b'x');
    assert_eq!(
        verify_stripe_signature(Some(&signed), &other, &secrets, 0, now),
        Err(SignatureError::NoMatchingSignature)
    );
});

fn number<T: std::str::FromStr + Default>(field: Option<&[u8]>) -> T {
    field
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_default()
}
