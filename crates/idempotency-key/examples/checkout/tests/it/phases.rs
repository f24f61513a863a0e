//! Recovery points through the checkout example: the checkout killed between each pair of its
//! phases (after the payment's record, after the provider's answer, before the stored response),
//! then retried by the client helper with the same key against a healthy replica: one payment,
//! one provider charge that ran once, and the same final response, each time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idempotency_key::test_util::{FaultPoint, LayerFaults, StoreProtocol};
use idempotency_key::{
    IdempotencyKey, IdempotencyLayer, IdempotentClient, PgIdempotencyStore, RetryPolicy,
};
use idempotency_key_checkout::{
    self as example, checkout_account, checkout_router, CheckoutState, PaymentRequest,
};
use serde_json::{json, Value};

use crate::helpers::{serve, wait_for, DoomedServer, TestEnv};

/// Retries long enough to outlast the dead request's lease (2 s here).
fn patient_client() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
        max_retries: 30,
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(500),
        max_retry_after: Duration::from_secs(1),
    })
}

fn checkout_layer(store: PgIdempotencyStore, lease: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder(store)
        .account(checkout_account)
        .lease(lease)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkout_killed_between_any_two_phases_charges_once_and_answers_the_same() {
    let env = TestEnv::new().await;
    let lease = Duration::from_secs(2);
    // The provider stays up throughout, behind its own layer (its keys under "provider/…").
    let provider_layer = IdempotencyLayer::builder(env.store())
        .account(example::provider_account)
        .build();
    let provider = serve(example::provider_router(env.pool.clone(), provider_layer)).await;
    let provider_url = format!("http://{provider}");
    let pay = PaymentRequest {
        amount: 4200,
        currency: "eur".into(),
        source: "tok_visa".into(),
    };
    let points = [
        FaultPoint::PhaseCommitted("create_payment".into()),
        // The charge's outcome rides the final commit (`finish_with_response`): after the
        // provider answered, nothing is committed before the stored response.
        FaultPoint::PhaseRan("charge_provider".into()),
        FaultPoint::BeforeCompletion,
    ];
    for (n, point) in points.into_iter().enumerate() {
        let account = format!("acct_kill_{n}");
        let key = IdempotencyKey::new(format!("pay-kill-{n}")).unwrap();
        let reached = Arc::new(AtomicU64::new(0));
        let (r, url, p) = (reached.clone(), provider_url.clone(), point.clone());
        let doomed = DoomedServer::start(env.url.clone(), move |pool| {
            let layer = IdempotencyLayer::builder(PgIdempotencyStore::new(pool.clone()))
                .account(checkout_account)
                .lease(lease)
                .fault_hook(move |at| {
                    let (r, p) = (r.clone(), p.clone());
                    Box::pin(async move {
                        if at == p {
                            r.fetch_add(1, Ordering::SeqCst);
                            // The process dies here.
                            std::future::pending::<()>().await;
                        }
                    })
                })
                .build();
            let state = CheckoutState {
                pool,
                provider_url: url,
                client: IdempotentClient::new(reqwest::Client::new()),
            };
            checkout_router(state, layer)
        });
        let doomed_url = format!("http://{}/v1/payments", doomed.addr);
        let (a, k, body) = (account.clone(), key.clone(), pay.clone());
        let in_flight = tokio::spawn(async move {
            // One attempt: the process dies under it.
            let once = IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
                max_retries: 0,
                ..RetryPolicy::default()
            });
            let _ = once
                .post_json_with_key(&doomed_url, Some(&a), &body, &k)
                .await;
        });
        wait_for(
            &format!("the checkout to reach {point:?}"),
            Duration::from_secs(20),
            || {
                let reached = reached.clone();
                async move { (reached.load(Ordering::SeqCst) == 1).then_some(()) }
            },
        )
        .await;
        doomed.kill();
        let _ = in_flight.await;

        // A healthy replica; the client helper retries with the same key until the dead
        // request's lease lapses and the retry resumes after its last recorded phase.
        let state = CheckoutState {
            pool: env.pool.clone(),
            provider_url: provider_url.clone(),
            client: IdempotentClient::new(reqwest::Client::new()),
        };
        let healthy = serve(checkout_router(state, checkout_layer(env.store(), lease))).await;
        let url = format!("http://{healthy}/v1/payments");
        let client = patient_client();
        let done = client
            .post_json_with_key(&url, Some(&account), &pay, &key)
            .await
            .unwrap_or_else(|e| panic!("{point:?}: the retry failed: {e}"));
        assert_eq!(done.status, StatusCode::CREATED, "{point:?}");
        let body: Value = done.json().unwrap();

        let (payment_id, status): (i64, String) =
            sqlx::query_as("SELECT id, status FROM checkout_payments WHERE account = $1")
                .bind(&account)
                .fetch_one(&env.pool)
                .await
                .unwrap_or_else(|e| panic!("{point:?}: exactly one payment: {e}"));
        let payments: i64 =
            sqlx::query_scalar("SELECT count(*) FROM checkout_payments WHERE account = $1")
                .bind(&account)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert_eq!(payments, 1, "{point:?}: one payment");
        assert_eq!(status, "succeeded", "{point:?}");
        let (charge_id, executions): (i64, i32) =
            sqlx::query_as("SELECT id, executions FROM provider_charges WHERE merchant = $1")
                .bind(&account)
                .fetch_one(&env.pool)
                .await
                .unwrap_or_else(|e| panic!("{point:?}: exactly one charge: {e}"));
        let charges: i64 =
            sqlx::query_scalar("SELECT count(*) FROM provider_charges WHERE merchant = $1")
                .bind(&account)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        assert_eq!(charges, 1, "{point:?}: one provider charge");
        assert_eq!(executions, 1, "{point:?}: the provider's charge ran once");
        assert_eq!(
            body,
            json!({"id": format!("pay_{payment_id}"), "amount": 4200, "currency": "eur",
                   "charge": format!("ch_{charge_id}"), "status": "succeeded"}),
            "{point:?}: the response names the one payment and the one charge"
        );
        let again = client
            .post_json_with_key(&url, Some(&account), &pay, &key)
            .await
            .unwrap();
        assert!(again.replayed(), "{point:?}");
        assert_eq!(
            again.json::<Value>().unwrap(),
            body,
            "{point:?}: the same answer"
        );
    }
    env.cleanup().await;
}

/// A 5xx gives the key back with its progress: the provider failing once makes the checkout
/// answer 502 after its payment row was recorded, and the client helper's retry resumes at the
/// charge instead of writing a second payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_key_keeps_its_recorded_phases_and_the_retry_resumes() {
    let env = TestEnv::new().await;
    let failures = Arc::new(AtomicU64::new(1));
    let provider_layer = IdempotencyLayer::builder(env.store())
        .account(example::provider_account)
        .build();
    let f = failures.clone();
    let provider = example::provider_router(env.pool.clone(), provider_layer).layer(
        axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let f = f.clone();
                async move {
                    if f.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        return axum::response::IntoResponse::into_response(
                            StatusCode::SERVICE_UNAVAILABLE,
                        );
                    }
                    next.run(req).await
                }
            },
        ),
    );
    let provider = serve(provider).await;
    let state = CheckoutState {
        pool: env.pool.clone(),
        provider_url: format!("http://{provider}"),
        // The checkout's own provider calls do not retry: the first failure reaches our client.
        client: IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }),
    };
    let checkout = serve(checkout_router(
        state,
        checkout_layer(env.store(), Duration::from_secs(30)),
    ))
    .await;
    let pay = PaymentRequest {
        amount: 990,
        currency: "eur".into(),
        source: "tok_visa".into(),
    };
    let done = patient_client()
        .post_json(
            &format!("http://{checkout}/v1/payments"),
            Some("acct_resume"),
            &pay,
        )
        .await
        .unwrap();
    assert_eq!(done.status, StatusCode::CREATED);
    assert_eq!(done.attempts, 2, "a 502, then the resumed retry");
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    let payments: i64 =
        sqlx::query_scalar("SELECT count(*) FROM checkout_payments WHERE account = 'acct_resume'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(payments, 1, "the retry resumed after the recorded payment");
    env.cleanup().await;
}

/// A first payment reads no recorded phases (its claim created the key, so nothing is recorded
/// under it) and commits the charge's outcome with the response: the checkout's store sends the
/// grouped claim, the payment's record and the completion, nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_payment_reads_no_records_and_records_the_charge_with_the_response() {
    let env = TestEnv::new().await;
    let provider_layer = IdempotencyLayer::builder(env.store())
        .account(example::provider_account)
        .build();
    let provider = serve(example::provider_router(env.pool.clone(), provider_layer)).await;
    let store = env.store();
    let state = CheckoutState {
        pool: env.pool.clone(),
        provider_url: format!("http://{provider}"),
        client: IdempotentClient::new(reqwest::Client::new()),
    };
    let checkout = serve(checkout_router(
        state,
        checkout_layer(store.clone(), Duration::from_secs(30)),
    ))
    .await;
    let pay = PaymentRequest {
        amount: 4200,
        currency: "eur".into(),
        source: "tok_visa".into(),
    };
    let before = store.query_count();
    let done = IdempotentClient::new(reqwest::Client::new())
        .post_json(
            &format!("http://{checkout}/v1/payments"),
            Some("acct_first"),
            &pay,
        )
        .await
        .unwrap();
    assert_eq!(done.status, StatusCode::CREATED);
    assert_eq!(
        store.query_count() - before,
        3,
        "the grouped claim, the payment's record, the completion with the charge"
    );
    env.cleanup().await;
}
