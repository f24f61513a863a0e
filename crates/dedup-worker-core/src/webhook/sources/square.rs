//! Square: `x-square-hmacsha256-signature: <base64>`, HMAC-SHA256 under the subscription's
//! signature key of the notification URL, exactly as configured in the subscription, followed by
//! the raw body (no separator, no timestamp). The URL is the source's `public_url`: what Square
//! was given, not what this process sees behind a proxy. The dedup id is the body's `event_id`
//! (a retry resends the same bytes), the type its `type` (`payment.updated`). No handshake.
//! Square's documentation: developer.squareup.com/docs/webhooks/step3validate.

use std::borrow::Cow;

use base64::prelude::{Engine as _, BASE64_STANDARD};
use serde::Deserialize;

use super::{hmac_sha256_matches, malformed, mismatch, missing_id, required};
use super::{Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::invalid_payload;

const SIGNATURE: &str = "x-square-hmacsha256-signature";

/// The Square scheme.
pub(super) struct Square;

/// What is read of a notification's body. Borrowed where the JSON has no escapes.
#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(borrow)]
    event_id: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

impl Scheme for Square {
    /// Which retry this is and why, when the first attempt was, and the environment
    /// (`Production`, `Sandbox`) the event is from.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[
            "square-retry-number",
            "square-retry-reason",
            "square-initial-delivery-timestamp",
            "square-environment",
        ]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = required(delivery.headers, SIGNATURE)?;
        let signature = BASE64_STANDARD
            .decode(header)
            .ok()
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| malformed("x-square-hmacsha256-signature", "<base64 of 32 bytes>"))?;
        // The configuration requires it for this scheme; without it nothing can verify.
        let url = keys.public_url.unwrap_or_default();
        if !url.is_empty()
            && hmac_sha256_matches(keys.secrets, &[url.as_bytes(), delivery.body], &signature)
        {
            Ok(())
        } else {
            Err(mismatch("x-square-hmacsha256-signature"))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let notification: Notification = serde_json::from_slice(delivery.body).map_err(|e| {
            invalid_payload(
                format!("the body is not a Square event's JSON object: {e}"),
                "payload_json",
            )
        })?;
        let id = notification
            .event_id
            .ok_or_else(|| missing_id("event_id in its body"))?;
        Ok(Identified::Event {
            id: id.into_owned(),
            event_type: notification.kind.map(Cow::into_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    /// The vector of every Square SDK's webhook tests (Python, Node, Java, Go, PHP, Ruby): key
    /// `Ibxx_5AKakO-3qeNVR61Dw`, the URL below, the signature
    /// `GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=`; another URL does not verify.
    #[test]
    fn square_sdk_example_verifies_for_its_url_only() {
        let body = r#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#;
        let mut headers = HeaderMap::new();
        headers.insert(
            SIGNATURE,
            HeaderValue::from_static("GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4="),
        );
        let secrets = [b"Ibxx_5AKakO-3qeNVR61Dw".to_vec()];
        let with = |url: &'static str| {
            Square.verify(
                &Delivery {
                    query: None,
                    headers: &headers,
                    body: body.as_bytes(),
                },
                &Keys {
                    secrets: &secrets,
                    tolerance_secs: 0,
                    now: 0,
                    public_url: Some(url),
                    webhook_id: None,
                    certificate: None,
                },
            )
        };
        with("https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9").expect("verifies");
        assert_eq!(
            with("https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9")
                .unwrap_err()
                .check,
            Some("signature_mismatch")
        );
        assert_eq!(
            Square
                .identify(&Delivery {
                    query: None,
                    headers: &headers,
                    body: body.as_bytes()
                })
                .unwrap(),
            Identified::Event {
                id: "ac3ac95b-f97d-458c-a6e6-18981597e05f".into(),
                event_type: Some("webhooks.test_notification".into())
            }
        );
    }
}
