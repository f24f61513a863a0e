//! A fresh database migrated as a service does it (the layer's migrations, and the table the
//! counting handler writes) and a Redis key prefix per test, both removed after it.

use idempotency_key::PgIdempotencyStore;
#[cfg(feature = "redis")]
use idempotency_key::RedisCache;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

#[cfg(feature = "redis")]
use super::redis_url;
use super::TestDb;

/// A fresh PostgreSQL database (a [`TestDb`]) with a pool on it, and a Redis key prefix; removed
/// by `cleanup` (or, after a panic, on drop). Without the `redis` feature the prefix is unused
/// and a layer "with Redis" is PostgreSQL's alone (see `layer_with_redis`).
pub struct TestEnv {
    pub url: String,
    pub pool: PgPool,
    /// The test's Redis keys start with it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
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
        // The layer's migrations as a service applies them (into schema dedup_worker; the pool
        // is the application's, with its default search_path).
        idempotency_key::migrate(&pool).await.expect("migrations");
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

    #[cfg(feature = "redis")]
    pub fn redis(&self) -> RedisCache {
        RedisCache::new(&redis_url(), self.prefix.clone()).expect("redis client")
    }

    /// A cache pointed at a port where nothing listens: Redis "stopped".
    #[cfg(feature = "redis")]
    pub fn dead_redis(&self) -> RedisCache {
        RedisCache::new("redis://127.0.0.1:1/", self.prefix.clone()).expect("redis client")
    }

    /// Deletes this test's Redis keys only (other tests share the server); how many there were
    /// (none without the `redis` feature).
    pub async fn flush_redis(&self) -> usize {
        #[cfg(feature = "redis")]
        return delete_keys(&self.prefix)
            .await
            .expect("delete this test's Redis keys");
        #[cfg(not(feature = "redis"))]
        0
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
#[cfg(feature = "redis")]
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

#[cfg(feature = "redis")]
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
