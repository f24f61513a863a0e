//! Twilio: `X-Twilio-Signature: <base64>`, HMAC-SHA1 under the account's auth token of the URL
//! Twilio requested followed by every POST form parameter, sorted by name (byte order), each as
//! `name` + `value` (a name's several values sorted, duplicates once), with no separators and no
//! timestamp. The URL is the source's `public_url` (what Twilio was given, not what this
//! process sees behind a proxy) with the request's own query string. Twilio's validators try
//! that URL with and without the scheme's default port (`:443`, `:80`), because Twilio's back
//! end signs either spelling ("sig generation on back end is inconsistent",
//! `twilio/request_validator.py`): so does this one.
//!
//! A JSON body (Event Streams and other products) is signed otherwise: the URL carries
//! `bodySHA256=<hex SHA-256 of the body>` in its query, the signature is over the URL alone, and
//! the body must hash to that parameter (compared in constant time). A request carrying
//! `X-Twilio-Webhooks-Signature-Settings: key=…,algorithm=HMAC_SHA256` is signed with
//! HMAC-SHA256 under a SharedKey secret (configured among the secrets) instead.
//!
//! The dedup id is `I-Twilio-Idempotency-Token`, which Twilio sends on its webhook requests and
//! repeats on its retries; without it, the resource's sid and status (`MessageSid:MessageStatus`,
//! `CallSid:CallStatus`, …), or a JSON body's `id`. The type is the status (`delivered`,
//! `completed`), or a JSON body's `type`. Twilio's rules: twilio.com/docs/usage/security
//! (validating requests), twilio.com/docs/usage/webhooks/webhooks-connection-overrides.

use std::collections::{BTreeMap, BTreeSet};

use base64::prelude::{Engine as _, BASE64_STANDARD};
use bytes::Bytes;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{malformed, mismatch, missing_id, required};
use super::{BatchEvent, Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::{header_text, invalid_payload, invalid_signature};

const SIGNATURE: &str = "x-twilio-signature";
const SIGNATURE_SETTINGS: &str = "x-twilio-webhooks-signature-settings";
const IDEMPOTENCY_TOKEN: &str = "i-twilio-idempotency-token";
/// The query parameter of the JSON variant: the hex SHA-256 of the body.
const BODY_HASH: &str = "bodySHA256";

/// The resource ids a form webhook names its subject by, in the order they are looked for.
const SIDS: &[&str] = &[
    "MessageSid",
    "SmsSid",
    "CallSid",
    "RecordingSid",
    "TranscriptionSid",
    "ConferenceSid",
];
/// The status parameters that say what happened to it, in the order they are looked for.
const STATUSES: &[&str] = &[
    "MessageStatus",
    "SmsStatus",
    "CallStatus",
    "RecordingStatus",
    "TranscriptionStatus",
    "StatusCallbackEvent",
];

/// The Twilio scheme.
pub(super) struct Twilio;

/// The HMAC a delivery is signed with.
#[derive(Clone, Copy)]
enum Algorithm {
    /// The legacy default, under the auth token.
    Sha1,
    /// Under a SharedKey secret, when the signature settings header says so.
    Sha256,
}

/// The form parameters, by name, each name's values sorted and once: the order Twilio signs.
type Params = BTreeMap<String, BTreeSet<String>>;

impl Scheme for Twilio {
    /// The delivery's token (the dedup id when present) and the region that sent it.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[IDEMPOTENCY_TOKEN, "x-home-region"]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = required(delivery.headers, SIGNATURE)?;
        let algorithm = algorithm(delivery)?;
        let signature = BASE64_STANDARD
            .decode(header)
            .ok()
            .filter(|bytes| bytes.len() == algorithm.len())
            .ok_or_else(|| malformed("x-twilio-signature", "<base64 of the HMAC>"))?;
        // The configuration requires it for this scheme; without it nothing can verify.
        let Some(public_url) = keys.public_url.filter(|url| !url.is_empty()) else {
            return Err(mismatch("x-twilio-signature"));
        };
        let url = requested_url(public_url, delivery.query);
        let body_hash = body_hash(delivery.query);
        // The JSON variant signs the URL alone; the form variant the URL and the parameters.
        let params = match body_hash {
            Some(_) => Params::new(),
            None => form_params(delivery.body),
        };
        let signed = spellings(&url)
            .iter()
            .any(|url| algorithm.matches(keys.secrets, url, &params, &signature));
        if !signed {
            return Err(mismatch("x-twilio-signature"));
        }
        if let Some(expected) = body_hash {
            let expected = hex::decode(expected)
                .ok()
                .filter(|bytes| bytes.len() == 32)
                .ok_or_else(|| {
                    invalid_signature(
                        "the bodySHA256 query parameter is not a hex SHA-256",
                        "malformed_body_hash",
                    )
                })?;
            let actual = Sha256::digest(delivery.body);
            if !bool::from(actual.as_slice().ct_eq(&expected)) {
                return Err(invalid_signature(
                    "the body's SHA-256 is not the signed URL's bodySHA256",
                    "body_hash_mismatch",
                ));
            }
        }
        Ok(())
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let token = header_text(delivery.headers, IDEMPOTENCY_TOKEN)?
            .filter(|token| !token.is_empty())
            .map(str::to_owned);
        if body_hash(delivery.query).is_some() {
            return identify_json(delivery.body, token);
        }
        let params = form_params(delivery.body);
        let first = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| params.get(*name).and_then(|values| values.first()))
                .filter(|value| !value.is_empty())
                .cloned()
        };
        let status = first(STATUSES);
        let id = match (token, first(SIDS)) {
            (Some(token), _) => token,
            (None, Some(sid)) => match &status {
                Some(status) => format!("{sid}:{status}"),
                None => sid,
            },
            (None, None) => {
                return Err(missing_id(
                    "I-Twilio-Idempotency-Token header, nor a MessageSid or CallSid parameter",
                ))
            }
        };
        Ok(Identified::Event {
            id,
            event_type: status,
        })
    }
}

/// A JSON delivery's events: an Event Streams array is one event per CloudEvent, each keyed on
/// its own `id` (unique per event, whatever delivery carries it: a regrouped redelivery is still
/// handled once per event), its type its `type`, its payload its bytes as sent; any other JSON
/// body is one event, keyed on the token, else its `id`.
fn identify_json(body: &[u8], token: Option<String>) -> Result<Identified, Problem> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return identify_event_stream(body);
    }
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        invalid_payload(
            format!("the body is signed as JSON (bodySHA256) but is not JSON: {e}"),
            "payload_json",
        )
    })?;
    let text = |field: &str| {
        json.get(field)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let own_id = text("id");
    let id = token
        .or(own_id)
        .ok_or_else(|| missing_id("I-Twilio-Idempotency-Token header, nor an id in its body"))?;
    Ok(Identified::Event {
        id,
        event_type: text("type"),
    })
}

/// An Event Streams delivery (a JSON array of CloudEvents): one event per element.
fn identify_event_stream(body: &[u8]) -> Result<Identified, Problem> {
    let events = super::json_items::items(body, "")?
        .into_iter()
        .enumerate()
        .map(|(n, raw)| {
            let event: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
            let text = |field: &str| {
                event
                    .get(field)
                    .and_then(serde_json::Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            };
            Ok(BatchEvent {
                id: text("id").ok_or_else(|| missing_id(&format!("`id` in event {n}")))?,
                event_type: text("type"),
                payload: Bytes::copy_from_slice(raw.get().as_bytes()),
            })
        })
        .collect::<Result<Vec<_>, Problem>>()?;
    Ok(Identified::Batch {
        events,
        answer: None,
    })
}

/// The algorithm the signature settings header names, HMAC-SHA1 without one.
fn algorithm(delivery: &Delivery<'_>) -> Result<Algorithm, Problem> {
    let Some(settings) = header_text(delivery.headers, SIGNATURE_SETTINGS)? else {
        return Ok(Algorithm::Sha1);
    };
    let named = settings.split(',').find_map(|part| {
        let (name, value) = part.split_once('=')?;
        (name.trim() == "algorithm" && !value.trim().is_empty()).then(|| value.trim())
    });
    match named.map(str::to_ascii_uppercase).as_deref() {
        None | Some("HMAC_SHA1") => Ok(Algorithm::Sha1),
        Some("HMAC_SHA256") => Ok(Algorithm::Sha256),
        Some(_) => Err(malformed(
            SIGNATURE_SETTINGS,
            "key=<id>,algorithm=HMAC_SHA1|HMAC_SHA256",
        )),
    }
}

impl Algorithm {
    /// The length of its MAC.
    fn len(self) -> usize {
        match self {
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    /// Whether one of `secrets` signed `url` and `params` as Twilio does (constant time).
    fn matches(self, secrets: &[Vec<u8>], url: &str, params: &Params, signature: &[u8]) -> bool {
        match self {
            Algorithm::Sha1 => signed_by::<Hmac<Sha1>>(secrets, url, params, signature),
            Algorithm::Sha256 => signed_by::<Hmac<Sha256>>(secrets, url, params, signature),
        }
    }
}

fn signed_by<M: Mac + KeyInit>(
    secrets: &[Vec<u8>],
    url: &str,
    params: &Params,
    signature: &[u8],
) -> bool {
    secrets.iter().any(|secret| {
        // HMAC takes keys of any length; this cannot fail for it.
        let Ok(mut mac) = <M as KeyInit>::new_from_slice(secret) else {
            return false;
        };
        mac.update(url.as_bytes());
        for (name, values) in params {
            for value in values {
                mac.update(name.as_bytes());
                mac.update(value.as_bytes());
            }
        }
        mac.verify_slice(signature).is_ok()
    })
}

/// The URL Twilio requested: `public_url` (its own query and fragment dropped: the request's
/// query is what was sent, and a fragment, such as Twilio's connection overrides, never is)
/// followed by the request's query string, as sent.
fn requested_url(public_url: &str, query: Option<&str>) -> String {
    let base = public_url.split(['?', '#']).next().unwrap_or(public_url);
    match query {
        Some(query) if !query.is_empty() => format!("{base}?{query}"),
        _ => base.to_owned(),
    }
}

/// `url` as given, and with its scheme's default port spelled out or left out, whichever it is
/// not: the two spellings Twilio's back end signs.
fn spellings(url: &str) -> Vec<String> {
    let mut out = vec![url.to_owned()];
    let Some((scheme, rest)) = url.split_once("://") else {
        return out;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => return out,
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // The port follows the host, after any user info; an IPv6 host keeps its colons in brackets.
    let host_start = authority.rfind('@').map_or(0, |at| at + 1);
    let host = &authority[host_start..];
    let has_port = match host.rfind(']') {
        Some(close) => host[close..].contains(':'),
        None => host.contains(':'),
    };
    if let Some(bare) = authority.strip_suffix(default_port) {
        out.push(format!("{scheme}://{bare}{tail}"));
    } else if !has_port {
        out.push(format!("{scheme}://{authority}{default_port}{tail}"));
    }
    out
}

/// The `bodySHA256` query parameter, if the request has one: the JSON variant.
fn body_hash(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(name, _)| name == BODY_HASH)
        .map(|(_, value)| value.into_owned())
}

/// The body as `application/x-www-form-urlencoded` parameters (decoded, as Twilio signs them);
/// a body that is not one gives parameters that match no signature, never an error.
fn form_params(body: &[u8]) -> Params {
    let mut params = Params::new();
    for (name, value) in form_urlencoded::parse(body) {
        params
            .entry(name.into_owned())
            .or_default()
            .insert(value.into_owned());
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stream_is_one_event_per_cloud_event() {
        let body = br#" [{"id":"EZ1","type":"a.b", "data":{}}, {"id":"EZ2","type":"c.d"}]"#;
        let Ok(Identified::Batch { events, answer }) = identify_json(body, Some("tok".into()))
        else {
            panic!("a batch");
        };
        assert_eq!(answer, None);
        let seen: Vec<_> = events
            .iter()
            .map(|e| (e.id.as_str(), e.event_type.as_deref(), &e.payload[..]))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "EZ1",
                    Some("a.b"),
                    &br#"{"id":"EZ1","type":"a.b", "data":{}}"#[..]
                ),
                ("EZ2", Some("c.d"), &br#"{"id":"EZ2","type":"c.d"}"#[..]),
            ]
        );
        let without = identify_json(br#"[{"id":"EZ1"},{"type":"x"}]"#, None).unwrap_err();
        assert_eq!(without.check, Some("missing_id"));
    }

    #[test]
    fn the_default_port_is_tried_both_ways() {
        assert_eq!(
            spellings("https://h.example/x?a=1"),
            ["https://h.example/x?a=1", "https://h.example:443/x?a=1"]
        );
        assert_eq!(
            spellings("https://h.example:443/x"),
            ["https://h.example:443/x", "https://h.example/x"]
        );
        assert_eq!(
            spellings("http://u:p@h.example"),
            ["http://u:p@h.example", "http://u:p@h.example:80"]
        );
        assert_eq!(
            spellings("https://h.example:8443/x"),
            ["https://h.example:8443/x"]
        );
        assert_eq!(
            spellings("https://[::1]/x"),
            ["https://[::1]/x", "https://[::1]:443/x"]
        );
        assert_eq!(spellings("not a url"), ["not a url"]);
    }

    /// Odd URLs, queries, bodies and headers are refused as forgeries, never a panic.
    #[test]
    fn odd_inputs_are_refused_not_a_panic() {
        use axum::http::{HeaderMap, HeaderValue};
        let mut headers = HeaderMap::new();
        headers.insert(
            SIGNATURE,
            HeaderValue::from_static("AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        );
        headers.insert(
            SIGNATURE_SETTINGS,
            HeaderValue::from_static("algorithm=,key"),
        );
        let secrets = [b"token".to_vec()];
        for (url, query, body) in [
            ("https://[", Some("%zz&&=&bodySHA256"), &b"\xff\xfe=%"[..]),
            ("https://h:443", Some("bodySHA256=zz"), b"{"),
            ("http://@:80/", None, b"a=1&a=1&=&%"),
            ("", Some(""), b""),
        ] {
            let delivery = Delivery {
                headers: &headers,
                body,
                query,
            };
            let keys = Keys {
                secrets: &secrets,
                tolerance_secs: 0,
                now: 0,
                public_url: Some(url),
                webhook_id: None,
                certificate: None,
            };
            assert!(Twilio.verify(&delivery, &keys).is_err(), "{url}");
            let _ = Twilio.identify(&delivery);
        }
    }

    #[test]
    fn the_request_query_replaces_the_configured_one() {
        assert_eq!(
            requested_url("https://h/x?old=1#rc=2", Some("a=1&b=2")),
            "https://h/x?a=1&b=2"
        );
        assert_eq!(requested_url("https://h/x", Some("")), "https://h/x");
        assert_eq!(requested_url("https://h/x", None), "https://h/x");
    }
}
