//! `Stripe-Signature` verification, on the raw body bytes and before any parsing.
//!
//! Rules (see shared/conformance.md): comma-separated `key=value` items; `t` is integer Unix
//! seconds; any number of `v1` (secret rotation); `v0` and unknown keys ignored. The signed
//! string is `"{t}.{raw body}"`, HMAC-SHA256 keyed with the whole secret string (`whsec_`
//! included), lower-case hex, compared in constant time. Timestamps further than the tolerance
//! in the past *or the future* are refused.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature was refused. The `Display` text names the failed check and never reveals an
/// expected signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Stripe-Signature header is missing")]
    MissingHeader,
    #[error("unable to extract timestamp and signatures from the Stripe-Signature header")]
    MalformedHeader,
    #[error("no signatures found with expected scheme v1")]
    NoV1Signature,
    #[error(
        "timestamp outside the tolerance zone: {} s in the {} (tolerance {tolerance_secs} s)",
        skew_secs.unsigned_abs(),
        if *skew_secs >= 0 { "past" } else { "future" }
    )]
    TimestampOutsideTolerance { skew_secs: i64, tolerance_secs: u64 },
    #[error("no signatures found matching the expected signature for payload")]
    NoMatchingSignature,
}

impl SignatureError {
    /// A stable machine-readable name of the failed check (the problem+json `check` member).
    pub fn check(&self) -> &'static str {
        match self {
            SignatureError::MissingHeader => "missing_header",
            SignatureError::MalformedHeader => "malformed_header",
            SignatureError::NoV1Signature => "no_v1_signature",
            SignatureError::TimestampOutsideTolerance { .. } => "timestamp_tolerance",
            SignatureError::NoMatchingSignature => "signature_mismatch",
        }
    }
}

/// A parsed header: the timestamp and the decoded `v1` signatures.
#[derive(Debug, PartialEq, Eq)]
struct ParsedHeader {
    timestamp: i64,
    /// Decoded `v1` values; `None` for one that is not 32 bytes of hex (present, never matches).
    v1: Vec<Option<Vec<u8>>>,
}

fn parse_header(header: &str) -> Result<ParsedHeader, SignatureError> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for item in header.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            return Err(SignatureError::MalformedHeader);
        };
        match key {
            "t" => {
                let t: i64 = value.parse().map_err(|_| SignatureError::MalformedHeader)?;
                timestamp = Some(t);
            }
            // A v1 that is not 32 bytes of hex can never match, but it is a v1: the header is
            // not refused for it, since another v1 may be valid.
            "v1" => v1.push(hex::decode(value).ok().filter(|bytes| bytes.len() == 32)),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::MalformedHeader)?;
    Ok(ParsedHeader { timestamp, v1 })
}

fn mac_for(secret: &str, timestamp: i64, payload: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

/// Computes the lower-case hex `v1` signature of `payload` at `timestamp`.
pub fn compute_signature(secret: &str, timestamp: i64, payload: &[u8]) -> String {
    hex::encode(mac_for(secret, timestamp, payload).finalize().into_bytes())
}

/// A full `Stripe-Signature` header value for `payload` (for `dedup-worker sign` and tests).
pub fn signature_header(secret: &str, timestamp: i64, payload: &[u8]) -> String {
    format!(
        "t={timestamp},v1={}",
        compute_signature(secret, timestamp, payload)
    )
}

/// Verifies `header` (None: the header was absent) for `payload` against every secret, at time
/// `now` (Unix seconds; injectable so published vectors verify at their own time).
pub fn verify_stripe_signature(
    header: Option<&str>,
    payload: &[u8],
    secrets: &[impl AsRef<str>],
    tolerance_secs: u64,
    now: i64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::MissingHeader)?;
    let parsed = parse_header(header)?;
    if parsed.v1.is_empty() {
        return Err(SignatureError::NoV1Signature);
    }
    let skew = now.saturating_sub(parsed.timestamp);
    if skew.unsigned_abs() > tolerance_secs {
        return Err(SignatureError::TimestampOutsideTolerance {
            skew_secs: skew,
            tolerance_secs,
        });
    }
    for secret in secrets {
        let mac = mac_for(secret.as_ref(), parsed.timestamp, payload);
        // verify_slice compares in constant time; each candidate gets its own clone.
        if parsed
            .v1
            .iter()
            .flatten()
            .any(|sig| mac.clone().verify_slice(sig).is_ok())
        {
            return Ok(());
        }
    }
    Err(SignatureError::NoMatchingSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR: &[u8] = include_bytes!("../../tests/vectors/stripe_invoiceitem_created.json");
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
        let edge =
            verify_stripe_signature(Some(&format!("t=100,v1={sig}")), b"{}", &["s"], 300, 400);
        assert_eq!(edge, Ok(()));
    }

    #[test]
    fn the_whole_secret_string_is_the_key() {
        let with_prefix = compute_signature("whsec_abc", 1, b"x");
        let without = compute_signature("abc", 1, b"x");
        assert_ne!(with_prefix, without);
    }
}
