//! `scheme = "paypal"`: `PAYPAL-TRANSMISSION-SIG`, `SHA256withRSA` over the string
//! `paypalrestsdk`'s `WebhookEvent._get_expected_sig` builds (transmission id, time, webhook id,
//! CRC-32 of the body), under a test key whose self-signed certificate is either configured or
//! served by a loopback certificate server the source's `certificate_url_prefixes` points at
//! (PayPal signs on its servers: no SDK signs, see `helpers::senders::paypal_sign`). The dedup
//! id is the body's `id`, the type its `event_type`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use chrono::{DateTime, SecondsFormat};
use serde_json::{json, Value};

use super::{assert_refused, handler_runs_after, ingress_only, once_each, post, queued, Delivery};
use crate::helpers::senders::{paypal_sign, paypal_sign_as};
use crate::helpers::{now, serve, Backend, TestDb};

const WEBHOOK_ID: &str = "1JE4291016473214C";
/// Where PayPal's certificates are: what a delivery names when the certificate is configured.
pub(super) const PAYPAL_CERT_URL: &str =
    "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-df8cd2d5";

/// A transmission time as PayPal sends it (`2024-05-01T12:00:00Z`).
pub(super) fn rfc3339(unix: i64) -> String {
    DateTime::from_timestamp(unix, 0)
        .expect("a time")
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// A notification as PayPal sends it.
pub(super) fn delivery(
    transmission: (&str, &str),
    signature: &str,
    cert_url: &str,
    body: &str,
) -> Delivery {
    Delivery::new(
        &[
            ("PAYPAL-TRANSMISSION-ID", transmission.0),
            ("PAYPAL-TRANSMISSION-TIME", transmission.1),
            ("PAYPAL-TRANSMISSION-SIG", signature),
            ("PAYPAL-CERT-URL", cert_url),
            ("PAYPAL-AUTH-ALGO", "SHA256withRSA"),
            ("PAYPAL-AUTH-VERSION", "v2"),
            ("Content-Type", "application/json"),
        ],
        body,
    )
}

pub(super) fn event(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","event_version":"1.0","create_time":"2024-05-01T12:00:00.000Z","resource_type":"capture","resource_version":"2.0","event_type":"PAYMENT.CAPTURE.COMPLETED","summary":"Payment completed for $ 21.0 USD","resource":{{"id":"80F85758S3080410K","status":"COMPLETED","amount":{{"value":"21.00","currency_code":"USD"}}}}}}"#
    )
}

/// A source that verifies with `certificate` (PEM) instead of fetching.
fn configured(certificate: &str) -> Value {
    json!({ "paypal": { "scheme": "paypal", "webhook_id": WEBHOOK_ID, "certificate": certificate } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_certificate_accepted_and_forgeries_refused_with_nothing_enqueued() {
    let t = now();
    let body = event("WH-2WR32451HC0233532-67976317FL4543714");
    let (fresh, stale, future) = (rfc3339(t), rfc3339(t - 400), rfc3339(t + 400));
    let tx = "69cd13f0-d67a-11e5-baa3-778b53f4ae55";
    let (certificate, signatures) = paypal_sign(
        &[
            (tx, &fresh, WEBHOOK_ID, &body),
            (tx, &stale, WEBHOOK_ID, &body),
            (tx, &future, WEBHOOK_ID, &body),
            (tx, &fresh, "9XL90610J3647323C", &body),
        ],
        (-1, 1),
    );
    let (_, under_other_key) = paypal_sign(&[(tx, &fresh, WEBHOOK_ID, &body)], (-1, 1));
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, configured(&certificate)).await;
    let good = delivery((tx, &fresh), &signatures[0], PAYPAL_CERT_URL, &body);
    let (status, answer) = post(&app.url(""), "paypal", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "WH-2WR32451HC0233532-67976317FL4543714");

    let mut sha1 = delivery((tx, &fresh), &signatures[0], PAYPAL_CERT_URL, &body);
    sha1.headers.retain(|(name, _)| *name != "PAYPAL-AUTH-ALGO");
    sha1.headers
        .push(("PAYPAL-AUTH-ALGO", "SHA1withRSA".to_owned()));
    assert_refused(
        &app,
        "paypal",
        &[
            (
                "signed with another key",
                delivery((tx, &fresh), &under_other_key[0], PAYPAL_CERT_URL, &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "signed for another webhook",
                delivery((tx, &fresh), &signatures[3], PAYPAL_CERT_URL, &body),
                "signature_mismatch",
            ),
            (
                "the signature of another transmission id",
                delivery(("tx-2", &fresh), &signatures[0], PAYPAL_CERT_URL, &body),
                "signature_mismatch",
            ),
            (
                "transmitted 400 s ago",
                delivery((tx, &stale), &signatures[1], PAYPAL_CERT_URL, &body),
                "timestamp_tolerance",
            ),
            (
                "transmitted 400 s ahead",
                delivery((tx, &future), &signatures[2], PAYPAL_CERT_URL, &body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good.without("PAYPAL-TRANSMISSION-SIG"),
                "missing_header",
            ),
            (
                "no certificate URL",
                good.without("PAYPAL-CERT-URL"),
                "missing_header",
            ),
            (
                "a certificate URL on a host of the forger's",
                delivery(
                    (tx, &fresh),
                    &signatures[0],
                    "https://api.paypal.com.example.net/v1/notifications/certs/CERT-1",
                    &body,
                ),
                "certificate_url",
            ),
            ("SHA1withRSA", sha1, "unsupported_algorithm"),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(queued.len(), 1, "the accepted delivery and nothing else");
    assert_eq!(queued[0].source.as_deref(), Some("paypal"));
    assert_eq!(
        queued[0].message_id.as_deref(),
        Some("WH-2WR32451HC0233532-67976317FL4543714")
    );
    assert_eq!(
        queued[0].message_type.as_deref(),
        Some("PAYMENT.CAPTURE.COMPLETED")
    );
    assert_eq!(queued[0].payload, body.as_bytes());
    app.stop().await;
}

/// A loopback certificate server: `GET /certs/{name}` answers the PEM stored under `name`
/// (404 for another), counting every request.
struct CertificateServer {
    addr: std::net::SocketAddr,
    fetches: Arc<AtomicUsize>,
}

impl CertificateServer {
    async fn start(certificates: Vec<(&'static str, String)>) -> Self {
        type Served = (Arc<AtomicUsize>, Arc<Vec<(&'static str, String)>>);
        async fn certificate(
            State((fetches, certificates)): State<Served>,
            Path(name): Path<String>,
        ) -> Result<String, StatusCode> {
            fetches.fetch_add(1, Ordering::SeqCst);
            certificates
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, pem)| pem.clone())
                .ok_or(StatusCode::NOT_FOUND)
        }
        let fetches = Arc::new(AtomicUsize::new(0));
        let router = axum::Router::new()
            .route("/certs/{name}", get(certificate))
            .with_state((fetches.clone(), Arc::new(certificates)));
        CertificateServer {
            addr: serve(router).await,
            fetches,
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// The fetch path, with the source's `certificate_url_prefixes` pointed at loopback servers
/// (PayPal's hosts otherwise): the named certificate is fetched once for two deliveries; a URL
/// outside the prefixes is refused with nothing fetched; an expired certificate, or one not
/// named as PayPal's, is refused; a certificate that cannot be fetched (server down, 404) is a 503 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_named_certificate_is_fetched_once_from_the_allowed_prefix_only() {
    let t = now();
    let fresh = rfc3339(t);
    let (a, b, c) = (event("WH-A"), event("WH-B"), event("WH-C"));
    let (certificate, signatures) = paypal_sign(
        &[
            ("tx-a", &fresh, WEBHOOK_ID, &a),
            ("tx-b", &fresh, WEBHOOK_ID, &b),
            ("tx-c", &fresh, WEBHOOK_ID, &c),
        ],
        (-1, 1),
    );
    let (expired, under_expired) = paypal_sign(&[("tx-c", &fresh, WEBHOOK_ID, &c)], (-3, -1));
    let (not_paypals, under_not_paypals) =
        paypal_sign_as("example.com", &[("tx-c", &fresh, WEBHOOK_ID, &c)], (-1, 1));
    let server = CertificateServer::start(vec![
        ("paypal.pem", certificate),
        ("expired.pem", expired),
        ("other.pem", not_paypals),
    ])
    .await;
    // A port nothing listens on: a certificate host that is down.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let prefixes = [
        format!("http://{}/certs/", server.addr),
        format!("http://{down}/certs/"),
    ];
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(
        &db,
        json!({ "paypal": {
            "scheme": "paypal",
            "webhook_id": WEBHOOK_ID,
            "certificate_url_prefixes": prefixes,
        } }),
    )
    .await;
    let url = format!("http://{}/certs/paypal.pem", server.addr);
    for (tx, signature, body) in [("tx-a", &signatures[0], &a), ("tx-b", &signatures[1], &b)] {
        let (status, answer) = post(
            &app.url(""),
            "paypal",
            &delivery((tx, &fresh), signature, &url, body),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(
        server.fetches(),
        1,
        "the second delivery used the cached certificate"
    );

    let c_at = |url: &str| delivery(("tx-c", &fresh), &signatures[2], url, &c);
    assert_refused(
        &app,
        "paypal",
        &[
            (
                "a certificate URL outside the prefixes, on the same server",
                c_at(&format!("http://{}/elsewhere/paypal.pem", server.addr)),
                "certificate_url",
            ),
            (
                "a certificate URL on a host of the forger's",
                c_at("https://paypal.example.net/v1/notifications/certs/CERT-1"),
                "certificate_url",
            ),
            (
                "PayPal's own URL, not allowed here",
                c_at(PAYPAL_CERT_URL),
                "certificate_url",
            ),
        ],
    )
    .await;
    assert_eq!(server.fetches(), 1, "nothing fetched for a refused URL");

    let served = |name: &str| format!("http://{}/certs/{name}", server.addr);
    assert_refused(
        &app,
        "paypal",
        &[
            (
                "a certificate past its validity",
                delivery(
                    ("tx-c", &fresh),
                    &under_expired[0],
                    &served("expired.pem"),
                    &c,
                ),
                "certificate_validity",
            ),
            (
                "a certificate that is not PayPal's message-verification one",
                delivery(
                    ("tx-c", &fresh),
                    &under_not_paypals[0],
                    &served("other.pem"),
                    &c,
                ),
                "certificate_subject",
            ),
        ],
    )
    .await;

    for url in [
        format!("http://{down}/certs/paypal.pem"),
        format!("http://{}/certs/missing.pem", server.addr),
    ] {
        let mut request = reqwest::Client::new()
            .post(app.url("/webhooks/paypal"))
            .body(c.clone());
        for (name, value) in &c_at(&url).headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.expect("the ingress answers");
        assert_eq!(response.status(), 503, "{url}");
        assert!(
            response.headers().contains_key("retry-after"),
            "{url}: {:?}",
            response.headers()
        );
    }

    let queued = queued(&app.store).await;
    let ids: Vec<_> = queued.iter().filter_map(|m| m.message_id.clone()).collect();
    assert_eq!(ids, ["WH-A", "WH-B"], "nothing but the accepted deliveries");
    app.stop().await;
}

/// PayPal's retries of one event (a new transmission, signed anew, the same body `id`) are
/// handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_handled_once() {
    let t = now();
    let (first, second) = (event("WH-R"), event("WH-S"));
    let (early, late) = (rfc3339(t - 60), rfc3339(t));
    let (certificate, signatures) = paypal_sign(
        &[
            ("tx-1", &early, WEBHOOK_ID, &first),
            ("tx-2", &late, WEBHOOK_ID, &first),
            ("tx-3", &late, WEBHOOK_ID, &second),
        ],
        (-1, 1),
    );
    let runs = handler_runs_after(
        Backend::Sqlite,
        configured(&certificate),
        "paypal",
        &[
            delivery(("tx-1", &early), &signatures[0], PAYPAL_CERT_URL, &first),
            delivery(("tx-2", &late), &signatures[1], PAYPAL_CERT_URL, &first),
            delivery(("tx-3", &late), &signatures[2], PAYPAL_CERT_URL, &second),
        ],
    )
    .await;
    assert_eq!(runs, once_each("paypal", &["WH-R", "WH-S"]));
}
