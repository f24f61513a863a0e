//! The harness the layer's tests (`crates/idempotency-key/tests/it`) and its checkout example's
//! (`examples/checkout/tests/it`) share, each test binary adding its own environment on top:
//!
//! * [`TestDb`]: a PostgreSQL database that exists for one test;
//! * [`DoomedServer`]: a server that dies as a crashed process does;
//! * [`wait_for`]: polling with a deadline; [`serve`]: a router on port 0.

mod db;
mod doomed;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use db::TestDb;
pub use doomed::DoomedServer;

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
