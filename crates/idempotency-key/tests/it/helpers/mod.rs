//! The harness of the layer's tests, this crate's own (it depends on nothing of dedup-worker's),
//! over what it shares with the checkout example's tests (`idempotency_key_harness`: a
//! PostgreSQL database per test, a server that dies as a crashed process does, polling with a
//! deadline, serving a router on port 0, re-exported here):
//!
//! * [`env`]: a fresh database migrated as a service does it, and a Redis key prefix per test;
//! * [`counting`]: the handler behind the layer in most tests, counting its executions;
//! * [`fault_proxy`]: a TCP proxy that black-holes, refuses or cuts PostgreSQL or Redis;
//! * [`http_client`]: the tests' HTTP client (hyper's, so that reqwest stays behind `client`);
//!
//! and, here, the Redis server's URL.

pub mod counting;
pub mod env;
pub mod fault_proxy;
pub mod http_client;

pub use counting::{in_transactional_mode, order_rows, Counting};
pub use env::TestEnv;
pub use idempotency_key_harness::{serve, wait_for, DoomedServer, TestDb};

/// The Redis server for tests: `DEDUP_TEST_REDIS`, else the local one. Each test keeps to a key
/// prefix of its own.
#[cfg(feature = "redis")]
pub fn redis_url() -> String {
    std::env::var("DEDUP_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}
