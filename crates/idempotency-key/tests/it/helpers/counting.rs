//! The handler behind the layer in most tests: it counts its executions, answers by the body's
//! `mode`, and in the transactional mode writes a row through its `IdempotentTx`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use idempotency_key::{IdempotentTx, NotExecuted};
use serde_json::json;
use sqlx::PgPool;

thread_local! {
    /// Whether [`Counting`] handlers made on this thread write in the transactional mode. A
    /// `#[tokio::test]` body runs on the thread that calls the test function, so setting it
    /// around that call switches every handler the test makes.
    static TRANSACTIONAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a layer test (a `#[tokio::test]` function) with every [`Counting`] handler it makes in
/// the transactional mode: each execution also inserts a row through an
/// [`IdempotentTx`], committed with the stored result.
pub fn in_transactional_mode(test: fn()) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            TRANSACTIONAL.with(|t| t.set(false));
        }
    }
    TRANSACTIONAL.with(|t| t.set(true));
    let _reset = Reset;
    test();
}

/// The handler behind the layer in most tests: counts executions and behaves by body `mode`:
/// `declined` → 402, `invalid` → 400 marked [`NotExecuted`], `fail_once` → 503 on its first execution, `busy_once` → 429 on its first
/// execution, `boom` → 500, otherwise 201.
/// With a gate, each execution waits for one permit (lets tests hold a request in flight).
/// In the transactional mode (see [`in_transactional_mode`]) each execution first inserts a row
/// into `layer_test_orders` through its [`IdempotentTx`].
#[derive(Clone)]
pub struct Counting {
    pub count: Arc<AtomicU64>,
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    pub fail_once_done: Arc<AtomicU64>,
    pub busy_once_done: Arc<AtomicU64>,
    pub transactional: bool,
}

impl Default for Counting {
    fn default() -> Self {
        Self {
            count: Arc::default(),
            gate: None,
            fail_once_done: Arc::default(),
            busy_once_done: Arc::default(),
            transactional: TRANSACTIONAL.with(|t| t.get()),
        }
    }
}

impl Counting {
    pub fn gated() -> Self {
        Self {
            gate: Some(Arc::new(tokio::sync::Semaphore::new(0))),
            ..Default::default()
        }
    }

    pub fn runs(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    pub fn router(&self) -> Router {
        let create = if self.transactional {
            post(order_in_tx)
        } else {
            post(order)
        };
        Router::new()
            .route("/orders", create.get(list))
            .with_state(self.clone())
    }
}

/// Rows the transactional handler has committed.
pub async fn order_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM layer_test_orders")
        .fetch_one(pool)
        .await
        .expect("count layer_test_orders")
}

async fn order_in_tx(
    state: State<Counting>,
    mut tx: IdempotentTx,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let account = headers
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let inserted = sqlx::query("INSERT INTO layer_test_orders (account, body) VALUES ($1, $2)")
        .bind(account)
        .bind(String::from_utf8_lossy(&body).into_owned())
        .execute(&mut *tx)
        .await;
    if let Err(e) = inserted {
        return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    }
    order(state, headers, body).await
}

async fn list(State(c): State<Counting>) -> Response {
    Json(json!({"runs": c.runs()})).into_response()
}

async fn order(State(c): State<Counting>, headers: HeaderMap, body: Bytes) -> Response {
    let n = c.count.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(gate) = &c.gate {
        if let Ok(p) = gate.acquire().await {
            p.forget();
        }
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or(json!(null));
    let account = headers
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match v.get("mode").and_then(|m| m.as_str()) {
        Some("declined") => {
            return (
                StatusCode::PAYMENT_REQUIRED,
                Json(json!({"error": "card_declined", "run": n})),
            )
                .into_response()
        }
        Some("invalid") => {
            return (
                StatusCode::BAD_REQUEST,
                Extension(NotExecuted),
                Json(json!({"error": "invalid_request", "run": n})),
            )
                .into_response()
        }
        Some("boom") => {
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"run": n}))).into_response()
        }
        Some("fail_once") if c.fail_once_done.fetch_add(1, Ordering::SeqCst) == 0 => {
            return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"run": n}))).into_response()
        }
        Some("busy_once") if c.busy_once_done.fetch_add(1, Ordering::SeqCst) == 0 => {
            return (StatusCode::TOO_MANY_REQUESTS, Json(json!({"run": n}))).into_response()
        }
        _ => {}
    }
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/orders/{n}")),
            (
                header::HeaderName::from_static("x-order-run"),
                n.to_string(),
            ),
        ],
        Json(json!({"run": n, "account": account, "received": v})),
    )
        .into_response()
}
