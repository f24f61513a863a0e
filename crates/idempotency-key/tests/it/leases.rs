//! Leases and TTLs: a crashed request holds its key until its lease ends, then one retry runs; a
//! request whose lease was taken over can neither complete nor release; a running claim past
//! its TTL is neither taken over nor collected; a handler slower than its lease keeps its claim
//! (heartbeats); after the TTL a key executes again and expired rows are deleted.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use idempotency_key::test_util::{Claim, Ownership, StoreProtocol};
use idempotency_key::{Fingerprint, IdempotencyLayer, PgIdempotencyStore};

use super::{app, http, layer, layer_with_redis_if, post, stored};
use crate::helpers::wait_for;
use crate::helpers::{Counting, DoomedServer, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn after_the_ttl_a_key_executes_again_and_expired_rows_are_deleted() {
    let env = TestEnv::new().await;
    for with_redis in [false, true] {
        let h = Counting::default();
        let b = layer_with_redis_if(&env, with_redis).ttl(Duration::from_secs(1));
        let addr = app(&env, &h, b.build()).await;
        let c = http();
        let key = format!("k-ttl-{with_redis}");
        let first = post(&c, addr, Some(&key), None, "{}").await;
        assert_eq!(first.status, StatusCode::CREATED);
        // Within the TTL every answer is the replay; once it has passed, a new execution.
        let fresh = wait_for(
            "the key to execute again after its TTL",
            Duration::from_secs(20),
            || {
                let c = c.clone();
                let key = key.clone();
                async move {
                    let r = post(&c, addr, Some(&key), None, "{}").await;
                    assert_eq!(r.status, StatusCode::CREATED);
                    (!r.replayed()).then_some(r)
                }
            },
        )
        .await;
        assert_eq!(fresh.header("x-order-run"), Some("2"));
        assert_eq!(h.runs(), 2);
    }

    // Batch deletion: five expired keys, two per statement.
    let store = env.store();
    // A key of account `gc` claimed and completed, expiring 200 ms later.
    let completed_key = |k: String| {
        let store = store.clone();
        async move {
            let fp = Fingerprint([1; 32]);
            let (lease, ttl) = (Duration::from_secs(30), Duration::from_millis(200));
            let Claim::Acquired(t) = store.claim("gc", &k, &fp, lease, ttl).await.unwrap() else {
                panic!("claim")
            };
            store
                .complete("gc", &k, t, &stored(200, "x"))
                .await
                .unwrap();
        }
    };
    for i in 0..5 {
        completed_key(format!("gc-{i}")).await;
    }
    let gc_count = |expired_only: bool| {
        let pool = env.pool.clone();
        async move {
            let sql = if expired_only {
                "SELECT count(*) FROM dedup_worker.idempotency_keys WHERE account = 'gc' AND expires_at <= now()"
            } else {
                "SELECT count(*) FROM dedup_worker.idempotency_keys WHERE account = 'gc'"
            };
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    wait_for(
        "the five keys to expire",
        Duration::from_secs(20),
        || async { (gc_count(true).await == 5).then_some(()) },
    )
    .await;
    let deleted = store.delete_expired(2).await.unwrap();
    assert!(deleted >= 5, "all expired rows deleted, {deleted}");
    assert_eq!(gc_count(false).await, 0);

    // The spawnable background task does the same.
    for i in 0..3 {
        completed_key(format!("gc-task-{i}")).await;
    }
    let task = store.spawn_expiry_task(Duration::from_millis(100), 2);
    wait_for(
        "the expiry task to delete the expired rows",
        Duration::from_secs(20),
        || async { (gc_count(false).await == 0).then_some(()) },
    )
    .await;
    task.abort();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_crashed_request_holds_the_key_until_its_lease_ends_then_one_retry_runs() {
    let env = TestEnv::new().await;
    let lease = Duration::from_secs(5);
    let entered = Arc::new(AtomicU64::new(0));
    let e = entered.clone();
    let doomed = DoomedServer::start(env.url.clone(), move |pool| {
        let layer = IdempotencyLayer::builder(PgIdempotencyStore::new(pool))
            .lease(lease)
            .build();
        Router::new()
            .route(
                "/orders",
                axum::routing::post(move || {
                    let e = e.clone();
                    async move {
                        e.fetch_add(1, Ordering::SeqCst);
                        // Mid-handler when the process dies.
                        std::future::pending::<()>().await;
                        StatusCode::CREATED
                    }
                }),
            )
            .layer(layer)
    });
    let c = http();
    let doomed_addr = doomed.addr;
    let c2 = c.clone();
    let in_flight = tokio::spawn(async move {
        let _ = c2
            .post(format!("http://{doomed_addr}/orders"))
            .header("idempotency-key", "k-crash")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await;
    });
    wait_for(
        "the doomed server's handler to be entered",
        Duration::from_secs(20),
        || {
            let entered = entered.clone();
            async move { (entered.load(Ordering::SeqCst) == 1).then_some(()) }
        },
    )
    .await;
    doomed.kill();
    let _ = in_flight.await;

    // A healthy replica of the service, same database.
    let h = Counting::default();
    let addr = app(
        &env,
        &h,
        IdempotencyLayer::builder(env.store()).lease(lease).build(),
    )
    .await;
    let refused = post(&c, addr, Some("k-crash"), None, "{}").await;
    assert_eq!(
        refused.status,
        StatusCode::CONFLICT,
        "refused while the lease runs"
    );
    assert!(refused.header("retry-after").is_some());
    assert_eq!(h.runs(), 0);

    // Retry (as a client honouring Retry-After would) until the lease has lapsed.
    let done = wait_for(
        "the crashed request's lease to lapse",
        Duration::from_secs(30),
        || {
            let c = c.clone();
            async move {
                let r = post(&c, addr, Some("k-crash"), None, "{}").await;
                match r.status {
                    StatusCode::CONFLICT => {
                        assert!(r.header("retry-after").is_some());
                        None
                    }
                    _ => Some(r),
                }
            }
        },
    )
    .await;
    assert_eq!(done.status, StatusCode::CREATED);
    assert!(!done.replayed());
    assert_eq!(h.runs(), 1, "taken over by exactly one retry");
    let again = post(&c, addr, Some("k-crash"), None, "{}").await;
    assert!(again.replayed());
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_lease_was_taken_over_cannot_complete_or_release() {
    let env = TestEnv::new().await;
    let store = env.store();
    let fp = Fingerprint([9; 32]);
    let lease = Duration::from_millis(300);
    let ttl = Duration::from_secs(3600);
    let Claim::Acquired(old) = store.claim("a", "k", &fp, lease, ttl).await.unwrap() else {
        panic!("first claim")
    };
    // Another fingerprint never takes over, even after the lease (while the key's TTL runs).
    let other = Fingerprint([8; 32]);
    wait_for("the first claim's lease to lapse", Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let lapsed: bool = sqlx::query_scalar(
                "SELECT locked_until <= now() FROM dedup_worker.idempotency_keys WHERE account = 'a' AND key = 'k'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            lapsed.then_some(())
        }
    })
    .await;
    assert!(matches!(
        store.claim("a", "k", &other, lease, ttl).await.unwrap(),
        Claim::InProgress { fingerprint, .. } if fingerprint == fp
    ));
    let new = wait_for(
        "a claim of the key once its lease lapsed",
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move {
                match store.claim("a", "k", &fp, lease, ttl).await.unwrap() {
                    Claim::Acquired(t) => Some(t),
                    Claim::InProgress { .. } => None,
                    Claim::Completed { .. } => panic!("nothing completed"),
                }
            }
        },
    )
    .await;
    assert!(matches!(
        store.claim("a", "k", &other, lease, ttl).await.unwrap(),
        Claim::InProgress { fingerprint, .. } if fingerprint == fp
    ));
    assert_eq!(
        store
            .complete("a", "k", old, &stored(201, "old"))
            .await
            .unwrap(),
        Ownership::Lost
    );
    assert_eq!(store.release("a", "k", old).await.unwrap(), Ownership::Lost);
    assert!(matches!(
        store
            .complete("a", "k", new, &stored(201, "new"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
    match store.claim("a", "k", &fp, lease, ttl).await.unwrap() {
        Claim::Completed { response, .. } => assert_eq!(&response.body[..], b"new"),
        other => panic!("expected the new holder's result, got {other:?}"),
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_claim_past_its_ttl_is_neither_taken_over_nor_collected() {
    let env = TestEnv::new().await;
    let store = env.store();
    let fp = Fingerprint([7; 32]);
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_millis(200);
    let Claim::Acquired(token) = store.claim("a", "slow", &fp, lease, ttl).await.unwrap() else {
        panic!("first claim")
    };
    wait_for("the running claim's TTL to pass", Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let expired: bool = sqlx::query_scalar(
                "SELECT expires_at <= now() FROM dedup_worker.idempotency_keys WHERE account = 'a' AND key = 'slow'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            expired.then_some(())
        }
    })
    .await;
    for fingerprint in [fp, Fingerprint([6; 32])] {
        assert!(
            matches!(
                store
                    .claim("a", "slow", &fingerprint, lease, ttl)
                    .await
                    .unwrap(),
                Claim::InProgress { .. }
            ),
            "a live lease wins over an expired TTL"
        );
    }
    assert_eq!(
        store.delete_expired(100).await.unwrap(),
        0,
        "a running claim is not collected"
    );
    assert!(matches!(
        store
            .complete("a", "slow", token, &stored(201, "done"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_handler_slower_than_the_lease_keeps_its_claim() {
    let env = TestEnv::new().await;
    let h = Counting::gated();
    let lease = Duration::from_millis(600);
    let addr = app(&env, &h, layer(&env).lease(lease).build()).await;
    let c = http();
    let c2 = c.clone();
    let first = tokio::spawn(async move { post(&c2, addr, Some("k-slow"), None, "{}").await });
    let hh = h.clone();
    wait_for("the first request to run", Duration::from_secs(20), || {
        let hh = hh.clone();
        async move { (hh.runs() == 1).then_some(()) }
    })
    .await;
    // Wait (by PostgreSQL's clock) until the claim is older than three leases: only the
    // heartbeat of the live request can have kept it.
    wait_for("the claim to be older than three leases", Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let old: bool = sqlx::query_scalar(
                "SELECT now() - created_at > interval '1800 milliseconds' FROM dedup_worker.idempotency_keys WHERE key = 'k-slow'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            old.then_some(())
        }
    })
    .await;
    let second = post(&c, addr, Some("k-slow"), None, "{}").await;
    assert_eq!(
        second.status,
        StatusCode::CONFLICT,
        "a live request is never taken over"
    );
    assert_eq!(h.runs(), 1);
    h.gate.as_ref().unwrap().add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(post(&c, addr, Some("k-slow"), None, "{}").await.replayed());
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}
