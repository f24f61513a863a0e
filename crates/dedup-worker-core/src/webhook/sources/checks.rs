//! The pieces of verification every scheme shares: a required header, HMAC-SHA256 against each
//! secret in constant time, a signed timestamp held to the tolerance, and the problems a forgery
//! or an unkeyable delivery gets (`check` names the step that failed).

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::Keys;
use crate::http::problem::Problem;
use crate::webhook::deliver::{header_text, invalid_signature};

/// A header every delivery of the scheme carries; its absence is the `missing_header` check.
pub(super) fn required<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, Problem> {
    header_text(headers, name)?
        .ok_or_else(|| invalid_signature(format!("the {name} header is missing"), "missing_header"))
}

/// Whether one of `secrets` gives `signature` as the HMAC-SHA256 of `parts` (concatenated),
/// compared in constant time (`verify_slice`); every secret is tried, each with one pass over
/// the body.
pub(super) fn hmac_sha256_matches(secrets: &[Vec<u8>], parts: &[&[u8]], signature: &[u8]) -> bool {
    hmac_sha256_matches_any(secrets, parts, &[signature])
}

/// Whether one of `secrets` gives one of `signatures` (a header carrying several, as Paddle's
/// during a rotation) as the HMAC-SHA256 of `parts`: one pass over the body per secret, each
/// signature compared in constant time.
pub(super) fn hmac_sha256_matches_any(
    secrets: &[Vec<u8>],
    parts: &[&[u8]],
    signatures: &[&[u8]],
) -> bool {
    secrets.iter().any(|secret| {
        // HMAC takes keys of any length; new_from_slice cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
            return false;
        };
        for part in parts {
            mac.update(part);
        }
        signatures
            .iter()
            .any(|signature| mac.clone().verify_slice(signature).is_ok())
    })
}

/// Whether `at` (Unix seconds, as signed) is within `keys.tolerance_secs` of now, either way;
/// the `timestamp_tolerance` 400 otherwise.
pub(super) fn within_tolerance(at: i64, keys: &Keys<'_>) -> Result<(), Problem> {
    let skew = keys.now.saturating_sub(at);
    if skew.unsigned_abs() > keys.tolerance_secs {
        return Err(invalid_signature(
            format!(
                "timestamp outside the tolerance zone: {} s in the {} (tolerance {} s)",
                skew.unsigned_abs(),
                if skew >= 0 { "past" } else { "future" },
                keys.tolerance_secs
            ),
            "timestamp_tolerance",
        ));
    }
    Ok(())
}

/// The 400 for a signature no secret made.
pub(super) fn mismatch(header: &str) -> Problem {
    invalid_signature(
        format!(
            "the {header} header matches no signature of the payload under the source's secrets"
        ),
        "signature_mismatch",
    )
}

/// The 400 for a signature header that is not in the scheme's form.
pub(super) fn malformed(header: &str, form: &str) -> Problem {
    invalid_signature(
        format!("the {header} header is not of the form {form}"),
        "malformed_header",
    )
}

/// The 400 for a verified delivery without the id it is deduplicated on.
pub(super) fn missing_id(where_: &str) -> Problem {
    crate::webhook::deliver::invalid_payload(
        format!("the delivery has no {where_}, which its events are deduplicated on"),
        "missing_id",
    )
}
