//! `scheme = "square"`: `x-square-hmacsha256-signature` over the configured `public_url` and the
//! body (a plain HMAC, as Square signs; the pip `squareup`'s `verify_signature` accepts each one
//! the test sends, for that URL only); the dedup id the body's `event_id`, the type its `type`.

use serde_json::{json, Value};

use super::{assert_refused, handler_runs_after, ingress_only, once_each, post, queued, Delivery};
use crate::helpers::senders::square_sign;
use crate::helpers::{Backend, TestDb};

const KEY: &str = "sq0wsk_Ibxx_5AKakO-3qeNVR61Dw";
/// The URL Square was given: a proxy's, not the test server's own address.
const URL: &str = "https://hooks.example.com/webhooks/square";

fn square_source() -> Value {
    json!({ "square": { "scheme": "square", "secrets": [KEY], "public_url": URL } })
}

/// A notification as Square sends it.
fn delivery(signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("x-square-hmacsha256-signature", signature),
            ("square-environment", "Sandbox"),
            ("Content-Type", "application/json"),
            ("User-Agent", "Square Connect v2"),
        ],
        body,
    )
}

fn event(id: &str) -> String {
    format!(
        r#"{{"merchant_id":"6SSW7HV8K2ST5","type":"payment.updated","event_id":"{id}","created_at":"2024-04-12T10:18:49.621Z","data":{{"type":"payment","id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","object":{{"payment":{{"status":"COMPLETED"}}}}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_as_square_and_accepted_by_its_sdk_accepted_and_forgeries_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, square_source()).await;
    let body = event("6a8f5f28-54a1-4eb0-a98a-3111513fd4fc");
    let signed = square_sign(
        KEY,
        &[
            (URL, body.as_str()),
            ("https://hooks.example.com/webhooks/other", body.as_str()),
            (&app.url("/webhooks/square"), body.as_str()),
        ],
    );
    let under_other = square_sign("sq0wsk_not_the_key", &[(URL, body.as_str())]);
    let good = delivery(&signed[0], &body);
    let (status, answer) = post(&app.url(""), "square", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "6a8f5f28-54a1-4eb0-a98a-3111513fd4fc");

    assert_refused(
        &app,
        "square",
        &[
            (
                "signed with another key",
                delivery(&under_other[0], &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "signed for another URL",
                delivery(&signed[1], &body),
                "signature_mismatch",
            ),
            (
                "signed for the address the ingress itself listens on",
                delivery(&signed[2], &body),
                "signature_mismatch",
            ),
            (
                "no signature",
                good.without("x-square-hmacsha256-signature"),
                "missing_header",
            ),
            ("not base64", delivery("v1=abc", &body), "malformed_header"),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(queued.len(), 1, "the accepted delivery and nothing else");
    assert_eq!(queued[0].source.as_deref(), Some("square"));
    assert_eq!(
        queued[0].message_id.as_deref(),
        Some("6a8f5f28-54a1-4eb0-a98a-3111513fd4fc")
    );
    assert_eq!(queued[0].message_type.as_deref(), Some("payment.updated"));
    assert_eq!(queued[0].payload, body.as_bytes());
    app.stop().await;
}

/// Square's retries (`square-retry-number`, the same bytes and signature) are handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_handled_once() {
    let (first, second) = (event("e-1"), event("e-2"));
    let signed = square_sign(KEY, &[(URL, first.as_str()), (URL, second.as_str())]);
    let retry = |n: &str| {
        let mut d = delivery(&signed[0], &first);
        d.headers.push(("square-retry-number", n.to_owned()));
        d.headers
            .push(("square-retry-reason", "http_timeout".to_owned()));
        d
    };
    let runs = handler_runs_after(
        Backend::Sqlite,
        square_source(),
        "square",
        &[
            delivery(&signed[0], &first),
            retry("1"),
            retry("2"),
            delivery(&signed[1], &second),
        ],
    )
    .await;
    assert_eq!(runs, once_each("square", &["e-1", "e-2"]));
}
