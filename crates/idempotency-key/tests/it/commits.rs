//! A commit that did not commit is never reported stored (issue 36, item 5): the layer commits
//! only at the depth it began at, and a transaction PostgreSQL ends with `ROLLBACK` (a handler
//! swallowed an error in it) fails the request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::{routing, Router};
use http::StatusCode;
use idempotency_key::IdempotentTx;
use sqlx::Connection;

use super::atomic::{created, insert_order, key_rows, post_order};
use super::{http, layer, post, Reply};
use crate::helpers::serve;
use crate::helpers::{order_rows, TestEnv};

fn assert_problem(r: &Reply, what: &str) {
    assert!(
        r.status.is_server_error(),
        "{what}: {} {}",
        r.status,
        r.body
    );
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    assert!(!r.replayed(), "{what}");
}

/// The first execution leaves its own transaction open (a savepoint: depth 2 at the layer's
/// commit); later ones write as they should.
async fn leaks_its_transaction_once(
    State(executions): State<Arc<AtomicU64>>,
    mut tx: IdempotentTx,
    body: Bytes,
) -> Response {
    if executions.fetch_add(1, Ordering::SeqCst) > 0 {
        return created(insert_order(&mut tx, &body).await);
    }
    let mut inner = match (*tx).begin().await {
        Ok(inner) => inner,
        Err(e) => return created(Err(e)),
    };
    let inserted = insert_order(&mut inner, &body).await;
    // Neither committed nor rolled back: the savepoint stays open on the request's connection.
    std::mem::forget(inner);
    created(inserted)
}

/// A request whose transaction is at depth 2 when the layer commits it: `commit()` would only
/// release the savepoint. The request fails (5xx problem+json), nothing is stored, the key is
/// released, and the retry runs once and is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_at_the_wrong_depth_fails_the_request_and_releases_the_key() {
    let env = TestEnv::new().await;
    let executions = Arc::new(AtomicU64::new(0));
    let router = Router::new()
        .route("/orders", routing::post(leaks_its_transaction_once))
        .layer(layer(&env).build())
        .with_state(executions.clone());
    let addr = serve(router).await;
    let c = http();
    let leaked = post_order(&c, addr, "k-depth").await;
    assert_problem(&leaked, "a commit at depth 2");
    assert_eq!(order_rows(&env.pool).await, 0, "nothing committed");
    assert_eq!(key_rows(&env.pool, "k-depth").await, 0, "key released");
    let retry = post_order(&c, addr, "k-depth").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    let replay = post_order(&c, addr, "k-depth").await;
    assert!(replay.replayed());
    assert_eq!(order_rows(&env.pool).await, 1);
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    // Without a key, the same depth check.
    let keyless = Router::new()
        .route("/orders", routing::post(leaks_its_transaction_once))
        .layer(layer(&env).key_required(false).build())
        .with_state(Arc::new(AtomicU64::new(0)));
    let addr = serve(keyless).await;
    let leaked = post(&c, addr, None, None, "{}").await;
    assert_problem(&leaked, "a keyless commit at depth 2");
    assert_eq!(order_rows(&env.pool).await, 1, "nothing more committed");
    env.cleanup().await;
}

/// The handler's statement failed and it answered 201 anyway: its transaction is aborted, and
/// PostgreSQL answers the `COMMIT` with `ROLLBACK`. Keyed or not, the request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_answered_with_rollback_fails_the_request() {
    let env = TestEnv::new().await;
    async fn swallows(mut tx: IdempotentTx, body: Bytes) -> Response {
        let inserted = insert_order(&mut tx, &body).await;
        // The error is dropped: the transaction is aborted, the handler does not say so.
        let _ = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
        created(inserted)
    }
    let c = http();
    let keyless = Router::new()
        .route("/orders", routing::post(swallows))
        .layer(layer(&env).key_required(false).build());
    let addr = serve(keyless).await;
    let r = post(&c, addr, None, None, "{}").await;
    assert_problem(&r, "a keyless commit answered with ROLLBACK");
    let keyed = Router::new()
        .route("/orders", routing::post(swallows))
        .layer(layer(&env).build());
    let addr = serve(keyed).await;
    let r = post_order(&c, addr, "k-aborted").await;
    assert_problem(&r, "a keyed commit of an aborted transaction");
    assert_eq!(key_rows(&env.pool, "k-aborted").await, 0, "key released");
    assert_eq!(order_rows(&env.pool).await, 0);
    env.cleanup().await;
}
