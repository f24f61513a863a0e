//! The Redis fast path: a replay mirrored to Redis does not query PostgreSQL; a flushed or
//! stopped Redis changes no answer.
use std::time::Duration;

use http::StatusCode;
use idempotency_key::test_util::StoreProtocol;

use super::{app, http, layer, post};
use crate::helpers::wait_for;
use crate::helpers::{Counting, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn redis_replays_skip_postgres_and_a_flushed_or_stopped_redis_changes_nothing() {
    let env = TestEnv::new().await;
    let h = Counting::gated();
    let l = layer(&env).redis(env.redis()).build();
    let store = l.store().clone();
    let addr = app(&env, &h, l).await;
    let c = http();

    // First execution held in the handler; Redis is flushed under it: PostgreSQL still says 409.
    let c2 = c.clone();
    let first = tokio::spawn(async move { post(&c2, addr, Some("k-r"), None, r#"{"a":1}"#).await });
    let hh = h.clone();
    wait_for("the first request to run", Duration::from_secs(20), || {
        let hh = hh.clone();
        async move { (hh.runs() == 1).then_some(()) }
    })
    .await;
    assert!(env.flush_redis().await >= 1, "the short lock was in Redis");
    let during = post(&c, addr, Some("k-r"), None, r#"{"a":1}"#).await;
    assert_eq!(during.status, StatusCode::CONFLICT);
    h.gate.as_ref().unwrap().add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);

    // Mirrored: the replay does not query PostgreSQL.
    let before = store.query_count();
    let r = post(&c, addr, Some("k-r"), None, r#"{"a":1}"#).await;
    assert!(r.replayed());
    assert_eq!(r.body, first.body);
    assert_eq!(store.query_count(), before, "replay served from Redis");

    // Flushed: PostgreSQL replays (one query) and re-mirrors.
    env.flush_redis().await;
    let r = post(&c, addr, Some("k-r"), None, r#"{"a":1}"#).await;
    assert!(r.replayed());
    assert_eq!(r.body, first.body);
    assert!(store.query_count() > before);
    let after = store.query_count();
    let r = post(&c, addr, Some("k-r"), None, r#"{"a":1}"#).await;
    assert!(r.replayed());
    assert_eq!(store.query_count(), after);
    assert_eq!(h.runs(), 1);

    // Stopped: a layer pointed at a dead Redis over the same PostgreSQL replays, and executes
    // new keys once.
    let dead = layer(&env).redis(env.dead_redis()).build();
    let h2 = h.clone();
    let addr2 = app(&env, &h2, dead).await;
    let r = post(&c, addr2, Some("k-r"), None, r#"{"a":1}"#).await;
    assert!(r.replayed());
    assert_eq!(r.body, first.body);
    h.gate.as_ref().unwrap().add_permits(1);
    let n = post(&c, addr2, Some("k-r2"), None, r#"{"a":1}"#).await;
    assert_eq!(n.status, StatusCode::CREATED);
    let n2 = post(&c, addr2, Some("k-r2"), None, r#"{"a":1}"#).await;
    assert!(n2.replayed());
    assert_eq!(h.runs(), 2);
    env.cleanup().await;
}
