//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the raw body under the webhook's
//! secret; no timestamp is signed, so a captured delivery verifies whenever it is replayed (the
//! dedup key makes a replay a duplicate). The dedup id is `{X-GitHub-Hook-ID}:{X-GitHub-Delivery}`
//! (the GUID alone when the hook id is absent): GitHub's REST description of a hook delivery
//! calls the GUID the "unique identifier for the event (shared with all deliveries for all
//! webhooks that subscribe to this event)", and a redelivery from the UI or API keeps it, so the
//! GUID alone would handle an organisation's and a repository's hook pointed at one source as one
//! event, and the hook alone names no event. GitHub does not retry by itself. The type is
//! `X-GitHub-Event` (`push`, `issues`, `ping`, …).
//!
//! GitHub's documentation: docs.github.com/webhooks/using-webhooks/validating-webhook-deliveries.
//! The legacy SHA-1 `X-Hub-Signature` is not accepted: GitHub sends both, and SHA-1 alone would
//! be the weaker check.

use super::{
    hmac_sha256_matches, malformed, mismatch, missing_id, required, Delivery, Identified, Keys,
    Scheme,
};
use crate::http::problem::Problem;
use crate::webhook::deliver::header_text;

const SIGNATURE: &str = "x-hub-signature-256";
const DELIVERY: &str = "x-github-delivery";
const EVENT: &str = "x-github-event";
const HOOK: &str = "x-github-hook-id";

/// The GitHub scheme.
pub(super) struct Github;

impl Scheme for Github {
    /// What a handler tells deliveries and hooks apart by (`X-GitHub-Hook-ID` is part of the
    /// dedup id too), and what the installation target is.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[
            EVENT,
            DELIVERY,
            HOOK,
            "x-github-hook-installation-target-type",
            "x-github-hook-installation-target-id",
        ]
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let header = required(delivery.headers, SIGNATURE)?;
        let signature = header
            .strip_prefix("sha256=")
            .and_then(|hex_digest| hex::decode(hex_digest).ok())
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| malformed("X-Hub-Signature-256", "sha256=<64 hex digits>"))?;
        if hmac_sha256_matches(keys.secrets, &[delivery.body], &signature) {
            Ok(())
        } else {
            Err(mismatch("X-Hub-Signature-256"))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let id = header_text(delivery.headers, DELIVERY)?
            .ok_or_else(|| missing_id("X-GitHub-Delivery header"))?;
        let event_type = header_text(delivery.headers, EVENT)?;
        let id = match header_text(delivery.headers, HOOK)?.filter(|hook| !hook.is_empty()) {
            Some(hook) => format!("{hook}:{id}"),
            None => id.to_owned(),
        };
        Ok(Identified::Event {
            id,
            event_type: event_type.map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    use super::*;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn check(headers: &[(&'static str, String)], body: &[u8]) -> Result<(), Problem> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        let secrets = [b"old".to_vec(), b"It's a Secret to Everybody".to_vec()];
        Github.verify(
            &Delivery {
                query: None,
                headers: &map,
                body,
            },
            &Keys {
                secrets: &secrets,
                tolerance_secs: 300,
                now: 0,
                public_url: None,
                webhook_id: None,
                certificate: None,
            },
        )
    }

    /// GitHub's own example (validating-webhook-deliveries): secret "It's a Secret to
    /// Everybody", payload "Hello, World!".
    #[test]
    fn githubs_published_example_verifies_under_any_configured_secret() {
        let expected =
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17".to_owned();
        assert_eq!(
            sign("It's a Secret to Everybody", b"Hello, World!"),
            expected
        );
        check(&[(SIGNATURE, expected.clone())], b"Hello, World!").expect("verifies");
        let failed = |headers: &[(&'static str, String)], body: &[u8]| {
            check(headers, body).expect_err("refused").check
        };
        assert_eq!(
            failed(&[(SIGNATURE, expected.clone())], b"Hello, World?"),
            Some("signature_mismatch")
        );
        assert_eq!(failed(&[], b"Hello, World!"), Some("missing_header"));
        for bad in [
            expected.replace("sha256=", "sha1="),
            expected.replace("sha256=", ""),
            "sha256=zz".to_owned(),
            expected[..expected.len() - 2].to_owned(),
        ] {
            assert_eq!(
                failed(&[(SIGNATURE, bad.clone())], b"Hello, World!"),
                Some("malformed_header"),
                "{bad}"
            );
        }
    }

    /// The GUID names the event for every hook subscribed to it, so the hook is the other half;
    /// a delivery without `X-GitHub-Hook-ID` (an older GitHub Enterprise) keys on the GUID.
    #[test]
    fn the_id_is_the_hook_and_the_delivery_guid() {
        let mut map = HeaderMap::new();
        map.insert(DELIVERY, HeaderValue::from_static("guid-1"));
        map.insert(EVENT, HeaderValue::from_static("push"));
        let id = |map: &HeaderMap| match Github.identify(&Delivery {
            query: None,
            headers: map,
            body: b"{}",
        }) {
            Ok(Identified::Event { id, event_type }) => {
                assert_eq!(event_type.as_deref(), Some("push"));
                id
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(id(&map), "guid-1");
        map.insert(HOOK, HeaderValue::from_static("42"));
        assert_eq!(id(&map), "42:guid-1");
    }
}
