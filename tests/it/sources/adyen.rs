//! `scheme = "adyen"`: the HMAC inside each notification item, made by the `Adyen` library's
//! `generate_notification_sig`; a batch of several items is several events, answered
//! `[accepted]` once every one is durable; one forged item refuses the whole batch with nothing
//! enqueued; a redelivered batch is handled once.

use serde_json::{json, Value};

use super::{handler_runs_after, ingress_only, once_each, queued, Delivery};
use crate::helpers::senders::adyen_sign;
use crate::helpers::{Backend, TestDb};

/// An HMAC key as the Customer Area shows it (hex): the one of Adyen's libraries' tests.
const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

fn adyen_source() -> Value {
    json!({ "adyen": { "scheme": "adyen", "secrets": ["00ff", KEY] } })
}

/// A notification item as Adyen sends it (unsigned).
pub(super) fn item(psp: &str, event_code: &str, value: u64) -> Value {
    json!({
        "amount": { "currency": "EUR", "value": value },
        "eventCode": event_code,
        "eventDate": "2026-12-07T10:18:49+01:00",
        "merchantAccountCode": "ShopECOM",
        "merchantReference": "order:42",
        "originalReference": if event_code == "CAPTURE" { "8616178914061985" } else { "" },
        "paymentMethod": "visa",
        "pspReference": psp,
        "reason": "",
        "success": "true",
    })
}

/// A batch of `items` as Adyen posts it.
pub(super) fn batch(items: &[Value]) -> Delivery {
    let wrapped: Vec<Value> = items
        .iter()
        .map(|item| json!({ "NotificationRequestItem": item }))
        .collect();
    let body = json!({ "live": "false", "notificationItems": wrapped }).to_string();
    Delivery::new(&[("Content-Type", "application/json")], &body)
}

/// Posts `delivery`; the status, the content type and the body as text.
async fn post_text(base: &str, delivery: &Delivery) -> (u16, String, String) {
    let response = reqwest::Client::new()
        .post(format!("{base}/webhooks/adyen"))
        .header("Content-Type", "application/json")
        .body(delivery.body.clone())
        .send()
        .await
        .expect("the ingress answers");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, content_type, response.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_batch_is_one_event_per_item_and_a_forged_item_refuses_it() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, adyen_source()).await;
    let signed = adyen_sign(
        KEY,
        &[
            item("8616178914061985", "AUTHORISATION", 1130),
            item("8816178914079738", "CAPTURE", 1130),
            item("8616178914061985", "REPORT_AVAILABLE", 0),
        ],
    );
    let under_other = adyen_sign(
        "00112233445566778899aabbccddeeff",
        &[item("X1", "REFUND", 5)],
    );

    // One forged item among signed ones: the batch is refused whole, nothing enqueued.
    let mut value_changed = signed[1].clone();
    value_changed["amount"]["value"] = json!(1);
    let mut unsigned = signed[1].clone();
    unsigned["additionalData"] = json!({});
    for (what, forged, check) in [
        (
            "an item signed with another key",
            under_other[0].clone(),
            "signature_mismatch",
        ),
        (
            "an item's amount changed",
            value_changed,
            "signature_mismatch",
        ),
        (
            "an item without its signature",
            unsigned,
            "missing_signature",
        ),
    ] {
        let delivery = batch(&[signed[0].clone(), forged, signed[2].clone()]);
        let (status, content_type, problem) = post_text(&app.url(""), &delivery).await;
        assert_eq!(status, 400, "{what}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{what}");
        let problem: Value = serde_json::from_str(&problem).expect("a problem document");
        assert_eq!(problem["check"], check, "{what}: {problem}");
    }
    let (status, _, problem) = post_text(&app.url(""), &batch(&[])).await;
    assert_eq!(status, 400, "{problem}");
    assert!(queued(&app.store).await.is_empty(), "nothing enqueued");

    let (status, content_type, answer) = post_text(&app.url(""), &batch(&signed)).await;
    assert_eq!((status, answer.as_str()), (200, "[accepted]"));
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let queued = queued(&app.store).await;
    let ids: Vec<(&str, &str)> = queued
        .iter()
        .map(|m| {
            (
                m.message_id.as_deref().unwrap_or_default(),
                m.message_type.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            (
                "ShopECOM:8616178914061985:AUTHORISATION:true",
                "AUTHORISATION"
            ),
            ("ShopECOM:8816178914079738:CAPTURE:true", "CAPTURE"),
            (
                "ShopECOM:8616178914061985:REPORT_AVAILABLE:true",
                "REPORT_AVAILABLE"
            ),
        ]
    );
    for (message, item) in queued.iter().zip(&signed) {
        assert_eq!(message.source.as_deref(), Some("adyen"));
        // The payload is the item alone: the handler handles one notification.
        let payload: Value = serde_json::from_slice(&message.payload).expect("JSON");
        assert_eq!(&payload, item);
    }
    app.stop().await;
}

/// Adyen redelivers a batch that was not answered 2xx: its items are handled once, and an
/// item that comes again in another batch too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_batch_is_handled_once() {
    let signed = adyen_sign(
        KEY,
        &[
            item("8616178914061985", "AUTHORISATION", 1130),
            item("8816178914079738", "CAPTURE", 1130),
            item("8516178914099999", "REFUND", 200),
        ],
    );
    let first = batch(&signed[..2]);
    let again = batch(&signed[..2]);
    let overlapping = batch(&signed[1..]);
    let mut runs = handler_runs_after(
        Backend::Sqlite,
        adyen_source(),
        "adyen",
        &[first, again, overlapping],
    )
    .await;
    runs.sort();
    assert_eq!(
        runs,
        once_each(
            "adyen",
            &[
                "ShopECOM:8516178914099999:REFUND:true",
                "ShopECOM:8616178914061985:AUTHORISATION:true",
                "ShopECOM:8816178914079738:CAPTURE:true",
            ]
        )
    );
}
