//! What only the transactional mode promises: the handler's rows and the key's stored result are
//! one commit. A crash after the handler and before the result is stored leaves no row, so the
//! retry after the lease writes exactly one (the plain mode, shown beside it, writes two); a
//! result that gives the key back, a panic, a transaction kept past the handler, a commit that
//! fails and a lease taken over all commit nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::{Json, Router};
use http::StatusCode;
use idempotency_key::test_util::{FaultPoint, LayerFaults};
use idempotency_key::{IdempotencyLayer, IdempotentTx, PgIdempotencyStore};
use serde_json::json;
use sqlx::PgPool;

use super::{app, http, layer, post, Reply};
use crate::helpers::{order_rows, Counting, DoomedServer, TestEnv};
use crate::helpers::{serve, wait_for};

/// One row per execution into `layer_test_orders` (no unique key of its own): through the
/// request's transaction, or on its own connection as a plain handler writes.
fn one_row_router(pool: PgPool, transactional: bool, layer: IdempotencyLayer) -> Router {
    async fn in_tx(mut tx: IdempotentTx, body: Bytes) -> Response {
        let inserted = insert_order(&mut tx, &body).await;
        created(inserted)
    }
    async fn plain(State(pool): State<PgPool>, body: Bytes) -> Response {
        let inserted = match pool.acquire().await {
            Ok(mut conn) => insert_order(&mut conn, &body).await,
            Err(e) => Err(e),
        };
        created(inserted)
    }
    let route = if transactional {
        routing::post(in_tx)
    } else {
        routing::post(plain)
    };
    Router::new()
        .route("/orders", route)
        .layer(layer)
        .with_state(pool)
}

pub(super) async fn insert_order(
    conn: &mut sqlx::PgConnection,
    body: &[u8],
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO layer_test_orders (account, body) VALUES ('default', $1) RETURNING id",
    )
    .bind(String::from_utf8_lossy(body).into_owned())
    .fetch_one(conn)
    .await
}

pub(super) fn created(inserted: Result<i64, sqlx::Error>) -> Response {
    match inserted {
        Ok(id) => (StatusCode::CREATED, Json(json!({"order": id}))).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

pub(super) async fn post_order(
    c: &crate::helpers::http_client::Client,
    addr: std::net::SocketAddr,
    key: &str,
) -> Reply {
    post(c, addr, Some(key), None, r#"{"amount":4200}"#).await
}

/// The crash the mode exists for, in both modes: the handler has written its row and returned
/// 201, and the process dies before the result is stored. After the lease one retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_result_is_stored_leaves_one_row_in_the_transactional_mode() {
    let env = TestEnv::new().await;
    let lease = Duration::from_secs(2);
    let c = http();
    for transactional in [false, true] {
        let key = format!("k-crash-{transactional}");
        let before = order_rows(&env.pool).await;
        let reached = Arc::new(AtomicU64::new(0));
        let r = reached.clone();
        let doomed = DoomedServer::start(env.url.clone(), move |pool| {
            let layer = IdempotencyLayer::builder(PgIdempotencyStore::new(pool.clone()))
                .lease(lease)
                .fault_hook(move |point| {
                    let r = r.clone();
                    Box::pin(async move {
                        if point == FaultPoint::BeforeCompletion {
                            r.fetch_add(1, Ordering::SeqCst);
                            // The process dies here.
                            std::future::pending::<()>().await;
                        }
                    })
                })
                .build();
            one_row_router(pool, transactional, layer)
        });
        let (doomed_addr, c2, k2) = (doomed.addr, c.clone(), key.clone());
        let in_flight = tokio::spawn(async move {
            let _ = c2
                .post(format!("http://{doomed_addr}/orders"))
                .header("idempotency-key", k2)
                .header("content-type", "application/json")
                .body(r#"{"amount":4200}"#)
                .send()
                .await;
        });
        wait_for(
            "the handler to return and the layer to reach the completion",
            Duration::from_secs(20),
            || {
                let reached = reached.clone();
                async move { (reached.load(Ordering::SeqCst) == 1).then_some(()) }
            },
        )
        .await;
        let committed_before_the_crash = order_rows(&env.pool).await - before;
        doomed.kill();
        let _ = in_flight.await;

        // A healthy replica, same database: the retry is refused while the dead claim's lease
        // runs, then runs once.
        let layer = IdempotencyLayer::builder(env.store()).lease(lease).build();
        let addr = serve(one_row_router(env.pool.clone(), transactional, layer)).await;
        let done = wait_for(
            "the dead claim's lease to lapse",
            Duration::from_secs(30),
            || {
                let (c, key) = (c.clone(), key.clone());
                async move {
                    let r = post_order(&c, addr, &key).await;
                    (r.status != StatusCode::CONFLICT).then_some(r)
                }
            },
        )
        .await;
        assert_eq!(done.status, StatusCode::CREATED);
        assert!(!done.replayed());
        let again = post_order(&c, addr, &key).await;
        assert!(again.replayed());
        assert_eq!(again.body, done.body);
        let rows = order_rows(&env.pool).await - before;
        if transactional {
            assert_eq!(
                committed_before_the_crash, 0,
                "nothing commits before the result"
            );
            assert_eq!(rows, 1, "transactional mode: exactly one row");
        } else {
            // The plain mode's known gap, which the transactional mode closes: the handler's
            // own commit survived the crash, and the retry wrote a second row.
            assert_eq!(committed_before_the_crash, 1);
            assert_eq!(rows, 2, "plain mode: the handler ran twice");
        }
    }
    env.cleanup().await;
}

/// Results that give the key back roll the handler's writes back; kept results commit them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_kept_results_commit_the_handlers_writes() {
    let env = TestEnv::new().await;
    let h = Counting {
        transactional: true,
        ..Counting::default()
    };
    let addr = app(&env, &h, layer(&env).build()).await;
    let c = http();
    // 503 then 201: the first execution's row is rolled back, the retry's kept.
    let first = post(&c, addr, Some("k-fail"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(order_rows(&env.pool).await, 0);
    let retry = post(&c, addr, Some("k-fail"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(order_rows(&env.pool).await, 1);
    // NotExecuted: rolled back, key released.
    let invalid = post(&c, addr, Some("k-invalid"), None, r#"{"mode":"invalid"}"#).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert_eq!(order_rows(&env.pool).await, 1);
    assert_eq!(key_rows(&env.pool, "k-invalid").await, 0, "key released");
    // A 402 is an outcome: stored, with its row.
    let declined = post(&c, addr, Some("k-declined"), None, r#"{"mode":"declined"}"#).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(order_rows(&env.pool).await, 2);
    let replayed = post(&c, addr, Some("k-declined"), None, r#"{"mode":"declined"}"#).await;
    assert!(replayed.replayed());
    assert_eq!(order_rows(&env.pool).await, 2);
    assert_eq!(h.runs(), 4);
    env.cleanup().await;
}

pub(super) async fn key_rows(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedup_worker.idempotency_keys WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("count keys")
}

/// A handler that panics after writing, and one that keeps its transaction in a task of its
/// own past its end: nothing commits, 500, the key is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_or_a_transaction_kept_past_the_handler_commits_nothing() {
    let env = TestEnv::new().await;
    async fn misbehave(
        State(release): State<Arc<tokio::sync::Notify>>,
        mut tx: IdempotentTx,
        body: Bytes,
    ) -> Response {
        if let Err(e) = insert_order(&mut tx, &body).await {
            return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
        }
        if body.as_ref() == b"panic" {
            panic!("handler panics after its insert");
        }
        // Keeps the transaction beyond the handler's own future, until the test lets go.
        tokio::spawn(async move {
            release.notified().await;
            drop(tx);
        });
        StatusCode::CREATED.into_response()
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let router = Router::new()
        .route("/orders", routing::post(misbehave))
        .layer(layer(&env).build())
        .with_state(release.clone());
    let addr = serve(router).await;
    let c = http();
    for (key, body) in [("k-panic", "panic"), ("k-kept", "kept")] {
        let r = post(&c, addr, Some(key), None, body).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
        assert_eq!(key_rows(&env.pool, key).await, 0, "{body}: key released");
    }
    assert_eq!(
        order_rows(&env.pool).await,
        0,
        "nothing committed while kept"
    );
    release.notify_one();
    // The kept transaction is rolled back once its task drops it: no session of this database
    // is left inside a transaction, and no row was committed.
    wait_for(
        "the kept transaction to be rolled back",
        Duration::from_secs(20),
        || {
            let pool = env.pool.clone();
            async move {
                let open: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                (open == 0).then_some(())
            }
        },
    )
    .await;
    assert_eq!(order_rows(&env.pool).await, 0);
    env.cleanup().await;
}

/// A commit PostgreSQL refuses (a deferred constraint checked at COMMIT): 503 with
/// `Retry-After`, nothing committed, the key released; the retry runs once and is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_is_503_commits_nothing_and_the_retry_runs_once() {
    let env = TestEnv::new().await;
    for ddl in [
        "CREATE TABLE commit_checked (id BIGSERIAL PRIMARY KEY, ok BOOLEAN NOT NULL)",
        r#"CREATE FUNCTION refuse_not_ok() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NOT NEW.ok THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NULL; END $$"#,
        r#"CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON commit_checked
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_not_ok()"#,
    ] {
        sqlx::query(ddl).execute(&env.pool).await.expect("ddl");
    }
    let executions = Arc::new(AtomicU64::new(0));
    async fn checked(State(executions): State<Arc<AtomicU64>>, mut tx: IdempotentTx) -> StatusCode {
        // The first execution writes a row that only COMMIT refuses.
        let ok = executions.fetch_add(1, Ordering::SeqCst) > 0;
        match sqlx::query("INSERT INTO commit_checked (ok) VALUES ($1)")
            .bind(ok)
            .execute(&mut *tx)
            .await
        {
            Ok(_) => StatusCode::CREATED,
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    let router = Router::new()
        .route("/orders", routing::post(checked))
        .layer(layer(&env).build())
        .with_state(executions.clone());
    let addr = serve(router).await;
    let c = http();
    let refused = post(&c, addr, Some("k-commit"), None, "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.header("retry-after").is_some());
    assert!(!refused.replayed());
    assert_eq!(key_rows(&env.pool, "k-commit").await, 0, "key released");
    let retry = post(&c, addr, Some("k-commit"), None, "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    let replay = post(&c, addr, Some("k-commit"), None, "{}").await;
    assert!(replay.replayed());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM commit_checked")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    env.cleanup().await;
}

/// This process stalled past its lease and another request took the key over: the completion
/// matches no row, the transaction is rolled back, and the answer is 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_claim_was_taken_over_commits_nothing() {
    let env = TestEnv::new().await;
    let h = Counting {
        transactional: true,
        ..Counting::gated()
    };
    let addr = app(&env, &h, layer(&env).build()).await;
    let c = http();
    let c2 = c.clone();
    let running = tokio::spawn(async move { post(&c2, addr, Some("k-lost"), None, "{}").await });
    wait_for("the handler to run", Duration::from_secs(20), || async {
        (h.runs() == 1).then_some(())
    })
    .await;
    // The takeover, as a claim after a lapsed lease writes it: a new token.
    sqlx::query("UPDATE dedup_worker.idempotency_keys SET claim_token = gen_random_uuid() WHERE key = 'k-lost'")
        .execute(&env.pool)
        .await
        .unwrap();
    h.gate.as_ref().unwrap().add_permits(1);
    let lost = running.await.unwrap();
    assert_eq!(lost.status, StatusCode::CONFLICT);
    assert!(lost.header("retry-after").is_some());
    assert_eq!(order_rows(&env.pool).await, 0);
    let status: String =
        sqlx::query_scalar("SELECT status FROM dedup_worker.idempotency_keys WHERE key = 'k-lost'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(status, "in_progress", "the new holder's claim is untouched");
    env.cleanup().await;
}

/// `IdempotentTx` on a route the layer does not cover is a wiring mistake: 500, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_tx_without_the_layer_is_500() {
    async fn handler(_tx: IdempotentTx) -> StatusCode {
        StatusCode::CREATED
    }
    let addr = serve(Router::new().route("/orders", routing::post(handler))).await;
    let r = post(&http(), addr, Some("k"), None, "{}").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
}

/// Where keys are optional, a request without one still gets its transaction: committed with a
/// kept result, rolled back with a 5xx, and never stored or replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_the_transaction_commits_only_kept_results() {
    let env = TestEnv::new().await;
    let h = Counting {
        transactional: true,
        ..Counting::default()
    };
    let addr = app(&env, &h, layer(&env).key_required(false).build()).await;
    let c = http();
    for _ in 0..2 {
        let r = post(&c, addr, None, None, "{}").await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert!(!r.replayed());
    }
    let boom = post(&c, addr, None, None, r#"{"mode":"boom"}"#).await;
    assert_eq!(boom.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(order_rows(&env.pool).await, 2);
    assert_eq!(h.runs(), 3);
    env.cleanup().await;
}
