//! Zoom: `x-zm-signature: v0=<hex>`, HMAC-SHA256 under the app's webhook secret token of
//! `v0:{x-zm-request-timestamp}:{raw body}` (Unix seconds); the timestamp must be within the
//! source's tolerance of now, either way (Zoom documents none and `@zoom/rivet` checks none; the
//! default is 300 s as Slack's, whose scheme this is).
//!
//! `endpoint.url_validation`, Zoom's handshake when the endpoint is saved and every 72 hours, is
//! answered `{"plainToken": p, "encryptedToken": hex(HMAC-SHA256(secret, p))}` under the secret
//! that signed it, nothing enqueued; Zoom signs it like any event, so it is verified first.
//!
//! Zoom documents no event id. The dedup id is built from the body: `{event}:{event_ts}` and,
//! when the payload names one, `:{payload.object.uuid}` (else its `id`): a retry resends the same
//! body, so the same id; two different events of one type on one object in the same millisecond
//! would be taken for one. The `x-zm-trackingid` header is not used: whether a retry keeps it is
//! not confirmed. The type is the body's `event`. Zoom's documentation:
//! developers.zoom.us/docs/api/webhooks/#verify-webhook-events.

use serde::Deserialize;
use serde_json::Value;

use super::{hmac_sha256_matches, malformed, mismatch, missing_id, required};
use super::{within_tolerance, Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::invalid_payload;

const SIGNATURE: &str = "x-zm-signature";
const TIMESTAMP: &str = "x-zm-request-timestamp";
const VALIDATION: &str = "endpoint.url_validation";

/// The Zoom scheme.
pub(super) struct Zoom;

/// What is read of a notification's body.
#[derive(Deserialize)]
struct Notification {
    event: Option<String>,
    event_ts: Option<Value>,
    #[serde(default)]
    payload: Payload,
}

#[derive(Deserialize, Default)]
struct Payload {
    #[serde(rename = "plainToken")]
    plain_token: Option<String>,
    object: Option<Value>,
}

/// The timestamp header as sent and the signature's bytes.
fn signature_of<'h>(delivery: &Delivery<'h>) -> Result<(&'h str, Vec<u8>), Problem> {
    let timestamp = required(delivery.headers, TIMESTAMP)?;
    let header = required(delivery.headers, SIGNATURE)?;
    let signature = header
        .strip_prefix("v0=")
        .and_then(|hex_digest| hex::decode(hex_digest).ok())
        .filter(|bytes| bytes.len() == 32)
        .ok_or_else(|| malformed("x-zm-signature", "v0=<64 hex digits>"))?;
    Ok((timestamp, signature))
}

/// Whether `secrets` signed the delivery at `timestamp` with `signature`.
fn signed(secrets: &[Vec<u8>], timestamp: &str, body: &[u8], signature: &[u8]) -> bool {
    let signed: [&[u8]; 4] = [b"v0:", timestamp.as_bytes(), b":", body];
    hmac_sha256_matches(secrets, &signed, signature)
}

/// A JSON scalar as text: a string as is, a number as written.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl Scheme for Zoom {
    /// The signed time, and Zoom's tracking id (not the dedup id: whether a retry keeps it
    /// is not confirmed; a handler may still log it for Zoom's support).
    fn kept_headers(&self) -> &'static [&'static str] {
        &["x-zm-request-timestamp", "x-zm-trackingid"]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let (timestamp, signature) = signature_of(delivery)?;
        let at: i64 = timestamp
            .parse()
            .map_err(|_| malformed("x-zm-request-timestamp", "<Unix seconds>"))?;
        within_tolerance(at, keys)?;
        // The timestamp as sent, not as parsed: Zoom signs the header's text.
        if signed(keys.secrets, timestamp, delivery.body, &signature) {
            Ok(())
        } else {
            Err(mismatch("x-zm-signature"))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        self.identify_keyed(
            delivery,
            &Keys {
                secrets: &[],
                tolerance_secs: 0,
                now: 0,
                public_url: None,
                webhook_id: None,
                certificate: None,
            },
        )
    }

    fn identify_keyed(
        &self,
        delivery: &Delivery<'_>,
        keys: &Keys<'_>,
    ) -> Result<Identified, Problem> {
        let notification: Notification = serde_json::from_slice(delivery.body).map_err(|e| {
            invalid_payload(
                format!("the body is not a Zoom event's JSON object: {e}"),
                "payload_json",
            )
        })?;
        let event = notification
            .event
            .filter(|e| !e.is_empty())
            .ok_or_else(|| missing_id("event in its body"))?;
        if event == VALIDATION {
            let plain = notification.payload.plain_token.ok_or_else(|| {
                invalid_payload(
                    "an endpoint.url_validation without a payload.plainToken",
                    "payload_challenge",
                )
            })?;
            // The secret that signed it (verified already, so one did).
            let (timestamp, signature) = signature_of(delivery)?;
            let secret = keys
                .secrets
                .iter()
                .find(|s| {
                    signed(
                        std::slice::from_ref(s),
                        timestamp,
                        delivery.body,
                        &signature,
                    )
                })
                .ok_or_else(|| mismatch("x-zm-signature"))?;
            use hmac::{Hmac, Mac};
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret)
                .map_err(|_| mismatch("x-zm-signature"))?;
            mac.update(plain.as_bytes());
            let encrypted = hex::encode(mac.finalize().into_bytes());
            return Ok(Identified::Challenge(
                serde_json::json!({ "plainToken": plain, "encryptedToken": encrypted }),
            ));
        }
        let at = notification
            .event_ts
            .as_ref()
            .and_then(text)
            .ok_or_else(|| missing_id("event_ts in its body"))?;
        let object = notification.payload.object.as_ref().and_then(|o| {
            o.get("uuid")
                .and_then(text)
                .or_else(|| o.get("id").and_then(text))
        });
        let id = match object {
            Some(object) => format!("{event}:{at}:{object}"),
            None => format!("{event}:{at}"),
        };
        Ok(Identified::Event {
            id,
            event_type: Some(event),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn sign(secret: &str, ts: &str, body: &str) -> String {
        use hmac::{Hmac, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("v0:{ts}:{body}").as_bytes());
        format!("v0={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn delivery_headers(secret: &str, ts: &str, body: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP, HeaderValue::from_str(ts).unwrap());
        headers.insert(
            SIGNATURE,
            HeaderValue::from_str(&sign(secret, ts, body)).unwrap(),
        );
        headers
    }

    #[test]
    fn the_id_is_the_event_its_time_and_its_object() {
        let headers = HeaderMap::new();
        let identify = |body: &str| {
            Zoom.identify(&Delivery {
                query: None,
                headers: &headers,
                body: body.as_bytes(),
            })
        };
        assert_eq!(
            identify(r#"{"event":"meeting.started","event_ts":1626230691572,"payload":{"account_id":"a","object":{"id":"1234567890","uuid":"4444AAAiAAAAAiAiAiiAii=="}}}"#).unwrap(),
            Identified::Event {
                id: "meeting.started:1626230691572:4444AAAiAAAAAiAiAiiAii==".into(),
                event_type: Some("meeting.started".into())
            }
        );
        assert_eq!(
            identify(r#"{"event":"user.created","event_ts":1626230691572,"payload":{"object":{"id":"KDcuGIm1QgePTO8WbOqwIQ"}}}"#).unwrap(),
            Identified::Event {
                id: "user.created:1626230691572:KDcuGIm1QgePTO8WbOqwIQ".into(),
                event_type: Some("user.created".into())
            }
        );
        assert_eq!(
            identify(r#"{"event":"app.deauthorized","event_ts":5,"payload":{}}"#).unwrap(),
            Identified::Event {
                id: "app.deauthorized:5".into(),
                event_type: Some("app.deauthorized".into())
            }
        );
        for (body, check) in [
            (r#"{"event":"meeting.started","payload":{}}"#, "missing_id"),
            (r#"{"event_ts":5}"#, "missing_id"),
            ("event=x", "payload_json"),
        ] {
            assert_eq!(identify(body).unwrap_err().check, Some(check), "{body}");
        }
    }

    /// The url_validation answer is keyed by the secret that signed it (the second of two here,
    /// a rotation); Zoom's documented form: hex HMAC-SHA256 of the plainToken.
    #[test]
    fn url_validation_is_answered_under_the_secret_that_signed_it() {
        let body = r#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
        let headers = delivery_headers("new-secret", "1654503849", body);
        let secrets = [b"old-secret".to_vec(), b"new-secret".to_vec()];
        let keys = Keys {
            secrets: &secrets,
            tolerance_secs: 300,
            now: 1_654_503_849,
            public_url: None,
            webhook_id: None,
            certificate: None,
        };
        let delivery = Delivery {
            query: None,
            headers: &headers,
            body: body.as_bytes(),
        };
        Zoom.verify(&delivery, &keys).expect("verifies");
        let expected = {
            use hmac::{Hmac, Mac};
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"new-secret").unwrap();
            mac.update(b"qgg8vlvZRS6UYooatFL8Aw");
            hex::encode(mac.finalize().into_bytes())
        };
        assert_eq!(
            Zoom.identify_keyed(&delivery, &keys).unwrap(),
            Identified::Challenge(serde_json::json!({
                "plainToken": "qgg8vlvZRS6UYooatFL8Aw",
                "encryptedToken": expected
            }))
        );
        for now in [1_654_503_849 + 301, 1_654_503_849 - 301] {
            let late = Keys { now, ..keys };
            assert_eq!(
                Zoom.verify(&delivery, &late).unwrap_err().check,
                Some("timestamp_tolerance")
            );
        }
    }
}
