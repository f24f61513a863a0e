//! Adyen (payments' standard webhooks, JSON): `{"live":"false","notificationItems":[{
//! "NotificationRequestItem":{…}}, …]}`. There is no signature header: each item carries its
//! own `additionalData.hmacSignature`, the base64 HMAC-SHA256, under the hex-decoded HMAC key,
//! of `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:
//! eventCode:success` (`value` and `currency` from `amount`; a missing field is the empty string;
//! no escaping: Adyen's libraries, Python `Adyen.util.generate_notification_sig` and Node
//! `HmacValidator.getDataToSign`, join the fields as they are). Fields, not bytes, are signed,
//! so the body is parsed before it is verified (with serde_json's recursion limit), and every
//! item must verify, or the whole delivery is refused with nothing enqueued.
//!
//! Each item is its own event, its payload the item's `NotificationRequestItem` object, byte
//! for byte; its id `{merchantAccountCode}:{pspReference}:{eventCode}:{success}` (Adyen's
//! duplicates "share eventCode and pspReference"; `success` is kept so that a `false` followed
//! by a `true` is two events), its type the `eventCode`. The answer is `[accepted]`, once every
//! item is durable. Adyen's documentation: docs.adyen.com/development-resources/webhooks/
//! verify-hmac-signatures and …/webhooks/handle-webhook-events.

use base64::prelude::{Engine as _, BASE64_STANDARD};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{hmac_sha256_matches, missing_id};
use super::{BatchEvent, Delivery, Identified, Keys, Scheme};
use crate::http::problem::Problem;
use crate::webhook::deliver::{invalid_payload, invalid_signature};

/// What Adyen expects in the answer's body (its classic requirement; any 2xx would do now).
const ACCEPTED: &str = "[accepted]";

/// The Adyen scheme.
pub(super) struct Adyen;

/// A notification batch, each item kept as its raw JSON (its payload) to be read again.
#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow, rename = "notificationItems")]
    items: Vec<Wrapper<'a>>,
}

/// `{"NotificationRequestItem": {…}}`.
#[derive(Deserialize)]
struct Wrapper<'a> {
    #[serde(borrow, rename = "NotificationRequestItem")]
    item: &'a RawValue,
}

/// What is read of one item: the signed fields (as JSON values: Adyen's libraries sign their
/// text whatever their JSON type) and the signature.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    psp_reference: Option<Value>,
    original_reference: Option<Value>,
    merchant_account_code: Option<Value>,
    merchant_reference: Option<Value>,
    amount: Option<Amount>,
    event_code: Option<Value>,
    success: Option<Value>,
    additional_data: Option<AdditionalData>,
}

/// An item's `amount`.
#[derive(Deserialize)]
struct Amount {
    value: Option<Value>,
    currency: Option<Value>,
}

/// The part of an item's `additionalData` that is read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdditionalData {
    hmac_signature: Option<String>,
}

impl Item {
    /// The string Adyen signs.
    fn signed_string(&self) -> String {
        let (value, currency) = match &self.amount {
            Some(amount) => (text(amount.value.as_ref()), text(amount.currency.as_ref())),
            None => (String::new(), String::new()),
        };
        [
            text(self.psp_reference.as_ref()),
            text(self.original_reference.as_ref()),
            text(self.merchant_account_code.as_ref()),
            text(self.merchant_reference.as_ref()),
            value,
            currency,
            text(self.event_code.as_ref()),
            text(self.success.as_ref()),
        ]
        .join(":")
    }
}

/// A signed field's text: a string as it is, a number or boolean as JSON writes it, a missing
/// or null field empty (as the libraries do for the fields Adyen leaves out).
fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// The body's items, each as its raw JSON and as read; a 400 when the body is not a batch.
fn items(body: &[u8]) -> Result<Vec<(&RawValue, Item)>, Problem> {
    let not_a_batch = |e: serde_json::Error| {
        invalid_payload(
            format!("the body is not an Adyen notification batch: {e}"),
            "payload_json",
        )
    };
    let batch: Batch = serde_json::from_slice(body).map_err(not_a_batch)?;
    batch
        .items
        .into_iter()
        .map(|w| {
            Ok((
                w.item,
                serde_json::from_str(w.item.get()).map_err(not_a_batch)?,
            ))
        })
        .collect()
}

impl Scheme for Adyen {
    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem> {
        let items = items(delivery.body)?;
        if items.is_empty() {
            return Err(invalid_signature(
                "the notification batch has no item, so no signature",
                "missing_signature",
            ));
        }
        for (at, (_, item)) in items.iter().enumerate() {
            let signature = item
                .additional_data
                .as_ref()
                .and_then(|data| data.hmac_signature.as_deref())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    invalid_signature(
                        format!("notification item {at} has no additionalData.hmacSignature"),
                        "missing_signature",
                    )
                })?;
            let signature = BASE64_STANDARD
                .decode(signature)
                .ok()
                .filter(|bytes| bytes.len() == 32)
                .ok_or_else(|| {
                    invalid_signature(
                        format!(
                            "notification item {at}'s hmacSignature is not the base64 of 32 bytes"
                        ),
                        "malformed_signature",
                    )
                })?;
            let signed = item.signed_string();
            if !hmac_sha256_matches(keys.secrets, &[signed.as_bytes()], &signature) {
                return Err(invalid_signature(
                    format!(
                        "notification item {at}'s hmacSignature matches none of its fields' \
                         signatures under the source's HMAC keys"
                    ),
                    "signature_mismatch",
                ));
            }
        }
        Ok(())
    }

    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem> {
        let events = items(delivery.body)?
            .into_iter()
            .map(|(raw, item)| {
                let required = |value: &Option<Value>, what: &str| {
                    Some(text(value.as_ref()))
                        .filter(|s| !s.is_empty())
                        .ok_or_else(|| missing_id(what))
                };
                let psp_reference = required(&item.psp_reference, "pspReference in an item")?;
                let event_code = required(&item.event_code, "eventCode in an item")?;
                let id = format!(
                    "{}:{psp_reference}:{event_code}:{}",
                    text(item.merchant_account_code.as_ref()),
                    text(item.success.as_ref()),
                );
                Ok(BatchEvent {
                    id,
                    event_type: Some(event_code),
                    payload: Bytes::copy_from_slice(raw.get().as_bytes()),
                })
            })
            .collect::<Result<Vec<_>, Problem>>()?;
        Ok(Identified::Batch {
            events,
            answer: Some(ACCEPTED),
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::*;

    /// The known answer of Adyen's libraries' tests: this key over this item's fields gives
    /// `coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=`.
    #[test]
    fn adyen_library_vector_verifies_and_identifies() {
        let key = hex::decode("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056")
            .unwrap();
        let body = r#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"additionalData":{"hmacSignature":"coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="},"amount":{"currency":"EUR","value":1130},"eventCode":"AUTHORISATION","eventDate":"2014-08-06T13:39:04+02:00","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","pspReference":"7914073381342284","success":"true"}}]}"#;
        let headers = HeaderMap::new();
        let delivery = Delivery {
            query: None,
            headers: &headers,
            body: body.as_bytes(),
        };
        let with = |secret: Vec<u8>| {
            Adyen.verify(
                &delivery,
                &Keys {
                    secrets: &[secret],
                    tolerance_secs: 0,
                    now: 0,
                    public_url: None,
                    webhook_id: None,
                    certificate: None,
                },
            )
        };
        with(key.clone()).expect("verifies");
        let mut other = key;
        other[0] ^= 1;
        assert_eq!(with(other).unwrap_err().check, Some("signature_mismatch"));
        let Identified::Batch { events, answer } = Adyen.identify(&delivery).unwrap() else {
            panic!("a batch");
        };
        assert_eq!(answer, Some("[accepted]"));
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].id,
            "TestMerchant:7914073381342284:AUTHORISATION:true"
        );
        assert_eq!(events[0].event_type.as_deref(), Some("AUTHORISATION"));
        assert!(events[0].payload.starts_with(br#"{"additionalData""#));
    }
}
