//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the raw body under the app's
//! client secret; no prefix, no timestamp signed. The dedup id is `X-Shopify-Event-Id`, which
//! Shopify documents as the duplicate detector ("the same value across more than one webhook
//! indicates a duplicate": a retry, or a second subscription to the same topic); a delivery
//! without it (API versions before the header existed) falls back to `X-Shopify-Webhook-Id`,
//! the delivery's id, which a retry keeps but a second subscription does not. The type is
//! `X-Shopify-Topic` (`orders/create`).
//!
//! Shopify's newer "Events" webhooks send the same headers without the `X-` (`shopify-hmac-sha256`,
//! `shopify-event-id`, …); each header is read under either name, the `X-` one first.

use base64::prelude::{Engine as _, BASE64_STANDARD};

use super::{hmac_sha256_matches, malformed, mismatch, missing_id, Delivery, Identified, Keys};
use super::{required, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::header_text;

/// Each header's two names: the `X-Shopify-` one and the Events webhooks' `shopify-` one.
const SIGNATURE: [&str; 2] = ["x-shopify-hmac-sha256", "shopify-hmac-sha256"];
const EVENT_ID: [&str; 2] = ["x-shopify-event-id", "shopify-event-id"];
const WEBHOOK_ID: [&str; 2] = ["x-shopify-webhook-id", "shopify-webhook-id"];
const TOPIC: [&str; 2] = ["x-shopify-topic", "shopify-topic"];

/// The Shopify scheme.
pub(super) struct Shopify;

/// The first of `names` the request carries.
fn either<'h>(delivery: &Delivery<'h>, names: [&str; 2]) -> Result<Option<&'h str>, Problem> {
    match header_text(delivery.headers, names[0])? {
        Some(value) => Ok(Some(value)),
        None => header_text(delivery.headers, names[1]),
    }
}

impl Scheme for Shopify {
    /// Shopify's delivery headers (the research notes' list, from `@shopify/shopify-api`):
    /// the topic, which shop, the API version the payload is in, the ids, when it fired; and
    /// the Events webhooks' names of the same, without `X-`.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[
            "x-shopify-topic",
            "x-shopify-sub-topic",
            "x-shopify-webhook-id",
            "x-shopify-event-id",
            "x-shopify-shop-domain",
            "x-shopify-api-version",
            "x-shopify-triggered-at",
            "shopify-topic",
            "shopify-webhook-id",
            "shopify-event-id",
            "shopify-shop-domain",
            "shopify-api-version",
            "shopify-triggered-at",
        ]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = match either(delivery, SIGNATURE)? {
            Some(header) => header,
            // Named as Shopify documents it.
            None => required(delivery.headers, "X-Shopify-Hmac-Sha256")?,
        };
        let signature = BASE64_STANDARD
            .decode(header.trim())
            .ok()
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| malformed("X-Shopify-Hmac-Sha256", "<base64 of 32 bytes>"))?;
        if hmac_sha256_matches(keys.secrets, &[delivery.body], &signature) {
            Ok(())
        } else {
            Err(mismatch("X-Shopify-Hmac-Sha256"))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let id = match either(delivery, EVENT_ID)? {
            Some(id) => id,
            None => either(delivery, WEBHOOK_ID)?.ok_or_else(|| {
                missing_id("X-Shopify-Event-Id header (nor X-Shopify-Webhook-Id)")
            })?,
        };
        Ok(Identified::Event {
            id: id.to_owned(),
            event_type: either(delivery, TOPIC)?.map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn delivery_of(headers: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn identify(headers: &[(&'static str, &str)]) -> Result<Identified, Problem> {
        let map = delivery_of(headers);
        Shopify.identify(&Delivery {
            query: None,
            headers: &map,
            body: b"{}",
        })
    }

    #[test]
    fn the_event_id_is_the_key_and_the_webhook_id_its_fallback() {
        let event = |id: &str| Identified::Event {
            id: id.to_owned(),
            event_type: Some("orders/create".to_owned()),
        };
        assert_eq!(
            identify(&[
                ("x-shopify-event-id", "e1"),
                ("x-shopify-webhook-id", "w1"),
                ("x-shopify-topic", "orders/create"),
            ])
            .unwrap(),
            event("e1")
        );
        assert_eq!(
            identify(&[
                ("x-shopify-webhook-id", "w1"),
                ("x-shopify-topic", "orders/create")
            ])
            .unwrap(),
            event("w1")
        );
        assert_eq!(
            identify(&[
                ("shopify-event-id", "e2"),
                ("shopify-topic", "orders/create")
            ])
            .unwrap(),
            event("e2")
        );
        let none = identify(&[("x-shopify-topic", "orders/create")]).unwrap_err();
        assert_eq!(none.check, Some("missing_id"));
    }

    #[test]
    fn a_signature_that_is_not_base64_of_32_bytes_is_malformed() {
        for bad in ["not base64!", "AAAA", ""] {
            let map = delivery_of(&[("x-shopify-hmac-sha256", bad)]);
            let refused = Shopify
                .verify(
                    &Delivery {
                        query: None,
                        headers: &map,
                        body: b"{}",
                    },
                    &Keys {
                        secrets: &[b"s".to_vec()],
                        tolerance_secs: 300,
                        now: 0,
                        public_url: None,
                        webhook_id: None,
                        certificate: None,
                    },
                )
                .unwrap_err();
            assert_eq!(refused.check, Some("malformed_header"), "{bad:?}");
        }
    }
}
