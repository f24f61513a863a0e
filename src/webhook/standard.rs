//! Standard Webhooks (standardwebhooks.com) signature verification, the optional second
//! provider at `POST /webhooks/standard`.
//!
//! Rules (see shared/conformance.md): headers `webhook-id`, `webhook-timestamp` (integer
//! seconds) and `webhook-signature` (space-separated `v1,<base64>` items, several during
//! rotation). Signed string `"{id}.{timestamp}.{raw body}"`, HMAC-SHA256 keyed with the
//! base64-decoded secret (after stripping `whsec_`), compared in constant time; ±tolerance.
//! The dedup key is `webhook-id`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a Standard Webhooks delivery was refused; `check` names it for machines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandardSignatureError {
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp header is not an integer number of seconds")]
    MalformedTimestamp,
    #[error("no signatures found with expected scheme v1")]
    NoV1Signature,
    #[error("timestamp outside the tolerance zone ({skew_secs} s from now, tolerance {tolerance_secs} s)")]
    TimestampOutsideTolerance { skew_secs: i64, tolerance_secs: u64 },
    #[error("no signatures found matching the expected signature for payload")]
    NoMatchingSignature,
}

impl StandardSignatureError {
    pub fn check(&self) -> &'static str {
        match self {
            StandardSignatureError::MissingHeader(_) => "missing_header",
            StandardSignatureError::MalformedTimestamp => "malformed_header",
            StandardSignatureError::NoV1Signature => "no_v1_signature",
            StandardSignatureError::TimestampOutsideTolerance { .. } => "timestamp_tolerance",
            StandardSignatureError::NoMatchingSignature => "signature_mismatch",
        }
    }
}

/// A secret that is not `whsec_`-prefixed base64 (reported at start-up, naming the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a Standard Webhooks secret must be base64 (optionally prefixed whsec_): {0}")]
pub struct InvalidSecret(String);

/// Decodes a `whsec_<base64>` secret into the HMAC key.
pub fn decode_secret(secret: &str) -> Result<Vec<u8>, InvalidSecret> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    BASE64
        .decode(encoded)
        .map_err(|e| InvalidSecret(e.to_string()))
}

fn mac_for(key: &[u8], id: &str, timestamp: i64, payload: &[u8]) -> HmacSha256 {
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

/// The `webhook-signature` value (`v1,<base64>`) for a delivery.
pub fn standard_signature(key: &[u8], id: &str, timestamp: i64, payload: &[u8]) -> String {
    format!(
        "v1,{}",
        BASE64.encode(mac_for(key, id, timestamp, payload).finalize().into_bytes())
    )
}

/// The three headers of one delivery, as received (`None`: absent).
#[derive(Debug, Clone, Copy)]
pub struct StandardHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Verifies a delivery against every key (decoded secrets), at `now` (Unix seconds).
pub fn verify_standard_signature(
    headers: StandardHeaders<'_>,
    payload: &[u8],
    keys: &[Vec<u8>],
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
    let timestamp: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| StandardSignatureError::MalformedTimestamp)?;
    let candidates: Vec<Option<Vec<u8>>> = signature
        .split_whitespace()
        .filter_map(|item| item.strip_prefix("v1,"))
        .map(|b64| BASE64.decode(b64).ok())
        .collect();
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
    for key in keys {
        let mac = mac_for(key, id, timestamp, payload);
        if candidates
            .iter()
            .flatten()
            .any(|sig| mac.clone().verify_slice(sig).is_ok())
        {
            return Ok(());
        }
    }
    Err(StandardSignatureError::NoMatchingSignature)
}

#[cfg(test)]
mod tests {
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
                std::slice::from_ref(&key),
                300,
                T
            ),
            Ok(())
        );
        // Rotation: any listed signature may match.
        let both = format!("v1,AAAA {EXPECTED}");
        assert_eq!(
            verify_standard_signature(headers(&both, &t), PAYLOAD, &[key], 300, T + 299),
            Ok(())
        );
    }

    #[test]
    fn failures_are_told_apart() {
        let key = decode_secret(SECRET).unwrap();
        let t = T.to_string();
        let keys = [key];
        let verify = |h, p: &[u8], now| verify_standard_signature(h, p, &keys, 300, now);
        assert_eq!(
            verify(headers(EXPECTED, &t), b"{}", T),
            Err(StandardSignatureError::NoMatchingSignature)
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
}
