//! `scheme = "shopify"`: `X-Shopify-Hmac-Sha256` made by `@shopify/shopify-api`'s test helper
//! `getHmac`, the dedup id `X-Shopify-Event-Id` (else `X-Shopify-Webhook-Id`), the type
//! `X-Shopify-Topic`.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::shopify_sign;
use crate::helpers::{Backend, TestDb};

const SECRET: &str = "shpss_0123456789abcdef0123456789abcdef";

/// A Shopify delivery as Shopify sends it (event id, webhook id, topic, shop, signature).
fn delivery(event_id: &str, webhook_id: &str, hmac: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("X-Shopify-Event-Id", event_id),
            ("X-Shopify-Webhook-Id", webhook_id),
            ("X-Shopify-Topic", "orders/create"),
            ("X-Shopify-Shop-Domain", "example.myshopify.com"),
            ("X-Shopify-API-Version", "2024-10"),
            ("X-Shopify-Hmac-Sha256", hmac),
            ("Content-Type", "application/json"),
        ],
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_by_shopify_api_accepted_and_forgeries_refused_with_nothing_enqueued() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("shop", "shopify", &[SECRET])])).await;
    let body = r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"254.98"}"#;
    let signed = shopify_sign(SECRET, &[body]).remove(0);
    let under_other = shopify_sign("shpss_another_apps_secret_0000000000", &[body]).remove(0);
    let good = delivery("e-1", "w-1", &signed, body);
    let (status, answer) = post(&app.url(""), "shop", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "e-1");
    // Without the event id (an older API version), the delivery's webhook id.
    let (status, answer) = post(&app.url(""), "shop", &good.without("X-Shopify-Event-Id")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "w-1");

    assert_refused(
        &app,
        "shop",
        &[
            (
                "signed with another app's secret",
                delivery("e-2", "w-2", &under_other, body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "no signature",
                good.without("X-Shopify-Hmac-Sha256"),
                "missing_header",
            ),
            (
                "hex instead of base64",
                delivery("e-3", "w-3", &"ab".repeat(32), body),
                "malformed_header",
            ),
            (
                "no id at all",
                good.without("X-Shopify-Event-Id")
                    .without("X-Shopify-Webhook-Id"),
                "missing_id",
            ),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    let seen: Vec<_> = queued
        .iter()
        .map(|m| {
            (
                m.source.as_deref(),
                m.message_id.as_deref(),
                m.message_type.as_deref(),
                m.payload.as_slice(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                Some("shop"),
                Some("e-1"),
                Some("orders/create"),
                body.as_bytes()
            ),
            (
                Some("shop"),
                Some("w-1"),
                Some("orders/create"),
                body.as_bytes()
            ),
        ]
    );
    app.stop().await;
}

/// Shopify's retries (the same event id and webhook id) and a second subscription's delivery of
/// the same event (the same event id, another webhook id) are handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_a_second_subscription_are_handled_once() {
    let body = r#"{"id":450789469,"financial_status":"paid"}"#;
    let next = r#"{"id":450789470,"financial_status":"paid"}"#;
    let hmacs = shopify_sign(SECRET, &[body, next]);
    let runs = handler_runs_after(
        Backend::Sqlite,
        sources(&[("shop", "shopify", &[SECRET])]),
        "shop",
        &[
            delivery("evt-a", "w-a", &hmacs[0], body),
            delivery("evt-a", "w-a", &hmacs[0], body),
            delivery("evt-a", "w-other-subscription", &hmacs[0], body),
            delivery("evt-b", "w-b", &hmacs[1], next),
        ],
    )
    .await;
    assert_eq!(runs, once_each("shop", &["evt-a", "evt-b"]));
}
