//! Shared test support, one harness for every module of the suite. Its most used parts are the
//! `testing` feature's kit (`dedup_worker::testing`: [`TestDb`], [`TestApp`], [`test_settings`],
//! [`stripe_event`], [`post_signed`]), re-exported here under the same names; the rest is the
//! suite's own:
//!
//! * [`db`]: a fresh database per test (a PostgreSQL database `dw_test_<uuid>` on the server
//!   named by `DEDUP_TEST_POSTGRES`, or an SQLite file), a dedup row held open by the test, and
//!   what the stores hold;
//! * [`app`]: the application in this process on port 0, the real binary started on port 0
//!   (killed on drop), and its CLI;
//! * [`signing`]: Stripe events, signed with our code or with the official `stripe` library;
//!   Standard Webhooks deliveries checked by the official library, ed25519 by Python's
//!   `cryptography`;
//! * [`senders`]: GitHub, Shopify and Slack deliveries signed by the senders' own libraries
//!   (`@octokit/webhooks-methods`, `@shopify/shopify-api`, `slack_sdk`);
//! * [`stripe_channels`]: thin events, EventBridge envelopes, the official library's reading of
//!   them, and a stand-in for Stripe's `GET /v2/core/events/{id}`;
//! * [`receiver`]: an HTTP sink target that records every delivery, and the file sink's ids;
//! * [`queue`]: a queue of the test's own on every transport, and the turns the tests take on
//!   the SQS emulator;
//! * [`sqs_calls`]: an HTTP proxy in front of the SQS emulator counting each operation's calls
//!   and how many overlapped, and holding back short polls;
//! * [`fault_proxy`] (the test kit's): a TCP proxy that black-holes, refuses, cuts or slows a
//!   dependency;
//!
//! and, here, polling with a deadline, serving a router on port 0, and the broker's URL. (The
//! Idempotency-Key layer's tests are its crate's, with a harness of their own.)

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub mod app;
pub mod db;
pub mod hmac_senders;
pub use dedup_worker::testing::fault_proxy;
pub mod queue;
pub mod receiver;
pub mod senders;
pub mod signing;
pub mod sqs_calls;
pub mod stripe_channels;

pub use app::{
    cli_json_lines, counter_value, dedup_command, run_cli, test_settings, without_colours,
    RunningBinary, TestApp,
};
pub use db::{ledger_counts, pipeline_drained, Backend, HeldDedupRow, TestDb};
pub use queue::{sqs_turn, SqsLoad, TestQueue, Transport};
pub use receiver::{file_sink_ids, Receiver};
pub use signing::{
    ed25519_python_sign, ed25519_python_verified, now, post_signed, post_signed_until_not_503,
    standard_python_verified, stripe_event, stripe_python_sign,
};

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` every 50 ms until it returns `Some`, or gives `None` after `timeout`.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
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

/// The RabbitMQ broker: `AMQP_URL` (the binary reads the same variable), else the local one.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// `store_contract!(test_a, test_b)`: each `async fn test_a(backend: Backend)` of the calling
/// module run as two tests, `postgres::test_a` and `sqlite::test_a` (the module must have
/// `Backend` in scope).
macro_rules! store_contract {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Postgres).await } )*
        }
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
    };
}
pub(crate) use store_contract;
