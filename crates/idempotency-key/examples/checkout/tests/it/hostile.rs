//! Hostile input to the checkout example: deep JSON is a 4xx, not a crash; accounts PostgreSQL
//! cannot index are refused alone (a grouped claim the database refuses, called on the store
//! directly, is the layer crate's test).

use futures::stream::{self, StreamExt};
use idempotency_key_checkout::{CheckoutApp, CheckoutConfig, Limits};
use tokio_util::sync::CancellationToken;

use crate::helpers::{redis_url, TestEnv};

/// A 4 KB bearer token: random, so PostgreSQL cannot compress it into an index entry.
fn bearer_token_of_4kb() -> String {
    (0..128)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect()
}

/// The checkout example on port 0, on this test's database and Redis prefix.
async fn start(env: &TestEnv) -> (String, CancellationToken, tokio::task::JoinHandle<()>) {
    let app = CheckoutApp::build(CheckoutConfig {
        database_url: env.url.clone(),
        redis_url: Some(redis_url()),
        redis_prefix: env.prefix.clone(),
        listen: "127.0.0.1:0".into(),
        provider_listen: "127.0.0.1:0".into(),
        limits: Limits::default(),
        metrics: None,
    })
    .await
    .expect("checkout app");
    let url = format!("http://{}/v1/payments", app.addr().unwrap());
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        app.run(token).await.expect("checkout app run");
    });
    (url, shutdown, task)
}

async fn pay(client: &reqwest::Client, url: &str, account: &str, key: &str, body: Vec<u8>) -> u16 {
    client
        .post(url)
        .bearer_auth(account)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("an answer")
        .status()
        .as_u16()
}

fn payment() -> Vec<u8> {
    br#"{"amount": 1999, "currency": "usd"}"#.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_500000_deep_is_a_4xx_and_payments_go_on() {
    let env = TestEnv::new().await;
    let (url, shutdown, task) = start(&env).await;
    let client = reqwest::Client::new();
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
    let objects =
        |depth: usize| format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth)).into_bytes();
    for (key, body) in [
        ("arrays-10000", nested(10_000)),
        ("arrays-500000", nested(500_000)),
        ("objects-100000", objects(100_000)),
    ] {
        let status = pay(&client, &url, "acct_deep", key, body).await;
        // Not 400 for the key, which is valid: the handler's own 4xx for a body that is no
        // payment (or its refusal to parse that deep).
        assert!(
            (400..500).contains(&status) && status != 400,
            "{key}: {status}"
        );
    }
    // Still serving, and a retry of the deep request replays its stored 4xx.
    assert_eq!(
        pay(&client, &url, "acct_deep", "normal", payment()).await,
        201
    );
    let status = pay(&client, &url, "acct_deep", "arrays-500000", nested(500_000)).await;
    assert!((400..500).contains(&status) && status != 400, "{status}");
    let listed: serde_json::Value = client
        .get(&url)
        .bearer_auth("acct_deep")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1));
    shutdown.cancel();
    task.await.unwrap();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_4kb_accounts_are_refused_and_300_payments_beside_them_succeed() {
    let env = TestEnv::new().await;
    let (url, shutdown, task) = start(&env).await;
    let client = reqwest::Client::new();
    let huge = bearer_token_of_4kb();
    let mut requests: Vec<(bool, String, String)> = (0..300)
        .map(|i| (true, format!("acct_{}", i % 10), format!("pay-{i}")))
        .collect();
    for i in 0..40 {
        requests.insert(i * 7, (false, format!("{huge}{i}"), format!("huge-{i}")));
    }
    let answers: Vec<(bool, u16)> = stream::iter(requests)
        .map(|(normal, account, key)| {
            let (client, url) = (client.clone(), url.clone());
            async move { (normal, pay(&client, &url, &account, &key, payment()).await) }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let refused = answers.iter().filter(|(normal, _)| !normal).count();
    assert_eq!(refused, 40);
    for (normal, status) in &answers {
        if *normal {
            assert_eq!(*status, 201, "a payment failed beside an oversized account");
        } else {
            assert_eq!(*status, 401);
        }
    }
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM checkout_payments")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(payments, 300);
    shutdown.cancel();
    task.await.unwrap();
    env.cleanup().await;
}
