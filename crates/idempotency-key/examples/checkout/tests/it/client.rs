//! The double-charge timeline: a response lost on its way to the client, and the retrying
//! client's retry with the same key, charge once (the client's own tests are the layer
//! crate's).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::StatusCode;
use idempotency_key::{IdempotencyLayer, IdempotentClient, RetryPolicy};
use idempotency_key_checkout::{self as example, CheckoutState, PaymentRequest};
use serde_json::Value;

use crate::helpers::{serve, TestEnv};

/// Loses the first `n` responses on their way to the client: the handler has finished, the
/// status line goes out, then the body fails and the connection is cut.
#[derive(Clone)]
struct Lose(Arc<AtomicU64>);

async fn lose_response(State(lose): State<Lose>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let lost = lose
        .0
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !lost {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    let broken = futures::stream::once(async {
        Err::<axum::body::Bytes, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "response lost",
        ))
    });
    Response::from_parts(parts, Body::from_stream(broken))
}

fn quick_client() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
        max_retries: 6,
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
        max_retry_after: Duration::from_secs(2),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_charge_timeline_a_lost_response_and_a_retry_charge_once() {
    let env = TestEnv::new().await;
    let provider_lost = Arc::new(AtomicU64::new(1));
    let checkout_lost = Arc::new(AtomicU64::new(1));

    // The provider stub, itself behind the layer; its first response to checkout is lost too.
    let provider_layer = IdempotencyLayer::builder(env.store())
        .account(example::provider_account)
        .redis(env.redis())
        .build();
    let provider = example::provider_router(env.pool.clone(), provider_layer).layer(
        middleware::from_fn_with_state(Lose(provider_lost.clone()), lose_response),
    );
    let provider_addr = serve(provider).await;

    let checkout_layer = IdempotencyLayer::builder(env.store())
        .account(example::checkout_account)
        .redis(env.redis())
        .build();
    let state = CheckoutState {
        pool: env.pool.clone(),
        provider_url: format!("http://{provider_addr}"),
        client: quick_client(),
    };
    let checkout = example::checkout_router(state, checkout_layer).layer(
        middleware::from_fn_with_state(Lose(checkout_lost.clone()), lose_response),
    );
    let checkout_addr = serve(checkout).await;

    // The client: one key for the payment, retried with it.
    let client = quick_client();
    let pay = PaymentRequest {
        amount: 4200,
        currency: "eur".into(),
        source: "tok_visa".into(),
    };
    let url = format!("http://{checkout_addr}/v1/payments");
    let resp = client.post_json(&url, Some("acct_1"), &pay).await.unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    assert_eq!(resp.attempts, 2, "first response lost, retried once");
    assert!(resp.replayed(), "the retry got the stored payment");
    assert_eq!(
        provider_lost.load(Ordering::SeqCst),
        0,
        "provider response was lost once"
    );
    assert_eq!(
        checkout_lost.load(Ordering::SeqCst),
        0,
        "checkout response was lost once"
    );

    let http = reqwest::Client::new();
    let payments: Value = http
        .get(&url)
        .bearer_auth("acct_1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(payments["data"].as_array().unwrap().len(), 1, "one payment");
    assert_eq!(payments["data"][0]["idempotency_key"], resp.key.as_str());
    let charges: Value = http
        .get(format!("http://{provider_addr}/v1/charges"))
        .bearer_auth("acct_1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        charges["data"].as_array().unwrap().len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(charges["data"][0]["idempotency_key"], resp.key.as_str());
    assert_eq!(
        charges["data"][0]["executions"], 1,
        "the provider's charge code ran once: its layer replayed the retry"
    );

    // A second operation is a new key and a second charge; a declined card is final (402).
    let resp2 = client.post_json(&url, Some("acct_1"), &pay).await.unwrap();
    assert_eq!(resp2.status, StatusCode::CREATED);
    assert_ne!(resp2.key, resp.key);
    let declined = PaymentRequest {
        source: "tok_chargeDeclined".into(),
        ..pay.clone()
    };
    let d = client
        .post_json(&url, Some("acct_1"), &declined)
        .await
        .unwrap();
    assert_eq!(d.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(d.attempts, 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM provider_charges")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);
    // No bearer: refused before the layer.
    let r = http
        .post(&url)
        .header("idempotency-key", "x")
        .json(&pay)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    env.cleanup().await;
}
