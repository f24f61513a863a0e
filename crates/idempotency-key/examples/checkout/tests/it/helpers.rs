//! The harness: a fresh PostgreSQL database per test with the layer's migrations and the
//! example's tables, and a Redis key prefix per test, over what the layer crate's own tests share
//! with these (`idempotency_key_harness`: the database, a server that dies as a crashed process
//! does, polling with a deadline, serving a router on port 0, re-exported here).

use idempotency_key::{PgIdempotencyStore, RedisCache};
use idempotency_key_harness::TestDb;
pub use idempotency_key_harness::{serve, wait_for, DoomedServer};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// The Redis server for tests: `DEDUP_TEST_REDIS`, else the local one.
pub fn redis_url() -> String {
    std::env::var("DEDUP_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A fresh PostgreSQL database (a [`TestDb`]) with the layer's migrations and the example's
/// tables, a pool on it, and a Redis key prefix; removed by `cleanup` (or, after a panic, on
/// drop: the database by its own drop, the keys here).
pub struct TestEnv {
    pub url: String,
    pub pool: PgPool,
    pub prefix: String,
    /// The database, dropped with the environment if `cleanup` did not remove it.
    db: Option<TestDb>,
}

impl TestEnv {
    pub async fn new() -> Self {
        let db = TestDb::new().await;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&db.url)
            .await
            .expect("connect test db");
        idempotency_key::migrate(&pool).await.expect("migrations");
        idempotency_key_checkout::setup(&pool)
            .await
            .expect("example tables");
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

    pub async fn cleanup(mut self) {
        delete_keys(&self.prefix)
            .await
            .expect("delete this test's Redis keys");
        self.pool.close().await;
        if let Some(db) = self.db.take() {
            db.remove().await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.db.is_none() {
            return;
        }
        // A failed test still leaves no keys behind, from a thread with a runtime of its own
        // (the test's may be unwinding); the database goes with `self.db`.
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let _ = delete_keys(&prefix).await;
            });
            Some(())
        })
        .join();
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
