//! A key replays its stored response and runs once; reuse with another body is 422; key forms
//! and accounts; what is stored (a declined card) and what is not (5xx, 429, a refusal marked
//! `NotExecuted`); an oversized body claims nothing.
use http::StatusCode;
use idempotency_key::ErrorStyle;

use super::{app, http, layer, layer_with_redis, layer_with_redis_if, post};
use crate::helpers::{Counting, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn same_key_same_body_replays_status_headers_body_and_runs_once() {
    let env = TestEnv::new().await;
    for with_redis in [false, true] {
        let h = Counting::default();
        let addr = app(&env, &h, layer_with_redis_if(&env, with_redis).build()).await;
        let c = http();
        let key = format!("same-{with_redis}");
        let first = post(
            &c,
            addr,
            Some(&key),
            None,
            r#"{"amount":100,"currency":"eur","meta":{"a":1,"b":2}}"#,
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.replayed());
        // Same JSON, other key order and whitespace: the same request.
        let second = post(
            &c,
            addr,
            Some(&key),
            None,
            "{ \"meta\": {\"b\":2, \"a\":1}, \"currency\": \"eur\",\n \"amount\": 100 }",
        )
        .await;
        assert_eq!(second.status, StatusCode::CREATED);
        assert!(second.replayed(), "second request must be a replay");
        assert_eq!(second.body, first.body);
        assert_eq!(second.header("location"), first.header("location"));
        assert_eq!(second.header("x-order-run"), Some("1"));
        assert_eq!(second.header("content-type"), Some("application/json"));
        assert!(
            second.header("date").is_some(),
            "date is regenerated, not replayed"
        );
        assert_eq!(h.runs(), 1, "handler ran once");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn same_key_different_body_is_422_and_stored_result_is_untouched() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer_with_redis(&env).build()).await;
    let c = http();
    let first = post(&c, addr, Some("k-reuse"), None, r#"{"amount":100}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);

    let other = post(&c, addr, Some("k-reuse"), None, r#"{"amount":200}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(other.body["title"], "Idempotency-Key is already used");
    assert_eq!(other.body["status"], 422);

    // Also decided by PostgreSQL alone (Redis emptied).
    env.flush_redis().await;
    let other = post(&c, addr, Some("k-reuse"), None, r#"{"amount":200}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);

    let again = post(&c, addr, Some("k-reuse"), None, r#"{"amount":100}"#).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(
        again.body, first.body,
        "stored result untouched by the refused reuse"
    );
    assert_eq!(h.runs(), 1);

    // Stripe-compatible error style.
    let h2 = Counting::default();
    let addr2 = app(
        &env,
        &h2,
        layer(&env)
            .error_style(ErrorStyle::Stripe)
            .account(|_| Some("stripe-style".into()))
            .build(),
    )
    .await;
    post(&c, addr2, Some("k-s"), None, r#"{"amount":1}"#).await;
    let r = post(&c, addr2, Some("k-s"), None, r#"{"amount":2}"#).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["error"]["type"], "idempotency_error");
    assert!(r.body["error"]["message"].as_str().is_some());
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn key_presence_length_and_forms() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).build()).await;
    let c = http();

    let missing = post(&c, addr, None, None, "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.body["title"], "Idempotency-Key is missing");

    let long = "k".repeat(256);
    let r = post(&c, addr, Some(&long), None, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let max = "k".repeat(255);
    let r = post(&c, addr, Some(&max), None, "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = post(&c, addr, Some(&max), None, "{}").await;
    assert!(r.replayed());

    // Quoted sf-string (IETF) and bare token (Stripe) are one key.
    let quoted = post(
        &c,
        addr,
        Some("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""),
        None,
        "{}",
    )
    .await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    assert!(!quoted.replayed());
    let bare = post(
        &c,
        addr,
        Some("8e03978e-40d5-43e8-bc93-6894a57f9324"),
        None,
        "{}",
    )
    .await;
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);

    // Not visible ASCII, and the header twice: 400.
    let r = post(&c, addr, Some("has space"), None, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = c
        .post(format!("http://{addr}/orders"))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(h.runs(), 2);

    // GET is not covered: no key needed, never replayed.
    let g = c.get(format!("http://{addr}/orders")).send().await.unwrap();
    assert_eq!(g.status(), StatusCode::OK);
    assert!(g.headers().get("idempotent-replayed").is_none());

    // Optional keys: requests without one pass straight through.
    let h2 = Counting::default();
    let addr2 = app(&env, &h2, layer(&env).key_required(false).build()).await;
    assert_eq!(
        post(&c, addr2, None, None, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        post(&c, addr2, None, None, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(h2.runs(), 2);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn same_key_under_two_accounts_is_two_requests() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer_with_redis(&env).build()).await;
    let c = http();
    let a = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_a"),
        r#"{"amount":1}"#,
    )
    .await;
    let b = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_b"),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_ne!(a.body, b.body);
    assert_eq!(h.runs(), 2);
    let a2 = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_a"),
        r#"{"amount":1}"#,
    )
    .await;
    let b2 = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_b"),
        r#"{"amount":1}"#,
    )
    .await;
    assert!(a2.replayed() && b2.replayed());
    assert_eq!(a2.body["account"], "acct_a");
    assert_eq!(b2.body["account"], "acct_b");
    assert_eq!(h.runs(), 2);
    // A caller the extractor cannot identify is refused, never pooled with others.
    let anonymous = post(
        &c,
        addr,
        Some("shared-key"),
        Some("none"),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(h.runs(), 2);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn declined_402_is_replayed_and_5xx_releases_the_key() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer_with_redis(&env).build()).await;
    let c = http();

    let d1 = post(&c, addr, Some("k-402"), None, r#"{"mode":"declined"}"#).await;
    assert_eq!(d1.status, StatusCode::PAYMENT_REQUIRED);
    let d2 = post(&c, addr, Some("k-402"), None, r#"{"mode":"declined"}"#).await;
    assert_eq!(d2.status, StatusCode::PAYMENT_REQUIRED);
    assert!(d2.replayed(), "a declined card stays declined");
    assert_eq!(d2.body, d1.body);
    assert_eq!(h.runs(), 1);

    let f1 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(f1.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!f1.replayed());
    let f2 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(f2.status, StatusCode::CREATED, "the retry executes");
    assert!(!f2.replayed());
    assert_eq!(h.runs(), 3);
    let f3 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert!(f3.replayed());
    assert_eq!(h.runs(), 3);

    // 429 (like 408, 409 and 425) says "not now", not "this is the outcome": not stored.
    let t1 = post(&c, addr, Some("k-429"), None, r#"{"mode":"busy_once"}"#).await;
    assert_eq!(t1.status, StatusCode::TOO_MANY_REQUESTS);
    let t2 = post(&c, addr, Some("k-429"), None, r#"{"mode":"busy_once"}"#).await;
    assert_eq!(
        t2.status,
        StatusCode::CREATED,
        "the retry after a 429 executes"
    );
    assert!(!t2.replayed());
    assert_eq!(h.runs(), 5);

    // A refusal the handler marks `NotExecuted` (failed validation) is not stored either: the
    // client corrects the request and retries with the same key.
    let v1 = post(&c, addr, Some("k-invalid"), None, r#"{"mode":"invalid"}"#).await;
    assert_eq!(v1.status, StatusCode::BAD_REQUEST);
    let v2 = post(&c, addr, Some("k-invalid"), None, r#"{"amount":100}"#).await;
    assert_eq!(
        v2.status,
        StatusCode::CREATED,
        "the corrected request executes"
    );
    assert!(!v2.replayed());
    assert_eq!(h.runs(), 7);

    // keep_5xx: Stripe's behaviour, the 500 is replayed.
    let h2 = Counting::default();
    let addr2 = app(
        &env,
        &h2,
        layer(&env)
            .keep_5xx(true)
            .account(|_| Some("keep".into()))
            .build(),
    )
    .await;
    let b1 = post(&c, addr2, Some("k-keep"), None, r#"{"mode":"boom"}"#).await;
    assert_eq!(b1.status, StatusCode::INTERNAL_SERVER_ERROR);
    let b2 = post(&c, addr2, Some("k-keep"), None, r#"{"mode":"boom"}"#).await;
    assert_eq!(b2.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(b2.replayed());
    assert_eq!(h2.runs(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn an_oversized_body_is_413_and_nothing_runs() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).max_body_bytes(64).build()).await;
    let c = http();
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100));
    let r = post(&c, addr, Some("k-big"), None, &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(h.runs(), 0);
    // Nothing was claimed: the key is still free for a request that fits.
    let ok = post(&c, addr, Some("k-big"), None, "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert!(!ok.replayed());
    env.cleanup().await;
}
