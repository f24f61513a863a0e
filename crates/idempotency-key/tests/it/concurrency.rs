//! Concurrent requests with one key: while one runs, a duplicate is 409 (with `Retry-After`) and
//! another body 422; a hundred at once run once, with or without Redis; `drain` waits for a
//! request whose client went away.
use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;

use super::{app, http, layer, layer_with_redis, layer_with_redis_if, post, Reply};
use crate::helpers::wait_for;
use crate::helpers::{Counting, TestEnv};

/// While the first request runs, the same key with another body is 422 (not a 409 that
/// invites a retry of the wrong request) and the same request is 409 with `Retry-After`;
/// decided by the Redis lock when there is one, by PostgreSQL otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn while_a_request_runs_another_request_is_422_and_a_duplicate_409() {
    let env = TestEnv::new().await;
    for with_redis in [true, false] {
        let h = Counting::gated();
        let addr = app(&env, &h, layer_with_redis_if(&env, with_redis).build()).await;
        let c = http();
        let key = format!("running-{with_redis}");
        let first = {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move { post(&c, addr, Some(&key), None, r#"{"amount":100}"#).await })
        };
        wait_for("the first request to run", Duration::from_secs(10), || {
            let runs = h.runs();
            async move { (runs == 1).then_some(()) }
        })
        .await;

        let other = post(&c, addr, Some(&key), None, r#"{"amount":200}"#).await;
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "redis: {with_redis}"
        );
        assert_eq!(other.body["title"], "Idempotency-Key is already used");
        let duplicate = post(&c, addr, Some(&key), None, r#"{"amount":100}"#).await;
        assert_eq!(
            duplicate.status,
            StatusCode::CONFLICT,
            "redis: {with_redis}"
        );
        assert!(duplicate.header("retry-after").is_some());

        h.gate.as_ref().unwrap().add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!(h.runs(), 1);
    }
    env.cleanup().await;
}

/// A client that gives up does not cancel its request: it runs on detached, `drain` waits for
/// it at shutdown, and its result is stored for the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn drain_waits_for_a_request_whose_client_went_away() {
    let env = TestEnv::new().await;
    let h = Counting::gated();
    let layer = layer(&env).build();
    let addr = app(&env, &h, layer.clone()).await;
    let impatient = crate::helpers::http_client::Client::with_timeout(Duration::from_millis(300));
    let gave_up = impatient
        .post(format!("http://{addr}/orders"))
        .header("idempotency-key", "k-detached")
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#)
        .send()
        .await;
    assert!(
        gave_up.is_err(),
        "the client timed out while the handler was held"
    );
    assert_eq!(h.runs(), 1);

    assert!(
        !layer.drain(Duration::from_millis(200)).await,
        "the detached request is still running"
    );
    h.gate.as_ref().unwrap().add_permits(1);
    assert!(layer.drain(Duration::from_secs(10)).await);

    let retry = post(&http(), addr, Some("k-detached"), None, r#"{"amount":100}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the detached run stored its result");
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}

async fn hundred_at_once(env: &TestEnv, h: &Counting, addr: SocketAddr, key: &str) -> Vec<Reply> {
    let c = http();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let c = c.clone();
        let key = key.to_owned();
        set.spawn(async move { post(&c, addr, Some(&key), None, r#"{"amount":5}"#).await });
    }
    let mut replies = Vec::new();
    if let Some(gate) = &h.gate {
        // The one execution is held inside the handler: every other request must be refused.
        while replies.len() < 99 {
            // Bounded: a second execution would block on the gate, which must fail, not hang.
            let next = tokio::time::timeout(Duration::from_secs(60), set.join_next())
                .await
                .expect("a request hung: a second execution is waiting on the gate");
            replies.push(next.unwrap().unwrap());
        }
        gate.add_permits(1);
    }
    while let Some(r) = set.join_next().await {
        replies.push(r.unwrap());
    }
    let _ = env;
    replies
}

fn check_hundred(replies: &[Reply], h: &Counting) {
    assert_eq!(replies.len(), 100);
    assert_eq!(h.runs(), 1, "handler must run exactly once");
    let executed: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1);
    for r in replies {
        match r.status {
            StatusCode::CONFLICT => {
                let ra: u64 = r
                    .header("retry-after")
                    .expect("Retry-After on 409")
                    .parse()
                    .unwrap();
                assert!(ra >= 1);
                assert_eq!(
                    r.body["title"],
                    "A request is outstanding for this Idempotency-Key"
                );
            }
            StatusCode::CREATED => assert_eq!(r.body, executed[0].body),
            other => panic!("unexpected status {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn hundred_concurrent_requests_one_key_run_once() {
    let env = TestEnv::new().await;
    // PostgreSQL alone, the execution held open: 99 × 409, then the one 201.
    let h = Counting::gated();
    let addr = app(&env, &h, layer(&env).build()).await;
    let replies = hundred_at_once(&env, &h, addr, "k-100-pg").await;
    check_hundred(&replies, &h);
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.status == StatusCode::CONFLICT)
            .count(),
        99
    );

    // With Redis, free running: each answer is the execution, a 409 or the replay.
    let h = Counting::default();
    let addr = app(&env, &h, layer_with_redis(&env).build()).await;
    let replies = hundred_at_once(&env, &h, addr, "k-100-redis").await;
    check_hundred(&replies, &h);

    // Redis stopped: PostgreSQL decides, still once.
    #[cfg(feature = "redis")]
    {
        let h = Counting::default();
        let addr = app(&env, &h, layer(&env).redis(env.dead_redis()).build()).await;
        let replies = hundred_at_once(&env, &h, addr, "k-100-dead-redis").await;
        check_hundred(&replies, &h);
    }
    env.cleanup().await;
}
