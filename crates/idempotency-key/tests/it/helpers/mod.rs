//! The harness of the layer's tests, this crate's own (it depends on nothing of dedup-worker's):
//!
//! * [`db`]: a fresh PostgreSQL database per test, dropped after it;
//! * [`env`]: that database migrated as a service does it, and a Redis key prefix per test;
//! * [`counting`]: the handler behind the layer in most tests, counting its executions;
//! * [`doomed`]: a server that dies as a crashed process does;
//! * [`fault_proxy`]: a TCP proxy that black-holes, refuses or cuts PostgreSQL or Redis;
//! * [`http_client`]: the tests' HTTP client (hyper's, so that reqwest stays behind `client`);
//!
//! and, here, polling with a deadline, serving a router on port 0, and the Redis server's URL.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub mod counting;
pub mod db;
pub mod doomed;
pub mod env;
pub mod fault_proxy;
pub mod http_client;

pub use counting::{in_transactional_mode, order_rows, Counting};
pub use db::TestDb;
pub use doomed::DoomedServer;
pub use env::TestEnv;

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
pub async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// The Redis server for tests: `DEDUP_TEST_REDIS`, else the local one. Each test keeps to a key
/// prefix of its own.
#[cfg(feature = "redis")]
pub fn redis_url() -> String {
    std::env::var("DEDUP_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}
