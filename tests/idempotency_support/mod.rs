//! Test support for the idempotency suite: a throw-away PostgreSQL database and Redis key
//! prefix per test, servers on port 0, and a counting handler.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use dedup_worker::idempotency::{example, NotExecuted, PgIdempotencyStore, RedisCache};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

pub fn admin_url() -> String {
    std::env::var("IDEM_TEST_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A fresh database and Redis prefix, removed by `cleanup` (or, after a panic, by `Drop`).
pub struct TestEnv {
    pub db_name: String,
    pub url: String,
    pub pool: PgPool,
    pub prefix: String,
    cleaned: bool,
}

impl TestEnv {
    pub async fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("idem_{id}");
        let mut admin = PgConnection::connect(&admin_url())
            .await
            .expect("admin connect");
        sqlx::query(&format!("CREATE DATABASE {db_name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        admin.close().await.ok();
        let base = admin_url();
        let url = match base.rfind('/') {
            Some(i) => format!("{}/{db_name}", &base[..i]),
            None => panic!("bad admin url"),
        };
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&url)
            .await
            .expect("connect test db");
        // All migrations, the lead's included, exactly as the binary applies them.
        sqlx::migrate!("migrations/postgres")
            .run(&pool)
            .await
            .expect("migrations");
        example::setup(&pool).await.expect("example tables");
        Self {
            db_name,
            url,
            pool,
            prefix: format!("idemtest:{id}"),
            cleaned: false,
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
        let client = redis::Client::open(redis_url()).expect("redis");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis connect");
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}:*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("scan");
            keys.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        let n = keys.len();
        if n > 0 {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("del");
        }
        n
    }

    pub async fn cleanup(mut self) {
        self.flush_redis().await;
        self.pool.close().await;
        drop_database(&self.db_name).await;
        self.cleaned = true;
    }
}

async fn drop_database(name: &str) {
    if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // A failed test still leaves nothing behind: drop from a thread with its own runtime
        // (the test's runtime may be unwinding).
        let name = self.db_name.clone();
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(async {
                    drop_database(&name).await;
                    if let Ok(client) = redis::Client::open(redis_url()) {
                        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                            let keys: Vec<String> = redis::cmd("KEYS")
                                .arg(format!("{prefix}:*"))
                                .query_async(&mut c)
                                .await
                                .unwrap_or_default();
                            if !keys.is_empty() {
                                let _: Result<i64, _> =
                                    redis::cmd("DEL").arg(&keys).query_async(&mut c).await;
                            }
                        }
                    }
                });
            }
        })
        .join();
    }
}

/// Serves `router` on 127.0.0.1:0.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// Polls `f` until it returns `Some`, failing after `deadline`.
pub async fn poll<T, F, Fut>(deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < end,
            "condition not reached before the deadline"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The handler behind the layer in most tests: counts executions and behaves by body `mode`:
/// `declined` → 402, `invalid` → 400 marked [`NotExecuted`], `fail_once` → 503 on its first execution, `busy_once` → 429 on its first
/// execution, `boom` → 500, otherwise 201.
/// With a gate, each execution waits for one permit (lets tests hold a request in flight).
#[derive(Clone, Default)]
pub struct Counting {
    pub count: Arc<AtomicU64>,
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    pub fail_once_done: Arc<AtomicU64>,
    pub busy_once_done: Arc<AtomicU64>,
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
        Router::new()
            .route("/orders", post(order).get(list))
            .with_state(self.clone())
    }
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

/// A TCP gate in front of PostgreSQL, for outages the tests can switch on and off: while open it
/// forwards; while hung it behaves like a host that stopped answering (connections it accepts
/// are held without a byte forwarded, and the ones already forwarding are cut from PostgreSQL
/// but left open towards the client).
pub struct PgGate {
    /// The gate's port on 127.0.0.1.
    pub port: u16,
    /// `true` while hung.
    hung: tokio::sync::watch::Sender<bool>,
    /// Connections forwarding right now, so that `hang` can wait until none forwards.
    forwarding: Arc<AtomicU64>,
    /// Connections accepted while hung (attempts to reach PostgreSQL during the outage).
    accepted_while_hung: Arc<AtomicU64>,
    /// The accept loop, stopped on drop.
    accept: tokio::task::JoinHandle<()>,
}

impl PgGate {
    /// A gate forwarding to the PostgreSQL server of `url`.
    pub async fn start(url: &str) -> Self {
        use std::str::FromStr;
        let target = sqlx::postgres::PgConnectOptions::from_str(url).expect("database url");
        let upstream = format!("{}:{}", target.get_host(), target.get_port());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gate");
        let port = listener.local_addr().expect("gate addr").port();
        let (hung, _) = tokio::sync::watch::channel(false);
        let forwarding = Arc::new(AtomicU64::new(0));
        let accepted_while_hung = Arc::new(AtomicU64::new(0));
        let accept = {
            let (hung, forwarding, accepted_while_hung) = (
                hung.clone(),
                forwarding.clone(),
                accepted_while_hung.clone(),
            );
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let mut hung = hung.subscribe();
                    if *hung.borrow_and_update() {
                        accepted_while_hung.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(hold(client));
                        continue;
                    }
                    let forwarding = forwarding.clone();
                    let upstream = upstream.clone();
                    forwarding.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        let mut client = client;
                        if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {
                                    forwarding.fetch_sub(1, Ordering::SeqCst);
                                    return;
                                }
                                _ = hung.wait_for(|h| *h) => {}
                            }
                        }
                        forwarding.fetch_sub(1, Ordering::SeqCst);
                        hold(client).await;
                    });
                }
            })
        };
        Self {
            port,
            hung,
            forwarding,
            accepted_while_hung,
            accept,
        }
    }

    /// Stops answering; returns once no connection forwards any more, so nothing sent after
    /// this reaches PostgreSQL.
    pub async fn hang(&self) {
        self.hung.send_replace(true);
        poll(Duration::from_secs(10), || async {
            (self.forwarding.load(Ordering::SeqCst) == 0).then_some(())
        })
        .await;
    }

    /// Forwards new connections again (the held ones stay held).
    pub fn open(&self) {
        self.hung.send_replace(false);
    }

    /// Connections accepted while hung.
    pub fn accepted_while_hung(&self) -> u64 {
        self.accepted_while_hung.load(Ordering::SeqCst)
    }
}

impl Drop for PgGate {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Keeps a connection open without reading or writing, for the rest of the test (its runtime
/// drops it at the end).
async fn hold(client: tokio::net::TcpStream) {
    let _client = client;
    std::future::pending::<()>().await
}
