//! The harness: a fresh PostgreSQL database per test with the layer's migrations and the
//! example's tables, a Redis key prefix per test, a server that dies as a crashed process does,
//! polling with a deadline, and serving a router on port 0. A smaller copy of the layer crate's
//! own (`crates/idempotency-key/tests/it/helpers`): test binaries of two crates share no module.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use idempotency_key::{PgIdempotencyStore, RedisCache};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// The PostgreSQL server the databases are created on: `DEDUP_TEST_POSTGRES` (its role may
/// create and drop databases), else a local one with trust authentication.
fn pg_admin_url() -> String {
    std::env::var("DEDUP_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The Redis server for tests: `DEDUP_TEST_REDIS`, else the local one.
pub fn redis_url() -> String {
    std::env::var("DEDUP_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A fresh PostgreSQL database `dw_test_<uuid>` with the layer's migrations and the example's
/// tables, a pool on it, and a Redis key prefix; removed by `cleanup` (or, after a panic, on
/// drop).
pub struct TestEnv {
    pub url: String,
    pub pool: PgPool,
    pub prefix: String,
    /// The database to drop; `None` once `cleanup` dropped it.
    name: Option<String>,
}

impl TestEnv {
    pub async fn new() -> Self {
        let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
        let base = pg_admin_url();
        let mut admin = PgConnection::connect(&base)
            .await
            .unwrap_or_else(|e| panic!("connect to PostgreSQL (DEDUP_TEST_POSTGRES): {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        admin.close().await.ok();
        let url = match base.rsplit_once('/') {
            Some((prefix, _)) => format!("{prefix}/{name}"),
            None => panic!("DEDUP_TEST_POSTGRES is not a postgres:// URL: {base}"),
        };
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&url)
            .await
            .expect("connect test db");
        idempotency_key::migrate(&pool).await.expect("migrations");
        idempotency_key_checkout::setup(&pool)
            .await
            .expect("example tables");
        Self {
            url,
            pool,
            prefix: format!("dw_test:{}", uuid::Uuid::new_v4().simple()),
            name: Some(name),
        }
    }

    pub fn store(&self) -> PgIdempotencyStore {
        PgIdempotencyStore::new(self.pool.clone())
    }

    pub fn redis(&self) -> RedisCache {
        RedisCache::new(&redis_url(), self.prefix.clone()).expect("redis client")
    }

    pub async fn cleanup(mut self) {
        delete_keys(&self.prefix)
            .await
            .expect("delete this test's Redis keys");
        self.pool.close().await;
        if let Some(name) = self.name.take() {
            drop_database(&name).await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else {
            return;
        };
        // A failed test still leaves nothing behind, from a thread with a runtime of its own
        // (the test's may be unwinding).
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let _ = delete_keys(&prefix).await;
                drop_database(&name).await;
            });
            Some(())
        })
        .join();
    }
}

async fn drop_database(name: &str) {
    if let Ok(mut admin) = PgConnection::connect(&pg_admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
    }
}

/// Deletes the Redis keys under `prefix` (other tests share the server).
async fn delete_keys(prefix: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
        }
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves `router` on 127.0.0.1:0 for the rest of the test; its address.
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
                let addr = serve(make(pool)).await;
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
