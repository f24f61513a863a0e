//! The route with a batch (Adyen's) and a transport that fails one publish: the sender is told
//! to retry (503 with `Retry-After`), never `[accepted]` while an item is not durable, and the
//! redelivered batch is accepted once every item is. A fake transport is the only way to fail
//! the second publish of a delivery and not the first; the real transports' 503s are
//! tests/it/outage.rs's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::Request;
use base64::prelude::{Engine as _, BASE64_STANDARD};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tower::ServiceExt;

use super::{from_settings, router, SourcesState};
use crate::config::{SchemeKind, Secret, SourceSettings};
use crate::queue::{Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};

/// Keeps what is published; the publish numbered `fail_at` (from 0) is refused as unavailable.
struct Flaky {
    /// The ids of the messages taken, in order.
    published: Mutex<Vec<String>>,
    /// Publishes attempted so far.
    attempts: Mutex<usize>,
    /// Which attempt fails.
    fail_at: usize,
}

#[async_trait]
impl Transport for Flaky {
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError> {
        let mut attempts = self.attempts.lock().unwrap();
        *attempts += 1;
        if *attempts - 1 == self.fail_at {
            return Err(TransportError::Unavailable(crate::queue::Cause::from(
                "the broker went away",
            )));
        }
        let id = message.message_id.unwrap_or_default();
        self.published.lock().unwrap().push(id);
        Ok(())
    }
    async fn receive(&self, _: usize, _: Duration) -> Result<Vec<Delivery>, TransportError> {
        Ok(Vec::new())
    }
    async fn ack(&self, _: &[DeliveryTag]) -> Result<(), TransportError> {
        Ok(())
    }
    async fn release(&self, _: &[DeliveryTag]) -> Result<(), TransportError> {
        Ok(())
    }
    async fn extend_leases(
        &self,
        _: &[DeliveryTag],
        _: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        Ok(Vec::new())
    }
    async fn retry_later(&self, _: &Delivery, _: Duration) -> Result<(), TransportError> {
        Ok(())
    }
    async fn ready(&self) -> Result<(), TransportError> {
        Ok(())
    }
    fn queue_name(&self) -> &str {
        "flaky"
    }
}

const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// A signed notification item (signed here as Adyen's libraries sign; the libraries
/// themselves sign tests/it/sources/adyen.rs's).
fn item(psp: &str) -> serde_json::Value {
    let fields = format!("{psp}::Shop:order-1:500:EUR:AUTHORISATION:true");
    let mut mac = Hmac::<Sha256>::new_from_slice(&hex::decode(KEY).unwrap()).unwrap();
    mac.update(fields.as_bytes());
    let signature = BASE64_STANDARD.encode(mac.finalize().into_bytes());
    serde_json::json!({ "NotificationRequestItem": {
        "additionalData": { "hmacSignature": signature },
        "amount": { "currency": "EUR", "value": 500 },
        "eventCode": "AUTHORISATION", "merchantAccountCode": "Shop",
        "merchantReference": "order-1", "pspReference": psp, "success": "true",
    }})
}

#[tokio::test]
async fn a_batch_is_accepted_only_once_every_item_is_durable() {
    let transport = Arc::new(Flaky {
        published: Mutex::new(Vec::new()),
        attempts: Mutex::new(0),
        fail_at: 1,
    });
    let settings = BTreeMap::from([(
        "adyen".to_owned(),
        SourceSettings {
            scheme: SchemeKind::Adyen,
            secrets: vec![Secret(KEY.to_owned())],
            tolerance: None,
            public_url: None,
            webhook_id: None,
            certificate: None,
            certificate_url_prefixes: Vec::new(),
            preset: None,
            hmac: None,
            id_field: None,
        },
    )]);
    let app = router(
        SourcesState {
            transport: transport.clone(),
            sources: from_settings(&settings),
            publish_timeout: Duration::from_secs(5),
            clock: Arc::new(|| 0),
        },
        1 << 20,
    );
    let body = serde_json::json!({
        "live": "false",
        "notificationItems": [item("P1"), item("P2"), item("P3")],
    })
    .to_string();
    let post = || {
        app.clone().oneshot(
            Request::post("/webhooks/adyen")
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .unwrap(),
        )
    };

    let refused = post().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        *transport.published.lock().unwrap(),
        ["Shop:P1:AUTHORISATION:true"]
    );

    let accepted = post().await.unwrap();
    assert_eq!(accepted.status(), 200);
    let text = axum::body::to_bytes(accepted.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&text[..], b"[accepted]");
    // The first item twice: the consumer's dedup insert makes the second a duplicate.
    assert_eq!(
        *transport.published.lock().unwrap(),
        [
            "Shop:P1:AUTHORISATION:true",
            "Shop:P1:AUTHORISATION:true",
            "Shop:P2:AUTHORISATION:true",
            "Shop:P3:AUTHORISATION:true",
        ]
    );
}
