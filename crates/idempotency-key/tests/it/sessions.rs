//! What a connection the store keeps between request transactions carries from one request to
//! the next (issue 36, items 3 and 4): nothing of a handler's session (settings, role, listens,
//! advisory locks, temporary tables, held cursors), the pool's own setup kept; and no waiter on
//! the pool goes without a connection while one sits kept.

use std::time::Duration;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::{routing, Json, Router};
use http::StatusCode;
use idempotency_key::{IdempotentTx, PgIdempotencyStore};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

use super::{http, layer_on, post};
use crate::helpers::TestEnv;
use crate::helpers::{serve, wait_for};

/// What the pool's `after_connect` sets, as dedup-db's `put_schema_first` does: the reset of a
/// kept connection must restore it, not wipe it.
const HOOK_SEARCH_PATH: &str = "public, dedup_worker";

/// A pool of 4 (the store keeps at most one connection), no ping before a lend, and an
/// `after_connect` hook that sets the search path.
async fn hooked_pool(url: &str) -> PgPool {
    hooked_pool_of(url, 4).await
}

/// [`hooked_pool`] of `size` connections (the store keeps a quarter of them).
async fn hooked_pool_of(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(2))
        .test_before_acquire(false)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(&*format!("SET search_path = {HOOK_SEARCH_PATH}"))
                    .await
                    .map(|_| ())
            })
        })
        .connect(url)
        .await
        .expect("pool")
}

/// `POST /orders` on [`tenant_handler`], behind the layer on `pool` (keys optional).
fn tenant_router(pool: &PgPool) -> Router {
    Router::new()
        .route("/orders", routing::post(tenant_handler))
        .layer(
            layer_on(PgIdempotencyStore::new(pool.clone()))
                .key_required(false)
                .build(),
        )
}

/// The session as a request's transaction sees it.
async fn session(tx: &mut IdempotentTx) -> Result<Value, sqlx::Error> {
    let row: (i32, String, String, String, String, i64, i64, i64, bool) = sqlx::query_as(
        "SELECT pg_backend_pid(), coalesce(current_setting('app.tenant', true), ''),
                current_user::text, current_setting('search_path'),
                current_setting('statement_timeout'),
                (SELECT count(*) FROM pg_locks
                  WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
                (SELECT count(*) FROM pg_listening_channels()),
                (SELECT count(*) FROM pg_cursors),
                to_regclass('pg_temp.tenant_scratch') IS NOT NULL",
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(json!({
        "pid": row.0, "tenant": row.1, "user": row.2, "search_path": row.3,
        "statement_timeout": row.4, "advisory_locks": row.5, "listening": row.6,
        "cursors": row.7, "temp_table": row.8,
    }))
}

/// Reports the session, then (body `dirty`) leaves in it everything a handler can leave in a
/// session that outlives its transaction.
async fn tenant_handler(mut tx: IdempotentTx, body: Bytes) -> Response {
    let seen = match session(&mut tx).await {
        Ok(seen) => seen,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    if &body[..] == b"dirty" {
        for statement in [
            "SET app.tenant = 'a'",
            "SET statement_timeout = '1234ms'",
            "SELECT pg_advisory_lock(36)",
            "LISTEN tenant_a",
            "CREATE TEMP TABLE tenant_scratch (x int)",
            "DECLARE tenant_cursor CURSOR WITH HOLD FOR SELECT 1",
            "SET ROLE pg_monitor",
        ] {
            if let Err(e) = (&mut *tx).execute(statement).await {
                return (StatusCode::SERVICE_UNAVAILABLE, format!("{statement}: {e}"))
                    .into_response();
            }
        }
    }
    (StatusCode::CREATED, Json(seen)).into_response()
}

/// A handler's `SET app.tenant = 'a'` (and role, listens, advisory locks, temporary tables,
/// held cursors) is not seen by the next request on the same kept connection, which still has
/// what the pool's `after_connect` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_is_as_clean_as_a_fresh_lend() {
    let env = TestEnv::new().await;
    let pool = hooked_pool(&env.url).await;
    let addr = serve(tenant_router(&pool)).await;
    let c = http();
    let fresh = post(&c, addr, None, None, "dirty").await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.body);
    // Twice: the first reuse, and a reuse of a connection that was itself reset.
    for round in 0..2 {
        let next = post(&c, addr, None, None, "look").await;
        assert_eq!(next.status, StatusCode::CREATED, "{}", next.body);
        assert_eq!(
            next.body["pid"], fresh.body["pid"],
            "the next request runs on the kept connection"
        );
        let mut expected = fresh.body.clone();
        expected["pid"] = next.body["pid"].clone();
        assert_eq!(next.body, expected, "round {round}: the session as lent");
        assert_eq!(next.body["search_path"], HOOK_SEARCH_PATH);
        assert_eq!(next.body["user"], "postgres");
    }
    pool.close().await;
    env.cleanup().await;
}

/// A connection kept by the store goes back to the pool when someone waits on it: the waiter
/// gets it within the pool's own acquire timeout (2 s here), not when the kept connection's
/// minute is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_the_pool_gets_a_kept_connection() {
    let env = TestEnv::new().await;
    let pool = hooked_pool(&env.url).await;
    let addr = serve(tenant_router(&pool)).await;
    let r = post(&http(), addr, None, None, "look").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // The request's connection is kept: out of the pool, not idle in it.
    wait_for("one connection kept", Duration::from_secs(10), || {
        let out = pool.size() as usize - pool.num_idle();
        async move { (out == 1).then_some(()) }
    })
    .await;
    // The application takes every other connection the pool can lend…
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            pool.acquire()
                .await
                .expect("a connection the pool can lend"),
        );
    }
    // …and one more: the kept one must come back for it.
    let waiter = pool.acquire().await;
    assert!(
        waiter.is_ok(),
        "the waiter timed out while a connection sat kept: {:?}",
        waiter.err()
    );
    drop(waiter);
    drop(held);
    pool.close().await;
    env.cleanup().await;
}

/// A connection that went back to the pool after a request (the store keeps none here: a pool
/// of 3 keeps a quarter, 0) is lent to the next request as clean as a fresh one, although the
/// pool has no `after_release` hook: the soak found a tenant's `app.tenant` seen by the next
/// tenant's request that way (issue 36).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_back_from_the_pool_is_as_clean_as_a_fresh_lend() {
    let env = TestEnv::new().await;
    let pool = hooked_pool_of(&env.url, 3).await;
    let addr = serve(tenant_router(&pool)).await;
    let c = http();
    let fresh = post(&c, addr, None, None, "look").await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.body);
    let dirty = post(&c, addr, None, None, "dirty").await;
    assert_eq!(dirty.status, StatusCode::CREATED, "{}", dirty.body);
    // The pool lends its idle connections in turn: within a few requests the dirty one's.
    let mut reused = false;
    for round in 0..6 {
        let next = post(&c, addr, None, None, "look").await;
        assert_eq!(next.status, StatusCode::CREATED, "{}", next.body);
        reused |= next.body["pid"] == dirty.body["pid"];
        let mut expected = fresh.body.clone();
        expected["pid"] = next.body["pid"].clone();
        assert_eq!(next.body, expected, "round {round}: the session as lent");
    }
    assert!(reused, "no request ran on the dirty request's connection");
    pool.close().await;
    env.cleanup().await;
}
