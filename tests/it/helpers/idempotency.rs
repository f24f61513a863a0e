//! The Idempotency-Key layer's tests: a fresh database migrated as the binary does it (with the
//! checkout example's tables) and a Redis key prefix per test, and the counting handler behind
//! the layer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use idempotency_key::{IdempotentTx, NotExecuted, PgIdempotencyStore, RedisCache};
use idempotency_key_checkout as example;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::{redis_url, Backend, TestDb};

/// A fresh PostgreSQL database (a [`TestDb`]) with a pool on it, and a Redis key prefix; removed
/// by `cleanup` (or, after a panic, on drop).
pub struct TestEnv {
    pub url: String,
    pub pool: PgPool,
    pub prefix: String,
    /// The database, dropped with the environment if `cleanup` did not remove it.
    db: Option<TestDb>,
}

impl TestEnv {
    pub async fn new() -> Self {
        let db = TestDb::new(Backend::Postgres).await;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&db.url)
            .await
            .expect("connect test db");
        // All migrations, the lead's included, exactly as the binary applies them (into schema
        // dedup_worker; the pool is the application's, with its default search_path).
        idempotency_key::migrate(&pool).await.expect("migrations");
        example::setup(&pool).await.expect("example tables");
        // What the counting handler writes in the transactional mode: no unique key of its own,
        // so a second execution would show as a second row.
        sqlx::query(
            "CREATE TABLE layer_test_orders (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, body TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("layer_test_orders");
        Self {
            url: db.url.clone(),
            pool,
            prefix: format!("dw_test:{}", uuid::Uuid::new_v4().simple()),
            db: Some(db),
        }
    }

    pub fn store(&self) -> PgIdempotencyStore {
        PgIdempotencyStore::new(self.pool.clone())
    }

    pub fn redis(&self) -> RedisCache {
        RedisCache::new(&redis_url(), self.prefix.clone()).expect("redis client")
    }

    /// A cache pointed at a port where nothing listens: Redis "stopped".
    pub fn dead_redis(&self) -> RedisCache {
        RedisCache::new("redis://127.0.0.1:1/", self.prefix.clone()).expect("redis client")
    }

    /// Deletes this test's Redis keys only (other tests share the server).
    pub async fn flush_redis(&self) -> usize {
        delete_keys(&self.prefix)
            .await
            .expect("delete this test's Redis keys")
    }

    pub async fn cleanup(mut self) {
        self.flush_redis().await;
        self.pool.close().await;
        if let Some(db) = self.db.take() {
            db.remove().await;
        }
    }
}

/// Deletes the Redis keys under `prefix`; how many there were.
async fn delete_keys(prefix: &str) -> redis::RedisResult<usize> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let n = keys.len();
    if n > 0 {
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
    }
    Ok(n)
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.db.is_none() {
            return;
        }
        // A failed test still leaves nothing behind: its Redis keys are deleted from a thread
        // with its own runtime (the test's runtime may be unwinding), and its database with
        // the `TestDb`.
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(delete_keys(&prefix));
            }
        })
        .join();
    }
}

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

/// A server in a runtime of its own, so that dropping the runtime kills it like a crashed
/// process: no completion, no release, no commit, its PostgreSQL connections closed mid-way, the
/// claim just stops being renewed. `make` builds its router inside that runtime, on a pool of
/// its own over `db_url`.
pub struct DoomedServer {
    pub addr: std::net::SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DoomedServer {
    pub fn start<F>(db_url: String, make: F) -> Self
    where
        F: FnOnce(PgPool) -> Router + Send + 'static,
    {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("the doomed server's runtime");
            rt.block_on(async move {
                let pool = PgPool::connect(&db_url).await.expect("connect");
                let addr = super::serve(make(pool)).await;
                addr_tx.send(addr).expect("send the address");
                let _ = kill_rx.await;
            });
            // Dropping the runtime drops every task and connection: the process is gone.
            drop(rt);
        });
        let addr = addr_rx.recv().expect("the doomed server's address");
        Self {
            addr,
            kill: Some(kill_tx),
            thread: Some(thread),
        }
    }

    /// Kills it, and returns once everything it held is gone.
    pub fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("the doomed server's thread");
        }
    }
}
