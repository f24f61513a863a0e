//! Slack (Events API): `X-Slack-Signature: v0=<hex>`, HMAC-SHA256 under the app's signing
//! secret of `v0:{X-Slack-Request-Timestamp}:{raw body}`; the timestamp must be within the
//! source's tolerance of now, either way (Slack's SDKs: five minutes, the past only; a future
//! one is refused too, as Stripe's and Standard Webhooks' are here). The dedup id is the body's
//! `event_id` (a retry, with `X-Slack-Retry-Num`, carries the same), the type the body's
//! `event.type`, else its `type`.
//!
//! `url_verification`, Slack's handshake when the request URL is set, is answered with its
//! `challenge` and nothing enqueued; Slack signs it like any delivery, so it is verified first
//! (an unsigned one is a forgery like any other). Slack's documentation:
//! docs.slack.dev/authentication/verifying-requests-from-slack and
//! api.slack.com/events/url_verification.

use std::borrow::Cow;

use serde::Deserialize;

use super::{hmac_sha256_matches, malformed, mismatch, missing_id, required, within_tolerance};
use super::{Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::invalid_payload;

const SIGNATURE: &str = "x-slack-signature";
const TIMESTAMP: &str = "x-slack-request-timestamp";

/// The Slack scheme.
pub(super) struct Slack;

/// What is read of an Events API body: its envelope's `type`, `event_id`, `challenge`, and the
/// inner event's `type`. Borrowed where the JSON has no escapes.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    challenge: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event: Option<Inner<'a>>,
}

#[derive(Deserialize)]
struct Inner<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

impl Scheme for Slack {
    /// Which retry this is and why Slack retried (`http_timeout`, …), and the signed time.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[
            "x-slack-retry-num",
            "x-slack-retry-reason",
            "x-slack-request-timestamp",
        ]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let timestamp = required(delivery.headers, TIMESTAMP)?;
        let at: i64 = timestamp
            .parse()
            .map_err(|_| malformed("X-Slack-Request-Timestamp", "<Unix seconds>"))?;
        within_tolerance(at, keys)?;
        let header = required(delivery.headers, SIGNATURE)?;
        let signature = header
            .strip_prefix("v0=")
            .and_then(|hex_digest| hex::decode(hex_digest).ok())
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| malformed("X-Slack-Signature", "v0=<64 hex digits>"))?;
        // The timestamp as sent, not as parsed: Slack signs the header's text.
        let signed: [&[u8]; 4] = [b"v0:", timestamp.as_bytes(), b":", delivery.body];
        if hmac_sha256_matches(keys.secrets, &signed, &signature) {
            Ok(())
        } else {
            Err(mismatch("X-Slack-Signature"))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        // Interactivity and slash commands post forms, which carry no event id: not served yet.
        let envelope: Envelope = serde_json::from_slice(delivery.body).map_err(|e| {
            invalid_payload(
                format!("the body is not an Events API JSON object: {e}"),
                "payload_json",
            )
        })?;
        if envelope.kind.as_deref() == Some("url_verification") {
            let challenge = envelope.challenge.ok_or_else(|| {
                invalid_payload(
                    "a url_verification without a challenge",
                    "payload_challenge",
                )
            })?;
            return Ok(Identified::Challenge(
                serde_json::json!({ "challenge": challenge }),
            ));
        }
        let id = envelope
            .event_id
            .ok_or_else(|| missing_id("event_id in its body"))?;
        let event_type = envelope.event.and_then(|e| e.kind).or(envelope.kind);
        Ok(Identified::Event {
            id: id.into_owned(),
            event_type: event_type.map(Cow::into_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn identify(body: &str) -> Result<Identified, Problem> {
        Slack.identify(&Delivery {
            query: None,
            headers: &HeaderMap::new(),
            body: body.as_bytes(),
        })
    }

    #[test]
    fn event_id_and_type_from_the_envelope() {
        assert_eq!(
            identify(
                r#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}"#
            )
            .unwrap(),
            Identified::Event {
                id: "Ev1".into(),
                event_type: Some("app_mention".into())
            }
        );
        assert_eq!(
            identify(r#"{"type":"event_callback","event_id":"Ev\u0032"}"#).unwrap(),
            Identified::Event {
                id: "Ev2".into(),
                event_type: Some("event_callback".into())
            }
        );
        assert_eq!(
            identify(r#"{"token":"t","challenge":"3eZbrw1aB","type":"url_verification"}"#).unwrap(),
            Identified::Challenge(serde_json::json!({"challenge": "3eZbrw1aB"}))
        );
        for (body, check) in [
            (r#"{"type":"app_rate_limited"}"#, "missing_id"),
            (r#"{"type":"url_verification"}"#, "payload_challenge"),
            ("payload=%7B%7D", "payload_json"),
        ] {
            assert_eq!(identify(body).unwrap_err().check, Some(check), "{body}");
        }
    }

    /// Slack's documented example (verifying-requests-from-slack): signing secret
    /// `8f742231b10e8888abcd99yyyzzz85a5`, timestamp 1531420618, a slash command's form body.
    #[test]
    fn slacks_published_example_verifies_within_the_tolerance_only() {
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP, HeaderValue::from_static("1531420618"));
        headers.insert(
            SIGNATURE,
            HeaderValue::from_static(
                "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
            ),
        );
        let secrets = [b"8f742231b10e8888abcd99yyyzzz85a5".to_vec()];
        let at = |now: i64| {
            Slack.verify(
                &Delivery {
                    query: None,
                    headers: &headers,
                    body: body.as_bytes(),
                },
                &Keys {
                    secrets: &secrets,
                    tolerance_secs: 300,
                    now,
                    public_url: None,
                    webhook_id: None,
                    certificate: None,
                },
            )
        };
        at(1_531_420_618 + 300).expect("verifies");
        at(1_531_420_618 - 300).expect("verifies");
        for now in [1_531_420_618 + 301, 1_531_420_618 - 301] {
            assert_eq!(at(now).unwrap_err().check, Some("timestamp_tolerance"));
        }
    }
}
