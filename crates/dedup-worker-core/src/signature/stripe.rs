//! `Stripe-Signature` verification, on the raw body bytes and before any parsing: the ingress
//! checks a delivery with it ([`verify_delivery`], within the timestamp tolerance), and carries
//! the compact signature with the message; [`verify_authenticity`] checks such a signature again
//! with no tolerance. (Since issue 36 the consumer no longer reads it: a signed `created` chose
//! which dedup generations were looked up, and a holder of the secret could re-sign one.)
//!
//! Rules (see shared/conformance.md): comma-separated `key=value` items; `t` is integer Unix
//! seconds; any number of `v1` (secret rotation); `v0` and unknown keys ignored. The signed
//! string is `"{t}.{raw body}"`, HMAC-SHA256 keyed with the whole secret string (`whsec_`
//! included), lower-case hex, compared in constant time. At the ingress, timestamps further than
//! the tolerance in the past *or the future* are refused.
//!
//! Work is bounded whatever a client (or a queue's producer) sends: a header longer than
//! [`MAX_SIGNATURE_HEADER_BYTES`] or with more than [`MAX_V1_SIGNATURES`] `v1` items is refused
//! before any HMAC is computed, so one check costs at most one HMAC pass over the payload per
//! secret and a bounded number of constant-time comparisons.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Longest `Stripe-Signature` header accepted. Stripe sends `t=` and one `v1` per active
/// secret (two during a rotation), about 150 bytes; 8 KiB also covers any future scheme.
pub const MAX_SIGNATURE_HEADER_BYTES: usize = 8192;

/// Most `v1` items accepted in one header: one per secret the endpoint has active (Stripe
/// allows a handful during rotation). Each costs a constant-time comparison per secret.
pub const MAX_V1_SIGNATURES: usize = 16;

/// Why a signature was refused. The `Display` text names the failed check and never reveals an
/// expected signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Stripe-Signature header is missing")]
    MissingHeader,
    #[error("unable to extract timestamp and signatures from the Stripe-Signature header")]
    MalformedHeader,
    #[error("the Stripe-Signature header is longer than {MAX_SIGNATURE_HEADER_BYTES} bytes")]
    HeaderTooLong,
    #[error("the Stripe-Signature header has more than {MAX_V1_SIGNATURES} v1 signatures")]
    TooManySignatures,
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
            SignatureError::MalformedHeader
            | SignatureError::HeaderTooLong
            | SignatureError::TooManySignatures => "malformed_header",
            SignatureError::NoV1Signature => "no_v1_signature",
            SignatureError::TimestampOutsideTolerance { .. } => "timestamp_tolerance",
            SignatureError::NoMatchingSignature => "signature_mismatch",
        }
    }
}

/// A signature that verified: its timestamp and the `v1` that matched one of the secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSignature {
    /// `t`: when Stripe signed the delivery (Unix seconds, Stripe's clock).
    pub timestamp: i64,
    /// The matching `v1`.
    v1: Vec<u8>,
}

impl VerifiedSignature {
    /// `t=<t>,v1=<the v1 that matched>`: the signature reduced to what verifies it, which the
    /// ingress carries with the message (a `Stripe-Signature` header of its own, ~80 bytes).
    pub fn compact(&self) -> String {
        format!("t={},v1={}", self.timestamp, hex::encode(&self.v1))
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
    if header.len() > MAX_SIGNATURE_HEADER_BYTES {
        return Err(SignatureError::HeaderTooLong);
    }
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
            "v1" => {
                if v1.len() == MAX_V1_SIGNATURES {
                    return Err(SignatureError::TooManySignatures);
                }
                v1.push(hex::decode(value).ok().filter(|bytes| bytes.len() == 32));
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::MalformedHeader)?;
    if v1.is_empty() {
        return Err(SignatureError::NoV1Signature);
    }
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

/// The first `v1` of `parsed` that one of `secrets` made over `payload`; every secret is tried.
fn matching(
    parsed: ParsedHeader,
    payload: &[u8],
    secrets: &[impl AsRef<str>],
) -> Result<VerifiedSignature, SignatureError> {
    for secret in secrets {
        let mac = mac_for(secret.as_ref(), parsed.timestamp, payload);
        // verify_slice compares in constant time; each candidate gets its own clone.
        if let Some(v1) = parsed
            .v1
            .iter()
            .flatten()
            .find(|sig| mac.clone().verify_slice(sig).is_ok())
        {
            return Ok(VerifiedSignature {
                timestamp: parsed.timestamp,
                v1: v1.clone(),
            });
        }
    }
    Err(SignatureError::NoMatchingSignature)
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

/// Verifies a delivery's `header` (None: the header was absent) for `payload` against every
/// secret, at time `now` (Unix seconds; injectable so published vectors verify at their own
/// time): the timestamp must be within `tolerance_secs` of `now`, either way (a replay at the
/// door is refused). The verified signature, to carry with the message.
pub fn verify_delivery(
    header: Option<&str>,
    payload: &[u8],
    secrets: &[impl AsRef<str>],
    tolerance_secs: u64,
    now: i64,
) -> Result<VerifiedSignature, SignatureError> {
    let parsed = parse_header(header.ok_or(SignatureError::MissingHeader)?)?;
    let skew = now.saturating_sub(parsed.timestamp);
    if skew.unsigned_abs() > tolerance_secs {
        return Err(SignatureError::TimestampOutsideTolerance {
            skew_secs: skew,
            tolerance_secs,
        });
    }
    matching(parsed, payload, secrets)
}

/// [`verify_delivery`], for callers that only need the verdict.
pub fn verify_stripe_signature(
    header: Option<&str>,
    payload: &[u8],
    secrets: &[impl AsRef<str>],
    tolerance_secs: u64,
    now: i64,
) -> Result<(), SignatureError> {
    verify_delivery(header, payload, secrets, tolerance_secs, now).map(drop)
}

/// Whether one of `secrets` signed exactly `payload` at `header`'s `t`, however long ago: no
/// tolerance. The tolerance is about replays at the door, which the ingress refused already;
/// authenticity does not expire, so a message that waited in a queue (or a retry days later)
/// verifies as it did when it arrived.
pub fn verify_authenticity(
    header: &str,
    payload: &[u8],
    secrets: &[impl AsRef<str>],
) -> Result<VerifiedSignature, SignatureError> {
    matching(parse_header(header)?, payload, secrets)
}

#[cfg(test)]
mod tests;
