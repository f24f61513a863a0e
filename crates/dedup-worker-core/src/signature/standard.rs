//! Standard Webhooks (standardwebhooks.com) signature verification, for the ingress's second
//! provider at `POST /webhooks/standard` (`webhook::standard`).
//!
//! Rules (see shared/conformance.md): headers `webhook-id`, `webhook-timestamp` (integer
//! seconds) and `webhook-signature`: space-separated items, `v1,<base64>` (HMAC-SHA256 keyed
//! with a base64-decoded `whsec_` secret, compared in constant time) and `v1a,<base64>` (ed25519
//! under a `whpk_` public key, checked with `verify_strict`), several during a rotation. Both
//! sign `"{id}.{timestamp}.{raw body}"`; any one valid item verifies the delivery; ±tolerance.
//! The dedup key is `webhook-id`.
//!
//! Work is bounded whatever a client sends: a `webhook-signature` longer than
//! [`MAX_SIGNATURE_HEADER_BYTES`], with more than [`MAX_SIGNATURES`] `v1,` and `v1a,` items,
//! or with more `v1a,` items × public keys than [`MAX_ED25519_VERIFICATIONS`], and a
//! `webhook-timestamp` longer than [`MAX_TIMESTAMP_HEADER_BYTES`], are refused before any
//! signature is decoded or checked.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::Mac;

use super::ed25519::{signed_content, StandardPublicKey, MAX_PUBLIC_KEYS};
use super::secrets::{standard_mac, InvalidStandardSecret, StandardSecret};

/// Longest `webhook-signature` header accepted: a `v1,` item is 47 bytes, a `v1a,` item 92, so
/// this covers any real rotation with room to spare.
pub const MAX_SIGNATURE_HEADER_BYTES: usize = 8192;

/// Most `v1,` and `v1a,` items, counted together, accepted in one `webhook-signature` (one per
/// active key). Each costs a base64 decode, and a constant-time comparison per secret or an
/// ed25519 verification per public key.
pub const MAX_SIGNATURES: usize = 16;

/// Most ed25519 verifications one delivery may cost: its `v1a,` items × the configured public
/// keys. One is about 50 µs plus hashing the whole body (a few hundred µs per 100 KiB), far more
/// than an HMAC comparison, so the product is bounded, not just the items.
pub const MAX_ED25519_VERIFICATIONS: usize = 16;

// With the most public keys the configuration accepts, a rotation's two signatures still fit.
const _: () = assert!(MAX_ED25519_VERIFICATIONS >= 2 * MAX_PUBLIC_KEYS);

/// Longest `webhook-timestamp` accepted: an `i64` takes at most 20 characters, the rest is
/// room for surrounding whitespace.
pub const MAX_TIMESTAMP_HEADER_BYTES: usize = 32;

/// Why a Standard Webhooks delivery was refused; `check` names it for machines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandardSignatureError {
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp header is not an integer number of seconds")]
    MalformedTimestamp,
    #[error("the webhook-timestamp header is longer than {MAX_TIMESTAMP_HEADER_BYTES} bytes")]
    TimestampTooLong,
    #[error("the webhook-signature header is longer than {MAX_SIGNATURE_HEADER_BYTES} bytes")]
    SignatureHeaderTooLong,
    #[error("the webhook-signature header has more than {MAX_SIGNATURES} v1 and v1a signatures")]
    TooManySignatures,
    #[error(
        "the webhook-signature header has {signatures} v1a signatures and {public_keys} public \
         keys are configured: more than the {MAX_ED25519_VERIFICATIONS} ed25519 verifications \
         one delivery may cost"
    )]
    TooManyEd25519Checks {
        signatures: usize,
        public_keys: usize,
    },
    #[error("no signatures found with expected scheme v1 or v1a")]
    NoV1Signature,
    #[error("timestamp outside the tolerance zone ({skew_secs} s from now, tolerance {tolerance_secs} s)")]
    TimestampOutsideTolerance { skew_secs: i64, tolerance_secs: u64 },
    /// `malformed`: items that are not base64 of a 32-byte (`v1`) or 64-byte (`v1a`)
    /// signature. They never match, and never stop another item from matching (a sender in
    /// the middle of a rotation may list one the receiver cannot read).
    #[error(
        "no signatures found matching the expected signature for payload{}",
        malformed_note(*malformed)
    )]
    NoMatchingSignature { malformed: usize },
}

fn malformed_note(malformed: usize) -> String {
    match malformed {
        0 => String::new(),
        n => format!(
            " ({n} of the signatures is not base64 of a 32-byte v1 or a 64-byte v1a signature)"
        ),
    }
}

impl StandardSignatureError {
    pub fn check(&self) -> &'static str {
        match self {
            StandardSignatureError::MissingHeader(_) => "missing_header",
            StandardSignatureError::MalformedTimestamp
            | StandardSignatureError::TimestampTooLong
            | StandardSignatureError::SignatureHeaderTooLong
            | StandardSignatureError::TooManySignatures
            | StandardSignatureError::TooManyEd25519Checks { .. } => "malformed_header",
            // The name predates v1a; it now means that neither a v1 nor a v1a item was found.
            StandardSignatureError::NoV1Signature => "no_v1_signature",
            StandardSignatureError::TimestampOutsideTolerance { .. } => "timestamp_tolerance",
            StandardSignatureError::NoMatchingSignature { .. } => "signature_mismatch",
        }
    }
}

/// What a delivery is verified with: decoded `whsec_` secrets for its `v1,` items, `whpk_`
/// public keys for its `v1a,` items.
#[derive(Debug, Clone, Copy, Default)]
pub struct StandardKeys<'a> {
    pub secrets: &'a [Vec<u8>],
    pub public_keys: &'a [StandardPublicKey],
}

impl<'a> StandardKeys<'a> {
    /// HMAC secrets only.
    pub fn hmac(secrets: &'a [Vec<u8>]) -> Self {
        StandardKeys {
            secrets,
            public_keys: &[],
        }
    }

    /// Ed25519 public keys only.
    pub fn ed25519(public_keys: &'a [StandardPublicKey]) -> Self {
        StandardKeys {
            secrets: &[],
            public_keys,
        }
    }
}

/// Decodes a `whsec_<base64>` secret into the HMAC key, of any length. The configuration's
/// [`StandardSecret::parse`] also refuses empty and short keys.
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, InvalidStandardSecret> {
    StandardSecret::decode(secret)
}

/// The `webhook-signature` value (`v1,<base64>`) for a delivery.
pub fn standard_signature(key: &[u8], id: &str, timestamp: i64, payload: &[u8]) -> String {
    format!(
        "v1,{}",
        BASE64.encode(
            standard_mac(key, id, timestamp, payload)
                .finalize()
                .into_bytes()
        )
    )
}

/// The core of `v1a`: whether `signature` is `key`'s ed25519 signature of `content` (the signed
/// content, `{id}.{timestamp}.{payload}`). `verify_strict` refuses what RFC 8032's own check
/// lets through: small-order public keys and `R` components (under which one signature can
/// verify for many messages or keys), and non-canonical encodings.
pub fn verify_v1a(key: &VerifyingKey, content: &[u8], signature: &[u8; 64]) -> bool {
    key.verify_strict(content, &Signature::from_bytes(signature))
        .is_ok()
}

/// The three headers of one delivery, as received (`None`: absent).
#[derive(Debug, Clone, Copy)]
pub struct StandardHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// The schemes of `webhook-signature` items; other schemes are not candidates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    V1,
    V1a,
}

/// An item's scheme and its base64 part, or `None` for another scheme.
fn scheme(item: &str) -> Option<(Scheme, &str)> {
    if let Some(b64) = item.strip_prefix("v1,") {
        Some((Scheme::V1, b64))
    } else {
        item.strip_prefix("v1a,").map(|b64| (Scheme::V1a, b64))
    }
}

/// A decoded candidate signature.
enum Candidate {
    V1([u8; 32]),
    V1a([u8; 64]),
    /// Not base64 of the scheme's length: never matches.
    Malformed,
}

fn decode_candidate(scheme: Scheme, b64: &str) -> Candidate {
    let Ok(bytes) = BASE64.decode(b64) else {
        return Candidate::Malformed;
    };
    match scheme {
        Scheme::V1 => bytes.try_into().map_or(Candidate::Malformed, Candidate::V1),
        Scheme::V1a => bytes
            .try_into()
            .map_or(Candidate::Malformed, Candidate::V1a),
    }
}

/// Verifies a delivery: its `v1,` items against every secret, its `v1a,` items against every
/// public key, at `now` (Unix seconds). Any one match verifies it.
pub fn verify_standard_signature(
    headers: StandardHeaders<'_>,
    payload: &[u8],
    keys: StandardKeys<'_>,
    tolerance_secs: u64,
    now: i64,
) -> Result<(), StandardSignatureError> {
    let id = headers
        .id
        .filter(|s| !s.is_empty())
        .ok_or(StandardSignatureError::MissingHeader("webhook-id"))?;
    let timestamp = headers
        .timestamp
        .ok_or(StandardSignatureError::MissingHeader("webhook-timestamp"))?;
    let signature = headers
        .signature
        .ok_or(StandardSignatureError::MissingHeader("webhook-signature"))?;
    if timestamp.len() > MAX_TIMESTAMP_HEADER_BYTES {
        return Err(StandardSignatureError::TimestampTooLong);
    }
    let timestamp: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| StandardSignatureError::MalformedTimestamp)?;
    if signature.len() > MAX_SIGNATURE_HEADER_BYTES {
        return Err(StandardSignatureError::SignatureHeaderTooLong);
    }
    // Counted before decoding any: a header with too many costs one scan, nothing more.
    let items = || signature.split_whitespace().filter_map(scheme);
    if items().nth(MAX_SIGNATURES).is_some() {
        return Err(StandardSignatureError::TooManySignatures);
    }
    let v1a = items().filter(|(s, _)| *s == Scheme::V1a).count();
    if v1a.saturating_mul(keys.public_keys.len()) > MAX_ED25519_VERIFICATIONS {
        return Err(StandardSignatureError::TooManyEd25519Checks {
            signatures: v1a,
            public_keys: keys.public_keys.len(),
        });
    }
    let candidates: Vec<Candidate> = items().map(|(s, b64)| decode_candidate(s, b64)).collect();
    if candidates.is_empty() {
        return Err(StandardSignatureError::NoV1Signature);
    }
    let skew = now.saturating_sub(timestamp);
    if skew.unsigned_abs() > tolerance_secs {
        return Err(StandardSignatureError::TimestampOutsideTolerance {
            skew_secs: skew,
            tolerance_secs,
        });
    }
    let v1_candidates: Vec<&[u8; 32]> = candidates
        .iter()
        .filter_map(|c| match c {
            Candidate::V1(sig) => Some(sig),
            _ => None,
        })
        .collect();
    let v1a_candidates: Vec<&[u8; 64]> = candidates
        .iter()
        .filter_map(|c| match c {
            Candidate::V1a(sig) => Some(sig),
            _ => None,
        })
        .collect();
    // HMACs first: a fraction of the cost of one ed25519 verification. Each side's work is
    // skipped when the header has nothing for it (an HMAC hashes the whole body too).
    if !v1_candidates.is_empty() {
        for key in keys.secrets {
            let mac = standard_mac(key, id, timestamp, payload);
            if v1_candidates
                .iter()
                .any(|sig| mac.clone().verify_slice(&sig[..]).is_ok())
            {
                return Ok(());
            }
        }
    }
    if !v1a_candidates.is_empty() && !keys.public_keys.is_empty() {
        // One copy of the body for every verification (ed25519 hashes its message whole).
        let content = signed_content(id, timestamp, payload);
        for key in keys.public_keys {
            if v1a_candidates
                .iter()
                .any(|sig| verify_v1a(key.verifying_key(), &content, sig))
            {
                return Ok(());
            }
        }
    }
    Err(StandardSignatureError::NoMatchingSignature {
        malformed: candidates
            .iter()
            .filter(|c| matches!(c, Candidate::Malformed))
            .count(),
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod v1a_tests;
