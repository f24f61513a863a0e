//! The connection under a request's transaction ([`IdempotentTx`]): the layer keeps connections
//! between request transactions and lends them without a ping, so a connection that died idle
//! must cost no request, and a handler's own transaction on it must stay a savepoint of the
//! request's, as on a sqlx `Transaction`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{routing, Router};
use http::StatusCode;
use idempotency_key::{IdempotentTx, PgIdempotencyStore};
use sqlx::postgres::PgPoolOptions;
use sqlx::Connection;

use super::atomic::{created, insert_order, post_order};
use super::{http, layer, layer_on};
use crate::helpers::{order_rows, TestEnv};
use crate::helpers::{serve, wait_for};

/// A connection that died idle costs no request in the transactional mode: its `BEGIN` fails
/// having done nothing, and the layer begins once more on a connection from the pool. Both
/// places a request's transaction finds an idle connection: the connections the store keeps
/// between request transactions (a pool of 4 keeps one), and the pool itself, built without a
/// ping before each lend (`test_before_acquire(false)`, as the checkout example runs; a pool of 1
/// keeps none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_died_idle_costs_no_request_in_the_transactional_mode() {
    let env = TestEnv::new().await;
    for (pool_size, kept) in [(4, "kept by the store"), (1, "idle in the pool")] {
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .test_before_acquire(false)
            .connect(&env.url)
            .await
            .expect("pool without pings");
        // The handler says which connection its transaction ran on.
        let last_pid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        async fn in_tx(
            State(last_pid): State<Arc<std::sync::atomic::AtomicI32>>,
            mut tx: IdempotentTx,
            body: Bytes,
        ) -> Response {
            match sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await
            {
                Ok(pid) => last_pid.store(pid, Ordering::SeqCst),
                Err(e) => return created(Err(e)),
            }
            created(insert_order(&mut tx, &body).await)
        }
        let router = Router::new()
            .route("/orders", routing::post(in_tx))
            .layer(layer_on(PgIdempotencyStore::new(pool.clone())).build())
            .with_state(last_pid.clone());
        let addr = serve(router).await;
        let c = http();
        let before = post_order(&c, addr, &format!("k-before-{pool_size}")).await;
        assert_eq!(before.status, StatusCode::CREATED, "{}", before.body);
        // That connection, idle now (committed, and kept or back in the pool), is cut.
        let pid = last_pid.load(Ordering::SeqCst);
        let state_of = |pid: i32| {
            let pool = env.pool.clone();
            async move {
                sqlx::query_scalar::<_, Option<String>>(
                    "SELECT state FROM pg_stat_activity WHERE pid = $1",
                )
                .bind(pid)
                .fetch_optional(&pool)
                .await
                .expect("pg_stat_activity")
            }
        };
        wait_for(
            &format!("connection {pid} to be idle"),
            Duration::from_secs(10),
            || {
                let state = state_of(pid);
                async move { (state.await == Some(Some("idle".to_owned()))).then_some(()) }
            },
        )
        .await;
        let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&env.pool)
            .await
            .expect("terminate");
        assert!(cut);
        wait_for(
            &format!("backend {pid} to be gone"),
            Duration::from_secs(10),
            || {
                let state = state_of(pid);
                async move { state.await.is_none().then_some(()) }
            },
        )
        .await;
        let after = post_order(&c, addr, &format!("k-after-{pool_size}")).await;
        assert_eq!(after.status, StatusCode::CREATED, "{kept}: {}", after.body);
        assert_ne!(
            last_pid.load(Ordering::SeqCst),
            pid,
            "{kept}: another connection"
        );
        // Closing the pool takes back what the store keeps (it waits for every connection).
        tokio::time::timeout(Duration::from_secs(10), pool.close())
            .await
            .unwrap_or_else(|_| panic!("{kept}: the pool closes with connections kept"));
    }
    assert_eq!(order_rows(&env.pool).await, 4);
    env.cleanup().await;
}

/// A handler that opens a transaction of its own on the request's (a repository taking
/// `impl Acquire`, say) gets a savepoint: its commit keeps its writes inside the request's
/// transaction, so a result that gives the key back still rolls them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_transaction_is_a_savepoint_of_the_requests() {
    let env = TestEnv::new().await;
    async fn nested(mut tx: IdempotentTx, body: Bytes) -> Response {
        let mut inner = match (*tx).begin().await {
            Ok(inner) => inner,
            Err(e) => return created(Err(e)),
        };
        if let Err(e) = insert_order(&mut inner, &body).await {
            return created(Err(e));
        }
        if let Err(e) = inner.commit().await {
            return created(Err(e));
        }
        // A result that gives the key back: the request's transaction is rolled back.
        (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
    }
    let router = Router::new()
        .route("/orders", routing::post(nested))
        .layer(layer(&env).build());
    let addr = serve(router).await;
    let c = http();
    let answer = post_order(&c, addr, "k-nested").await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert_eq!(
        order_rows(&env.pool).await,
        0,
        "the inner commit released a savepoint, not the request's transaction"
    );
    // And the connection it ran on serves the next request cleanly.
    let next = post_order(&c, addr, "k-after-nested").await;
    assert_eq!(next.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(order_rows(&env.pool).await, 0);
    env.cleanup().await;
}
