//! The Idempotency-Key layer (issue 3) against the real PostgreSQL and Redis, with the real
//! router served on port 0: this crate's one integration-test binary (`cargo test -p
//! idempotency-key`; `--test it leases::` runs one module). Every test owns a database and a
//! Redis key prefix ([`TestEnv`]); the handler behind the layer counts its executions
//! ([`Counting`]); the harness is [`helpers`], the crate's own. Without the `redis` feature the
//! Redis modules are left out and a layer "with Redis" answers from PostgreSQL alone; without
//! `client`, the client's module is left out.
//!
//! * [`replay`]: a key replays its stored response (status, headers, body) and runs once; reuse
//!   with another body is 422; key forms, accounts, what is stored and what is not;
//! * [`concurrency`]: while a request runs, a duplicate is 409 and another body 422; a hundred
//!   at once run once; `drain` waits for a request whose client went away;
//! * [`leases`]: a crashed request holds its key until its lease ends; a lease taken over
//!   cannot complete; heartbeats keep a slow handler's claim; the TTL and expiry;
//! * [`redis`]: the Redis fast path: replays skip PostgreSQL; a flushed or stopped Redis
//!   changes nothing;
//! * [`redis_faults`]: Redis behind a fault proxy (black hole, refusal, cut connections);
//! * [`postgres`]: the grouped writes keep probing the primary key as the table grows;
//!   PostgreSQL that stops answering is a 503 and the breaker refuses the queue;
//! * [`transactional`]: the tests above again with handlers that write through an
//!   `IdempotentTx`;
//! * [`atomic`]: what only the transactional mode promises: a crash before the result is
//!   stored leaves no row; failures, panics, a failed commit and a lost lease commit nothing;
//! * [`connections`]: the connection under a request's transaction: one that died idle (kept by
//!   the store, or in a pool without pings) costs no request; a handler's own transaction on it
//!   is a savepoint;
//! * [`sessions`]: a kept connection carries no session state from one request to the next,
//!   and goes back to a pool someone waits on;
//! * [`commits`]: a commit at the wrong depth, or answered with `ROLLBACK`, fails the request;
//! * [`client`]: the retrying client keeps one key.
//!
//! The checkout example's tests (recovery points, the double-charge timeline, hostile input)
//! are the example crate's own (`cargo test -p idempotency-key-checkout`).

mod atomic;
#[cfg(feature = "client")]
mod client;
mod commits;
mod concurrency;
mod connections;
mod helpers;
mod leases;
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_faults;
mod replay;
mod sessions;
mod transactional;

use std::net::SocketAddr;

use http::{HeaderMap, StatusCode};
use idempotency_key::test_util::StoredResponse;
use idempotency_key::{IdempotencyLayer, PgIdempotencyStore};
use serde_json::Value;

use crate::helpers::{serve, Counting, TestEnv};

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn post(
    http: &helpers::http_client::Client,
    addr: SocketAddr,
    key: Option<&str>,
    account: Option<&str>,
    body: &str,
) -> Reply {
    let mut rb = http
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        rb = rb.header("idempotency-key", k);
    }
    if let Some(a) = account {
        rb = rb.header("x-account", a);
    }
    let resp = rb.send().await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
    }
}

fn layer(env: &TestEnv) -> idempotency_key::IdempotencyLayerBuilder {
    layer_on(env.store())
}

/// [`layer`], with the Redis fast path when `with_redis`.
fn layer_with_redis_if(
    env: &TestEnv,
    with_redis: bool,
) -> idempotency_key::IdempotencyLayerBuilder {
    if with_redis {
        layer_with_redis(env)
    } else {
        layer(env)
    }
}

/// [`layer`] with the Redis fast path; without the `redis` feature, PostgreSQL's alone. Redis
/// never decides, so a test's answers are the same either way (what only Redis shows is in
/// [`redis`] and [`redis_faults`]).
fn layer_with_redis(env: &TestEnv) -> idempotency_key::IdempotencyLayerBuilder {
    #[cfg(feature = "redis")]
    return layer(env).redis(env.redis());
    #[cfg(not(feature = "redis"))]
    layer(env)
}

fn layer_on(store: PgIdempotencyStore) -> idempotency_key::IdempotencyLayerBuilder {
    // `x-account` names the account; without it the request belongs to "default", except that
    // `x-account: none` stands for a caller the extractor cannot identify.
    IdempotencyLayer::builder(store).account(|p| {
        match p.headers.get("x-account").and_then(|v| v.to_str().ok()) {
            Some("none") => None,
            Some(account) => Some(account.to_owned()),
            None => Some("default".to_owned()),
        }
    })
}

async fn app(_env: &TestEnv, handler: &Counting, layer: IdempotencyLayer) -> SocketAddr {
    serve(handler.router().layer(layer)).await
}

fn http() -> helpers::http_client::Client {
    helpers::http_client::Client::new()
}

fn stored(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.to_owned().into(),
    }
}
