//! Issue 9: Redis behind a fault proxy. Whatever Redis does (stops answering, refuses every
//! connection, drops every connection at once), each request is answered by PostgreSQL within
//! a bounded time, nothing runs twice, and once Redis answers again the fast path is used again.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use idempotency_key::test_util::StoreProtocol;
use idempotency_key::{PgIdempotencyStore, RedisCache};

use super::{app, layer, post, Reply};
use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::{redis_url, wait_for};
use crate::helpers::{Counting, TestEnv};

/// Generous: a Redis call is bounded by the cache's timeout (half a second); an answer this
/// late means a request waited on Redis instead of falling through to PostgreSQL.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// How the proxy fails Redis.
#[derive(Debug, Clone, Copy)]
enum Fault {
    BlackHole,
    Refuse,
    CutAll,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_black_holed_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns()
{
    redis_fault(Fault::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_refusing_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns() {
    redis_fault(Fault::Refuse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn cut_redis_connections_leave_every_answer_to_postgres_and_the_fast_path_returns()
{
    redis_fault(Fault::CutAll).await;
}

/// POSTs and fails the test if no answer comes within [`ANSWER_WITHIN`].
async fn post_within(
    c: &crate::helpers::http_client::Client,
    addr: SocketAddr,
    key: &str,
    body: &str,
) -> Reply {
    tokio::time::timeout(ANSWER_WITHIN, post(c, addr, Some(key), None, body))
        .await
        .unwrap_or_else(|_| panic!("no answer for {key} within {ANSWER_WITHIN:?}"))
}

/// One request under way when Redis fails (it holds the Redis lock), then first executions,
/// replays and 20 concurrent duplicates while Redis is failing, then recovery.
async fn redis_fault(fault: Fault) {
    let env = TestEnv::new().await;
    let mut url = ::redis::parse_redis_url(&redis_url()).expect("redis url");
    let upstream = format!(
        "{}:{}",
        url.host_str().expect("redis host"),
        url.port().unwrap_or(6379)
    );
    let proxy = FaultProxy::start(&upstream).await;
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.port)).expect("port");
    let cache = RedisCache::new(url.as_str(), env.prefix.clone()).expect("redis client");
    // Every execution waits for a permit: the test decides which request is under way when.
    let h = Counting::gated();
    let gate = h.gate.clone().expect("gated");
    let l = layer(&env).redis(cache).build();
    let store = l.store().clone();
    let addr = app(&env, &h, l).await;
    let c = crate::helpers::http_client::Client::new();

    // Through the proxy, Redis works: a replay is served without PostgreSQL.
    gate.add_permits(1);
    let before = post_within(&c, addr, "k-before", r#"{"a":1}"#).await;
    assert_eq!(before.status, StatusCode::CREATED);
    replayed_from_redis(&c, addr, &store, "k-before", r#"{"a":1}"#, &before).await;

    // A request under way (it holds the Redis lock) when Redis fails.
    let inflight = {
        let c = c.clone();
        tokio::spawn(async move { post_within(&c, addr, "k-inflight", r#"{"a":2}"#).await })
    };
    wait_for(
        "the in-flight request to run",
        Duration::from_secs(10),
        || {
            let runs = h.runs();
            async move { (runs == 2).then_some(()) }
        },
    )
    .await;
    match fault {
        Fault::BlackHole => proxy.set(Mode::BlackHole).await,
        Fault::Refuse => proxy.set(Mode::Refuse).await,
        // New connections pass: what follows runs on a connection Redis dropped, then on
        // the reconnection.
        Fault::CutAll => proxy.cut_all().await,
    }
    gate.add_permits(1);
    let inflight = inflight.await.unwrap();
    assert_eq!(inflight.status, StatusCode::CREATED);
    assert!(!inflight.replayed());

    // While Redis fails (after a cut, until the cache reconnects): a replay, a first execution
    // and its replay, each answered in time, by PostgreSQL where Redis cannot.
    let r = post_within(&c, addr, "k-before", r#"{"a":1}"#).await;
    assert!(r.replayed(), "{fault:?}: {:?}", r.status);
    assert_eq!(r.body, before.body);
    gate.add_permits(1);
    let during = post_within(&c, addr, "k-during", r#"{"a":3}"#).await;
    assert_eq!(during.status, StatusCode::CREATED, "{fault:?}");
    assert!(!during.replayed());
    let r = post_within(&c, addr, "k-during", r#"{"a":3}"#).await;
    assert!(r.replayed(), "{fault:?}: {:?}", r.status);
    assert_eq!(r.body, during.body);
    assert_eq!(h.runs(), 3);

    // 20 concurrent duplicates while the one execution is held: 19 × 409, then the 201.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let c = c.clone();
        set.spawn(async move { post_within(&c, addr, "k-dup", r#"{"a":4}"#).await });
    }
    let mut refused = 0;
    while refused < 19 {
        let r = set.join_next().await.unwrap().unwrap();
        assert_eq!(r.status, StatusCode::CONFLICT, "{fault:?}: {:?}", r.body);
        assert!(r.header("retry-after").is_some());
        refused += 1;
    }
    gate.add_permits(1);
    let executed = set.join_next().await.unwrap().unwrap();
    assert_eq!(executed.status, StatusCode::CREATED, "{fault:?}");
    assert!(!executed.replayed());
    assert_eq!(h.runs(), 4, "each request ran once");

    if !matches!(fault, Fault::CutAll) {
        proxy.set(Mode::Pass).await;
    }

    // Redis answers again: a replay mirrored (again) is served without PostgreSQL.
    replayed_from_redis(&c, addr, &store, "k-during", r#"{"a":3}"#, &during).await;
    // The request that completed while Redis failed could not drop its Redis lock; with Redis
    // in use again, its retries get its stored response, not a 409 until the lock's TTL.
    let stored = &inflight.body;
    wait_for(
        "the in-flight key's stored response to be replayed",
        Duration::from_secs(10),
        || {
            let c = c.clone();
            async move {
                let r = post_within(&c, addr, "k-inflight", r#"{"a":2}"#).await;
                if r.status == StatusCode::CONFLICT {
                    return None;
                }
                assert!(r.replayed(), "{fault:?}: {:?}", r.status);
                assert_eq!(&r.body, stored);
                Some(())
            }
        },
    )
    .await;
    assert_eq!(h.runs(), 4, "nothing ran twice");
    env.cleanup().await;
}

/// Replays `key` until one is served from Redis (no PostgreSQL statement): the first replay
/// after Redis was empty or unreachable comes from PostgreSQL and mirrors the result.
async fn replayed_from_redis(
    c: &crate::helpers::http_client::Client,
    addr: SocketAddr,
    store: &PgIdempotencyStore,
    key: &str,
    body: &str,
    first: &Reply,
) {
    wait_for(
        "a replay served from Redis",
        Duration::from_secs(10),
        || async move {
            let queries = store.query_count();
            let r = post_within(c, addr, key, body).await;
            assert!(r.replayed(), "{key}: {:?}", r.status);
            assert_eq!(r.body, first.body);
            (store.query_count() == queries).then_some(())
        },
    )
    .await;
}
