//! Stripe events for a test, and posting them signed as Stripe does.

use std::time::{Duration, Instant};

use crate::signature::stripe::signature_header;

/// A Stripe event `id` of type `event_type`, pretty-printed as Stripe sends it, whose
/// `data.object` is a payment intent `pi_<id>` (1999 usd).
pub fn stripe_event(id: &str, event_type: &str) -> Vec<u8> {
    stripe_event_with(
        id,
        event_type,
        serde_json::json!({
            "id": format!("pi_{id}"),
            "object": "payment_intent",
            "amount": 1999,
            "currency": "usd",
        }),
    )
}

/// As [`stripe_event`], with `object` as its `data.object` (an invoice for `invoice.paid`,
/// say).
pub fn stripe_event_with(id: &str, event_type: &str, object: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000,
        "type": event_type,
        "livemode": false,
        "data": { "object": object },
    }))
    .expect("a JSON value serialises")
}

/// Signs `body` with `secret` at the current time (a `Stripe-Signature` header as Stripe
/// makes it) and POSTs it to `url` (a [`TestApp`](super::TestApp)'s `/webhooks/stripe`).
pub async fn post_signed(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    body: Vec<u8>,
) -> reqwest::Result<reqwest::Response> {
    let header = signature_header(secret, chrono::Utc::now().timestamp(), &body);
    client
        .post(url)
        .header("Stripe-Signature", header)
        .body(body)
        .send()
        .await
}

/// Posts a signed event as Stripe delivers it: a 503 (the transport not reachable yet, a first
/// publish slower than `transport.publish_timeout` under load) or a failed request is sent
/// again, signed afresh, every 50 ms until another answer or 30 s. Whatever it answers then is
/// the test's to check.
///
/// # Panics
///
/// When nothing but 503s and failed requests came back in 30 s.
pub async fn post_signed_until_not_503(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    body: Vec<u8>,
) -> reqwest::Response {
    let timeout = Duration::from_secs(30);
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(response) = post_signed(client, url, secret, body.clone()).await {
            if response.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                return response;
            }
        }
        assert!(
            Instant::now() <= deadline,
            "timed out after {timeout:?} waiting for an answer other than 503 to a signed event"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
