//! Linear: `Linear-Signature: <hex>`, HMAC-SHA256 of the raw body under the webhook's signing
//! secret, no prefix. The replay protection is inside the signed body: its `webhookTimestamp`
//! (Unix milliseconds) must be within the source's tolerance of now, either way (`@linear/sdk`'s
//! `LinearWebhookClient.verify`: 60 s either way, the default here; the legacy `Linear-Timestamp`
//! header is unsigned and ignored, as the SDK does). The timestamp is read only once the
//! signature verified, and compared to the second.
//!
//! The dedup id is the `Linear-Delivery` header (a UUID per delivery); that Linear keeps it on a
//! retry is not confirmed from Linear's pages. The body has no better one: `webhookId` names the
//! webhook, `data.id` the entity, which many events share. The type is the `Linear-Event` header
//! (the entity: `Issue`, `Comment`, …), else the body's `type`. No handshake. Linear's
//! documentation: linear.app/developers/webhooks.

use serde::Deserialize;

use super::{hmac_sha256_matches, malformed, mismatch, missing_id, required};
use super::{within_tolerance, Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::{header_text, invalid_signature};

const SIGNATURE: &str = "linear-signature";
const DELIVERY: &str = "linear-delivery";
const EVENT: &str = "linear-event";

/// The Linear scheme.
pub(super) struct Linear;

/// What is read of a body for the timestamp check.
#[derive(Deserialize)]
struct Stamped {
    #[serde(rename = "webhookTimestamp")]
    webhook_timestamp: Option<f64>,
}

/// What is read of a body for its type.
#[derive(Deserialize)]
struct Typed {
    #[serde(rename = "type")]
    kind: Option<String>,
}

impl Scheme for Linear {
    /// The delivery's id (the dedup id) and its event (`Issue`, `Comment`, …).
    fn kept_headers(&self) -> &'static [&'static str] {
        &["linear-delivery", "linear-event"]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = required(delivery.headers, SIGNATURE)?;
        let signature = hex::decode(header)
            .ok()
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| malformed("Linear-Signature", "<64 hex digits>"))?;
        if !hmac_sha256_matches(keys.secrets, &[delivery.body], &signature) {
            return Err(mismatch("Linear-Signature"));
        }
        // Signed by a secret, so the body is Linear's: its timestamp can be trusted, and read.
        let ms = serde_json::from_slice::<Stamped>(delivery.body)
            .ok()
            .and_then(|s| s.webhook_timestamp)
            .filter(|ms| ms.is_finite())
            .ok_or_else(|| {
                invalid_signature(
                    "the signed body has no webhookTimestamp (Unix milliseconds) to hold to the \
                     tolerance",
                    "timestamp_tolerance",
                )
            })?;
        // Whole seconds, as the ingress's clock is; saturating for absurd values.
        within_tolerance((ms / 1000.0).floor() as i64, keys)
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let id = header_text(delivery.headers, DELIVERY)?
            .ok_or_else(|| missing_id("Linear-Delivery header"))?;
        let event_type = match header_text(delivery.headers, EVENT)? {
            Some(event) => Some(event.to_owned()),
            None => serde_json::from_slice::<Typed>(delivery.body)
                .ok()
                .and_then(|t| t.kind),
        };
        Ok(Identified::Event {
            id: id.to_owned(),
            event_type,
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    /// A body signed by a plain HMAC-SHA256 (as Linear signs; `@linear/sdk` only verifies), at
    /// `webhookTimestamp` 1700000000123: within 60 s of it only, either way.
    #[test]
    fn the_signed_body_timestamp_is_held_to_the_tolerance() {
        let body = r#"{"action":"create","type":"Issue","data":{"id":"i1"},"webhookTimestamp":1700000000123}"#;
        let signature = {
            use hmac::{Hmac, Mac};
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"lin_wh_secret").unwrap();
            mac.update(body.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        };
        let mut headers = HeaderMap::new();
        headers.insert(SIGNATURE, HeaderValue::from_str(&signature).unwrap());
        let secrets = [b"lin_wh_secret".to_vec()];
        let at = |now: i64, body: &str| {
            Linear.verify(
                &Delivery {
                    query: None,
                    headers: &headers,
                    body: body.as_bytes(),
                },
                &Keys {
                    secrets: &secrets,
                    tolerance_secs: 60,
                    now,
                    public_url: None,
                    webhook_id: None,
                    certificate: None,
                },
            )
        };
        at(1_700_000_060, body).expect("verifies");
        at(1_699_999_940, body).expect("verifies");
        for now in [1_700_000_061, 1_699_999_939] {
            assert_eq!(
                at(now, body).unwrap_err().check,
                Some("timestamp_tolerance")
            );
        }
        assert_eq!(
            at(1_700_000_000, &body.replace("i1", "i2"))
                .unwrap_err()
                .check,
            Some("signature_mismatch")
        );
    }

    #[test]
    fn id_from_linear_delivery_type_from_linear_event_else_the_body() {
        let mut headers = HeaderMap::new();
        headers.insert(
            DELIVERY,
            HeaderValue::from_static("5b8a1c6e-0000-4000-8000-000000000001"),
        );
        let body = br#"{"type":"Comment","action":"create"}"#;
        let identify = |headers: &HeaderMap| {
            Linear.identify(&Delivery {
                headers,
                body,
                query: None,
            })
        };
        assert_eq!(
            identify(&headers).unwrap(),
            Identified::Event {
                id: "5b8a1c6e-0000-4000-8000-000000000001".into(),
                event_type: Some("Comment".into())
            }
        );
        headers.insert(EVENT, HeaderValue::from_static("Issue"));
        assert_eq!(
            identify(&headers).unwrap(),
            Identified::Event {
                id: "5b8a1c6e-0000-4000-8000-000000000001".into(),
                event_type: Some("Issue".into())
            }
        );
        assert_eq!(
            identify(&HeaderMap::new()).unwrap_err().check,
            Some("missing_id")
        );
    }
}
