//! PayPal (REST webhooks): `PAYPAL-TRANSMISSION-SIG` is the base64 `SHA256withRSA` signature,
//! under PayPal's message-verification certificate, of
//! `{PAYPAL-TRANSMISSION-ID}|{PAYPAL-TRANSMISSION-TIME}|{webhook_id}|{crc32(raw body)}` (the
//! CRC-32 as an unsigned decimal; the id and time as sent; the webhook id the source's own, so
//! a delivery for another webhook does not verify). `PAYPAL-AUTH-ALGO` must be
//! `SHA256withRSA`. The certificate is the configured one or the one `PAYPAL-CERT-URL` names,
//! resolved before [`Scheme::verify`] by `super::paypal_certificates` (fetching is async; the
//! trait's checks stay sync): [`Scheme::certificate_url`] gives the URL only once the
//! checks that need no key passed, so a stale or malformed delivery costs no fetch. The
//! certificate must be within its validity period at the delivery's time.
//!
//! The transmission time must be within the source's tolerance of now, either way: PayPal's
//! definitions make the id and the time the HTTP transmission's, so each retry is signed anew
//! (not observed on a live retry). The dedup id is the body's `id` (`WH-…`), the same on every
//! retry and resend; the type its `event_type`. No handshake. PayPal's pages:
//! developer.paypal.com/api/rest/webhooks/rest (the self-verification recipe) and
//! developer.paypal.com/api/webhooks/v1/definitions/verify_webhook_signature (the headers).

use std::borrow::Cow;

use base64::Engine;
use chrono::DateTime;
use serde::Deserialize;

use super::{malformed, missing_id, required, within_tolerance};
use super::{Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::{invalid_payload, invalid_signature};

const TRANSMISSION_ID: &str = "paypal-transmission-id";
const TRANSMISSION_TIME: &str = "paypal-transmission-time";
const TRANSMISSION_SIG: &str = "paypal-transmission-sig";
const CERT_URL: &str = "paypal-cert-url";
const AUTH_ALGO: &str = "paypal-auth-algo";

/// The one algorithm PayPal signs with (the SDKs map it to `sha256WithRSAEncryption`).
const SHA256_WITH_RSA: &str = "SHA256withRSA";

/// The PayPal scheme.
pub(super) struct Paypal;

/// A transmission's headers, read and checked for form.
struct Transmission<'a> {
    /// `PAYPAL-TRANSMISSION-ID`, as sent.
    id: &'a str,
    /// `PAYPAL-TRANSMISSION-TIME`, as sent (RFC 3339).
    time: &'a str,
    /// `PAYPAL-TRANSMISSION-SIG`, decoded.
    signature: Vec<u8>,
    /// `PAYPAL-CERT-URL`, as sent.
    cert_url: &'a str,
}

/// Reads the headers, and holds the transmission time to the tolerance: every check that
/// needs no certificate.
fn transmission<'a>(delivery: &Delivery<'a>, keys: &Keys<'_>) -> Result<Transmission<'a>, Problem> {
    let id = required(delivery.headers, TRANSMISSION_ID)?;
    let time = required(delivery.headers, TRANSMISSION_TIME)?;
    let signature = required(delivery.headers, TRANSMISSION_SIG)?;
    let cert_url = required(delivery.headers, CERT_URL)?;
    let algorithm = required(delivery.headers, AUTH_ALGO)?;
    if algorithm != SHA256_WITH_RSA {
        return Err(invalid_signature(
            format!("PAYPAL-AUTH-ALGO is not {SHA256_WITH_RSA}, the one algorithm accepted"),
            "unsupported_algorithm",
        ));
    }
    let at = DateTime::parse_from_rfc3339(time)
        .map_err(|_| malformed("PAYPAL-TRANSMISSION-TIME", "an RFC 3339 date-time"))?
        .timestamp();
    within_tolerance(at, keys)?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature)
        .map_err(|_| malformed("PAYPAL-TRANSMISSION-SIG", "base64"))?;
    Ok(Transmission {
        id,
        time,
        signature,
        cert_url,
    })
}

/// The string PayPal signs: `{id}|{time}|{webhook_id}|{crc32 of the body, decimal}`.
fn signed_string(transmission: &Transmission<'_>, webhook_id: &str, body: &[u8]) -> String {
    format!(
        "{}|{}|{webhook_id}|{}",
        transmission.id,
        transmission.time,
        crc32fast::hash(body)
    )
}

/// What is read of an event's body. Borrowed where the JSON has no escapes.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event_type: Option<Cow<'a, str>>,
}

impl Scheme for Paypal {
    /// The transmission's own id and time: which delivery of the event this was.
    fn kept_headers(&self) -> &'static [&'static str] {
        &[TRANSMISSION_ID, TRANSMISSION_TIME]
    }

    fn certificate_url<'d>(
        &self,
        delivery: &Delivery<'d>,
        keys: &Keys<'_>,
    ) -> Result<Option<&'d str>, Problem> {
        transmission(delivery, keys).map(|t| Some(t.cert_url))
    }

    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let transmission = transmission(delivery, keys)?;
        // Both are set for a paypal source (the settings require the one, the route resolves
        // the other first); their absence is a wiring fault, never a reason to accept.
        let (Some(certificate), Some(webhook_id)) = (keys.certificate, keys.webhook_id) else {
            tracing::error!("a paypal source verified without its certificate or webhook id");
            return Err(invalid_signature(
                "no certificate to verify PAYPAL-TRANSMISSION-SIG with",
                "certificate_url",
            ));
        };
        if !certificate.is_valid_at(keys.now) {
            return Err(invalid_signature(
                "the certificate is outside its validity period",
                "certificate_validity",
            ));
        }
        let signed = signed_string(&transmission, webhook_id, delivery.body);
        if certificate.verifies_sha256(signed.as_bytes(), &transmission.signature) {
            Ok(())
        } else {
            Err(invalid_signature(
                "PAYPAL-TRANSMISSION-SIG is not the certificate's signature of the transmission \
                 id, time, the source's webhook id and the body's CRC-32",
                "signature_mismatch",
            ))
        }
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let event: Event = serde_json::from_slice(delivery.body).map_err(|e| {
            invalid_payload(
                format!("the body is not a PayPal event's JSON object: {e}"),
                "payload_json",
            )
        })?;
        let id = event.id.ok_or_else(|| missing_id("id in its body"))?;
        Ok(Identified::Event {
            id: id.into_owned(),
            event_type: event.event_type.map(Cow::into_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::signature::certificate::RsaCertificate;

    /// The test certificate and a signature its key made (python `cryptography`) of the string
    /// `paypalrestsdk`'s `WebhookEvent._get_expected_sig` builds for this delivery.
    const PEM: &str = include_str!("../../signature/testdata/rsa_test_certificate.pem");
    const BODY: &str = r#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.COMPLETED"}"#;
    const TIME: &str = "2024-05-01T12:00:00Z";
    const AT: i64 = 1_714_564_800;
    const SIGNATURE: &str = "Jlo+J5oc4OJe4tUxi/No3Kr8pCRD0a8F3tlRRvoHH+Zat/gDqMpunByxMO62EXvGfKNP7GcofORIFrlEMe9Ox+r+P9Otpsmi8vldGyG1YHMLhUFFlKKOB69uVj+BS699sDFp3Hz6sWWlDJGEUjD9vCDFRFJSMeilq7bm1B/VUTPYyHH2asJm3+6/bBlVR38xYMuWKd+OKnpkpZOZK9/9dOiUDTdx1mSlJ24MQEpfRZ1pummSgOmK7EdYzh2ykWzSaW4Yi4/UhYOeUbSMCB/IGadprUmxf5bypbZGMNALbZhsi5RJMO4mo/8rjDVfNEhmxibaoXOQ1jH5FrFehlBFxg==";

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            (TRANSMISSION_ID, "69cd13f0-d67a-11e5-baa3-778b53f4ae55"),
            (TRANSMISSION_TIME, TIME),
            (TRANSMISSION_SIG, SIGNATURE),
            (
                CERT_URL,
                "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-df8cd2d5",
            ),
            (AUTH_ALGO, "SHA256withRSA"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        headers
    }

    fn verify(headers: &HeaderMap, body: &str, webhook_id: &str, now: i64) -> Result<(), Problem> {
        let certificate = RsaCertificate::from_pem(PEM.as_bytes()).unwrap();
        Paypal.verify(
            &Delivery {
                query: None,
                headers,
                body: body.as_bytes(),
            },
            &Keys {
                secrets: &[],
                tolerance_secs: 300,
                now,
                public_url: None,
                webhook_id: Some(webhook_id),
                certificate: Some(&certificate),
            },
        )
    }

    #[test]
    fn the_signed_string_is_paypals() {
        let headers = headers();
        let delivery = Delivery {
            query: None,
            headers: &headers,
            body: BODY.as_bytes(),
        };
        let keys = Keys {
            secrets: &[],
            tolerance_secs: 300,
            now: AT,
            public_url: None,
            webhook_id: None,
            certificate: None,
        };
        let transmission = transmission(&delivery, &keys).unwrap();
        // As `paypalrestsdk`'s `_get_expected_sig` gives it (str(crc32(body) & 0xffffffff)).
        assert_eq!(
            signed_string(&transmission, "1JE4291016473214C", BODY.as_bytes()),
            "69cd13f0-d67a-11e5-baa3-778b53f4ae55|2024-05-01T12:00:00Z|1JE4291016473214C|2325436976"
        );
    }

    #[test]
    fn verifies_within_the_tolerance_for_its_webhook_and_body_only() {
        let headers = headers();
        verify(&headers, BODY, "1JE4291016473214C", AT + 300).expect("verifies");
        verify(&headers, BODY, "1JE4291016473214C", AT - 300).expect("verifies");
        let check = |r: Result<(), Problem>| r.unwrap_err().check;
        for now in [AT + 301, AT - 301] {
            assert_eq!(
                check(verify(&headers, BODY, "1JE4291016473214C", now)),
                Some("timestamp_tolerance")
            );
        }
        assert_eq!(
            check(verify(&headers, BODY, "2JE4291016473214C", AT)),
            Some("signature_mismatch")
        );
        assert_eq!(
            check(verify(
                &headers,
                &BODY.replace("WH-1", "WH-2"),
                "1JE4291016473214C",
                AT
            )),
            Some("signature_mismatch")
        );
        for (name, value, expected) in [
            (AUTH_ALGO, "SHA1withRSA", "unsupported_algorithm"),
            (TRANSMISSION_TIME, "1455825695", "malformed_header"),
            (TRANSMISSION_SIG, "not base64!", "malformed_header"),
        ] {
            let mut changed = headers.clone();
            changed.insert(name, HeaderValue::from_static(value));
            assert_eq!(
                check(verify(&changed, BODY, "1JE4291016473214C", AT)),
                Some(expected),
                "{name}: {value}"
            );
        }
        for name in [
            TRANSMISSION_ID,
            TRANSMISSION_TIME,
            TRANSMISSION_SIG,
            CERT_URL,
            AUTH_ALGO,
        ] {
            let mut without = headers.clone();
            without.remove(name);
            assert_eq!(
                check(verify(&without, BODY, "1JE4291016473214C", AT)),
                Some("missing_header"),
                "{name}"
            );
        }
    }

    #[test]
    fn id_and_type_from_the_body() {
        let identify = |body: &str| {
            Paypal.identify(&Delivery {
                query: None,
                headers: &HeaderMap::new(),
                body: body.as_bytes(),
            })
        };
        assert_eq!(
            identify(BODY).unwrap(),
            Identified::Event {
                id: "WH-1".into(),
                event_type: Some("PAYMENT.CAPTURE.COMPLETED".into())
            }
        );
        for (body, check) in [
            (r#"{"event_type":"X"}"#, "missing_id"),
            ("id=WH-1", "payload_json"),
        ] {
            assert_eq!(identify(body).unwrap_err().check, Some(check), "{body}");
        }
    }
}
