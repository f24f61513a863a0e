//! `scheme = "hmac"`: the declarative scheme. The source's rules (`crate::config::HmacRules`,
//! from its `[sources.NAME.hmac]` table over its preset) say which header carries the
//! signature(s) and how they are written, what string is signed (the raw body with, around it,
//! the timestamp as sent, `public_url`, the method and named headers), where the timestamp is
//! and how far it may be from now, and where the dedup id and type are (a header or JSON
//! pointers into the body). Every signature of the header is compared with the HMAC under
//! every key in constant time (`verify_slice`), one pass over the body per key.
//!
//! With `items_pointer`, the body is a batch (HubSpot's JSON array): each element of the array
//! it points at is an event of its own, its id and type read in it, its payload its bytes as
//! sent (`json_items.rs`); a batch of none is refused by the route (`empty_batch`).
//!
//! What it does not do: answer a handshake (Slack's `url_verification`, Zoom's
//! `endpoint.url_validation`, Twitch's `webhook_callback_verification`): those are events here,
//! deduplicated like any other; the named schemes answer them.

use ::hmac::digest::KeyInit;
use ::hmac::{Hmac, Mac};
use bytes::Bytes;
use serde_json::Value;

use super::{malformed, mismatch, missing_id, required, within_tolerance};
use super::{BatchEvent, Delivery, Identified, Keys, Scheme};
use crate::config::{
    HmacAlgorithm, HmacEncoding, HmacRules, Locator, Piece, TimestampAt, TimestampFormat,
    MAX_SIGNATURES_PER_HEADER,
};
use crate::http::problem::Problem;
use crate::webhook::deliver::{header_text, invalid_payload};

/// The declarative scheme with one source's rules.
pub(super) struct Declarative {
    /// The source's resolved rules.
    rules: HmacRules,
}

/// What the signature header holds.
struct Signed<'h> {
    /// Each well-formed signature's bytes.
    signatures: Vec<Vec<u8>>,
    /// The `timestamp_key` part's value, when the rules put the timestamp there.
    timestamp: Option<&'h str>,
}

impl Declarative {
    pub(super) fn new(rules: HmacRules) -> Self {
        Declarative { rules }
    }

    /// The header's form, for a `malformed_header` problem.
    fn form(&self) -> String {
        let rules = &self.rules;
        let encoding = match rules.encoding {
            HmacEncoding::Hex => "hex",
            HmacEncoding::Base64 => "base64",
            HmacEncoding::Base64url => "base64url",
        };
        let one = format!(
            "{}<{encoding} of {} bytes>",
            rules.signature_prefix,
            rules.algorithm.digest_len()
        );
        let one = match &rules.signature_key {
            Some(key) => format!("{key}={one}"),
            None => one,
        };
        match &rules.separator {
            Some(sep) => format!("{one}[{sep}{one}…] (at most {MAX_SIGNATURES_PER_HEADER})"),
            None => one,
        }
    }

    /// The signatures (and the timestamp, for `timestamp_key`) of the signature header. Parts
    /// without the prefix, of another key, or not decoding to a digest's length are skipped
    /// (a signature version this source does not check); none left is `malformed_header`.
    fn signed<'h>(&self, header: &'h str) -> Result<Signed<'h>, Problem> {
        let rules = &self.rules;
        let name = &rules.signature_header;
        let parts: Vec<&str> = match &rules.separator {
            Some(sep) => header
                .split(sep.as_str())
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect(),
            None => vec![header.trim()],
        };
        // Bounds the comparisons a delivery can cause: each is an HMAC check per key.
        if parts.len() > 2 * MAX_SIGNATURES_PER_HEADER {
            return Err(malformed(name, &self.form()));
        }
        let timestamp_key = match &rules.timestamp {
            Some((TimestampAt::Key(key), _)) => Some(key.as_str()),
            _ => None,
        };
        let mut found = Signed {
            signatures: Vec::new(),
            timestamp: None,
        };
        for part in parts {
            let value = match &rules.signature_key {
                None => part,
                Some(signature_key) => match part.split_once('=') {
                    Some((key, value)) if Some(key) == timestamp_key => {
                        found.timestamp = Some(value);
                        continue;
                    }
                    Some((key, value)) if key == signature_key => value,
                    _ => continue,
                },
            };
            let Some(encoded) = value.strip_prefix(rules.signature_prefix.as_str()) else {
                continue;
            };
            if let Some(bytes) = decode(rules.encoding, encoded)
                .filter(|bytes| bytes.len() == rules.algorithm.digest_len())
            {
                found.signatures.push(bytes);
            }
        }
        if found.signatures.is_empty() || found.signatures.len() > MAX_SIGNATURES_PER_HEADER {
            return Err(malformed(name, &self.form()));
        }
        Ok(found)
    }

    /// The timestamp as sent, once held to the tolerance; `None` when the rules sign none.
    fn timestamp<'h>(
        &self,
        delivery: &Delivery<'h>,
        from_signature: Option<&'h str>,
        keys: &Keys<'_>,
    ) -> Result<Option<&'h str>, Problem> {
        let Some((at, format)) = &self.rules.timestamp else {
            return Ok(None);
        };
        let (text, where_) = match at {
            TimestampAt::Header(header) => (required(delivery.headers, header)?, header.as_str()),
            TimestampAt::Key(key) => {
                let text = from_signature.ok_or_else(|| {
                    malformed(
                        &self.rules.signature_header,
                        &format!("{key}=<timestamp> and {}", self.form()),
                    )
                })?;
                (text, self.rules.signature_header.as_str())
            }
        };
        let seconds = unix_seconds(text, *format).ok_or_else(|| {
            let form = match format {
                TimestampFormat::Unix => "Unix seconds",
                TimestampFormat::UnixMs => "Unix milliseconds",
                TimestampFormat::Rfc3339 => "an RFC 3339 time",
            };
            malformed(where_, &format!("<{form}>"))
        })?;
        within_tolerance(seconds, keys)?;
        Ok(Some(text))
    }

    /// Each element of the array at `pointer` as its own event: its id and type read in it (a
    /// type header, if that is the rule, is every event's), its payload its bytes as sent.
    fn batch(&self, delivery: &Delivery<'_>, pointer: &str) -> Result<Identified, Problem> {
        let events = super::json_items::items(delivery.body, pointer)?
            .into_iter()
            .enumerate()
            .map(|(at, raw)| {
                // Valid JSON: the array it is an element of was read.
                let json: Value = serde_json::from_str(raw.get()).map_err(|e| {
                    invalid_payload(format!("item {at} is not JSON: {e}"), "payload_json")
                })?;
                let id = locate(&self.rules.id, delivery, Some(&json))?.ok_or_else(|| {
                    missing_id(&format!("{} (in item {at})", describe(&self.rules.id)))
                })?;
                let event_type = match &self.rules.event_type {
                    Some(locator) => locate(locator, delivery, Some(&json))?,
                    None => None,
                };
                Ok(BatchEvent {
                    id,
                    event_type,
                    payload: Bytes::copy_from_slice(raw.get().as_bytes()),
                })
            })
            .collect::<Result<Vec<_>, Problem>>()?;
        Ok(Identified::Batch {
            events,
            answer: None,
        })
    }
}

impl Scheme for Declarative {
    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = required(delivery.headers, &self.rules.signature_header)?;
        let signed = self.signed(header)?;
        let timestamp = self.timestamp(delivery, signed.timestamp, keys)?;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(self.rules.signed.len());
        for piece in &self.rules.signed {
            parts.push(match piece {
                Piece::Text(text) => text.as_bytes(),
                Piece::Body => delivery.body,
                // Present: the rules are refused at start when the template has {timestamp}
                // and nothing says where it is.
                Piece::Timestamp => timestamp.unwrap_or_default().as_bytes(),
                // Present: required at start when the template has {url}.
                Piece::Url => keys.public_url.unwrap_or_default().as_bytes(),
                // The only method the route takes.
                Piece::Method => b"POST",
                Piece::Header(name) => required(delivery.headers, name)?.as_bytes(),
            });
        }
        let signatures: Vec<&[u8]> = signed.signatures.iter().map(Vec::as_slice).collect();
        let matched = match self.rules.algorithm {
            HmacAlgorithm::Sha1 => {
                any_matches::<Hmac<sha1::Sha1>>(keys.secrets, &parts, &signatures)
            }
            HmacAlgorithm::Sha256 => {
                any_matches::<Hmac<sha2::Sha256>>(keys.secrets, &parts, &signatures)
            }
            HmacAlgorithm::Sha512 => {
                any_matches::<Hmac<sha2::Sha512>>(keys.secrets, &parts, &signatures)
            }
        };
        if matched {
            Ok(())
        } else {
            Err(mismatch(&self.rules.signature_header))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        if let Some(pointer) = &self.rules.items {
            return self.batch(delivery, pointer);
        }
        let reads_the_body = matches!(self.rules.id, Locator::Pointer(_))
            || matches!(self.rules.event_type, Some(Locator::Pointer(_)));
        let json = if reads_the_body {
            Some(serde_json::from_slice::<Value>(delivery.body).map_err(|e| {
                invalid_payload(format!("the body is not JSON: {e}"), "payload_json")
            })?)
        } else {
            None
        };
        let id = locate(&self.rules.id, delivery, json.as_ref())?
            .ok_or_else(|| missing_id(&describe(&self.rules.id)))?;
        let event_type = match &self.rules.event_type {
            Some(locator) => locate(locator, delivery, json.as_ref())?,
            None => None,
        };
        Ok(Identified::Event { id, event_type })
    }
}

/// Whether one of `keys` gives one of `signatures` as the HMAC `M` of `parts`: one pass over
/// the parts per key, each signature compared in constant time.
fn any_matches<M: Mac + KeyInit + Clone>(
    keys: &[Vec<u8>],
    parts: &[&[u8]],
    signatures: &[&[u8]],
) -> bool {
    keys.iter().any(|key| {
        // HMAC takes keys of any length; this cannot fail for it.
        let Ok(mut mac) = <M as KeyInit>::new_from_slice(key) else {
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

/// `text` decoded as `encoding`; `None` when it is not.
fn decode(encoding: HmacEncoding, text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine;
    // Padding either way: senders differ, and the bytes are what is compared.
    const LENIENT: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    match encoding {
        HmacEncoding::Hex => hex::decode(text).ok(),
        HmacEncoding::Base64 => GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT)
            .decode(text)
            .ok(),
        HmacEncoding::Base64url => GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT)
            .decode(text)
            .ok(),
    }
}

/// The timestamp `text` in Unix seconds, read as `format`.
fn unix_seconds(text: &str, format: TimestampFormat) -> Option<i64> {
    match format {
        TimestampFormat::Unix => text.parse().ok(),
        TimestampFormat::UnixMs => text.parse::<i64>().ok().map(|ms| ms.div_euclid(1000)),
        TimestampFormat::Rfc3339 => chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.timestamp()),
    }
}

/// The value `locator` points at: a non-empty header, or the JSON values at the pointers
/// (strings as they are, numbers as written) joined with `:`; `None` if one is missing.
fn locate(
    locator: &Locator,
    delivery: &Delivery<'_>,
    json: Option<&Value>,
) -> Result<Option<String>, Problem> {
    match locator {
        Locator::Header(name) => Ok(header_text(delivery.headers, name)?
            .filter(|v| !v.is_empty())
            .map(str::to_owned)),
        Locator::Pointer(pointers) => {
            let Some(json) = json else { return Ok(None) };
            let mut values = Vec::with_capacity(pointers.len());
            for pointer in pointers {
                match json.pointer(pointer) {
                    Some(Value::String(s)) if !s.is_empty() => values.push(s.clone()),
                    Some(Value::Number(n)) => values.push(n.to_string()),
                    _ => return Ok(None),
                }
            }
            Ok(Some(values.join(":")))
        }
    }
}

/// Where `locator` looks, for a `missing_id` problem.
fn describe(locator: &Locator) -> String {
    match locator {
        Locator::Header(name) => format!("{name} header"),
        Locator::Pointer(pointers) => format!("{} in its body", pointers.join(" and ")),
    }
}

#[cfg(test)]
#[path = "hmac_tests.rs"]
mod tests;
