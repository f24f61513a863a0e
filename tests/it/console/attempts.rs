//! A delivery retried three times, then delivered: its event page lists every attempt in order
//! with its status, the start of the receiver's answer, the answer's headers (a cookie
//! `[redacted]`) and the destination as shown; a re-send from the page adds the operator's entry
//! and a fifth attempt, the first four unchanged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::post;
use axum::Router;
use dedup_worker::Service;
use serde_json::json;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event};
use crate::helpers::{serve, wait_for, Backend, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_deliverys_page_lists_every_attempt_with_status_and_response_excerpt_postgres() {
    a_retried_deliverys_page_lists_every_attempt_with_status_and_response_excerpt(
        Backend::Postgres,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_deliverys_page_lists_every_attempt_with_status_and_response_excerpt_sqlite() {
    a_retried_deliverys_page_lists_every_attempt_with_status_and_response_excerpt(Backend::Sqlite)
        .await;
}

/// A receiver answering 500 three times (`{"error":"boom N"}`, `X-Request-Id: req_N`, a
/// session cookie), then 200 (`{"id":"rcpt_N"}`) to every later request. Its URL carries a token
/// in its path, which the page must not show.
async fn receiver() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let router = Router::new().route(
        "/hook/S3CRET",
        post(move || {
            let calls = counted.clone();
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let mut headers = HeaderMap::new();
                headers.insert(
                    "x-request-id",
                    HeaderValue::from_str(&format!("req_{n}")).unwrap(),
                );
                headers.insert("set-cookie", HeaderValue::from_static("s=SECRET_SESSION"));
                if n <= 3 {
                    let body = format!(r#"{{"error":"boom {n}"}}"#);
                    (StatusCode::INTERNAL_SERVER_ERROR, headers, body)
                } else {
                    (StatusCode::OK, headers, format!(r#"{{"id":"rcpt_{n}"}}"#))
                }
            }
        }),
    );
    let addr = serve(router).await;
    (format!("http://{addr}/hook/S3CRET"), calls)
}

/// The attempts' items as their text, and their inner HTML (headers sit in a closed details).
async fn attempts(browser: &Browser) -> Vec<(String, String)> {
    let mut items = Vec::new();
    for item in browser.find_all("ol#attempts > li").await {
        let text = item.text().await.unwrap_or_default();
        let html = item.html(true).await.unwrap_or_default();
        items.push((text, html));
    }
    items
}

async fn a_retried_deliverys_page_lists_every_attempt_with_status_and_response_excerpt(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let (url, calls) = receiver().await;
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(url)),
            ("outbox.retry_base", json!("50ms")),
            ("outbox.retry_max", json!("100ms")),
            ("outbox.max_attempts", json!(10)),
            ("outbox.breaker.failures", json!(0)),
            ("outbox.breaker.window", json!(0)),
        ],
        Service::new(),
    )
    .await;
    let id = "evt_attempts_1";
    post_event(&app, id, "invoice.paid").await;
    wait_for("the delivery dispatched after 3 failures", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1).then_some(())
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    let browser = Browser::start().await;
    let page = format!("/events/stripe/{id}");
    log_in(&browser, &app, &page).await;
    let first = attempts(&browser).await;
    let texts: Vec<&str> = first.iter().map(|(text, _)| text.as_str()).collect();
    assert_eq!(first.len(), 4, "{texts:#?}");
    for (n, (text, html)) in first.iter().take(3).enumerate() {
        let n = n + 1;
        assert!(text.contains(&format!("attempt {n}: failed")), "{text}");
        assert!(text.contains("HTTP 500"), "{text}");
        assert!(
            text.contains(&format!(r#"{{"error":"boom {n}"}}"#)),
            "{text}"
        );
        assert!(html.contains(&format!("req_{n}")), "{html}");
    }
    let (delivered, delivered_html) = &first[3];
    assert!(delivered.contains("attempt 4: delivered"), "{delivered}");
    assert!(delivered.contains("HTTP 200"), "{delivered}");
    assert!(delivered.contains(r#"{"id":"rcpt_4"}"#), "{delivered}");
    assert!(delivered_html.contains("req_4"), "{delivered_html}");
    for (text, html) in &first {
        assert!(html.contains("[redacted]"), "{html}");
        assert!(!html.contains("SECRET_SESSION"), "{html}");
        assert!(!html.contains("S3CRET"), "the URL's token: {html}");
        assert!(text.contains("/hook/…"), "the shown destination: {text}");
    }
    browser.screenshot("event-attempts").await;

    // A re-send from the page (confirmed where the page asks first).
    browser.click_and_wait("form.resend button").await;
    for confirm in ["form#confirm button#confirm", "button[name=confirm]"] {
        if browser.has(confirm).await {
            browser.click_and_wait(confirm).await;
            break;
        }
    }
    wait_for(
        "the re-send recorded and delivered (6 entries)",
        WAIT,
        || async {
            let report = app
                .store
                .reads()
                .attempts_of("stripe", id, 0, 20)
                .await
                .ok()?;
            (report.len() == 6).then_some(())
        },
    )
    .await;
    browser.goto(&app.admin_url(&page)).await;
    let after = attempts(&browser).await;
    assert_eq!(after.len(), 6, "{after:#?}");
    assert_eq!(&after[..4], &first[..], "the first four unchanged");
    let (operator, _) = &after[4];
    assert!(operator.contains("resend"), "{operator}");
    assert!(operator.contains("console"), "who: {operator}");
    let (fifth, _) = &after[5];
    assert!(fifth.contains("attempt 1: delivered"), "{fifth}");
    assert!(fifth.contains(r#"{"id":"rcpt_5"}"#), "{fifth}");
    browser.close().await;
}
