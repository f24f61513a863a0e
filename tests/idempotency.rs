//! Idempotency-Key layer (issue 3) against the real PostgreSQL and Redis, with the real router
//! served on port 0. Every test owns a database `idem_<uuid>` and a Redis key prefix.

mod idempotency_support;
// The fault proxy of the binary suites, in front of Redis.
#[allow(dead_code)]
#[path = "common/fault_proxy.rs"]
mod fault_proxy;
#[path = "idempotency_support/redis_faults.rs"]
mod redis_faults;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use dedup_worker::idempotency::example::{self, CheckoutState, PaymentRequest};
use dedup_worker::idempotency::{
    Claim, ErrorStyle, Fingerprint, GroupOptions, IdempotencyLayer, IdempotentClient, Ownership,
    PgIdempotencyStore, RetryPolicy, StoredResponse,
};
use http::{HeaderMap, Method, StatusCode};
use idempotency_support::{poll, serve, Counting, PgGate, TestEnv};
use serde_json::{json, Value};

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
    http: &reqwest::Client,
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

fn layer(env: &TestEnv) -> dedup_worker::idempotency::IdempotencyLayerBuilder {
    layer_on(env.store())
}

/// [`layer`], with the Redis fast path when `with_redis`.
fn layer_with_redis_if(
    env: &TestEnv,
    with_redis: bool,
) -> dedup_worker::idempotency::IdempotencyLayerBuilder {
    let b = layer(env);
    if with_redis {
        b.redis(env.redis())
    } else {
        b
    }
}

fn layer_on(store: PgIdempotencyStore) -> dedup_worker::idempotency::IdempotencyLayerBuilder {
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

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_same_body_replays_status_headers_body_and_runs_once() {
    let env = TestEnv::new().await;
    for with_redis in [false, true] {
        let h = Counting::default();
        let addr = app(&env, &h, layer_with_redis_if(&env, with_redis).build()).await;
        let c = http();
        let key = format!("same-{with_redis}");
        let first = post(
            &c,
            addr,
            Some(&key),
            None,
            r#"{"amount":100,"currency":"eur","meta":{"a":1,"b":2}}"#,
        )
        .await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.replayed());
        // Same JSON, other key order and whitespace: the same request.
        let second = post(
            &c,
            addr,
            Some(&key),
            None,
            "{ \"meta\": {\"b\":2, \"a\":1}, \"currency\": \"eur\",\n \"amount\": 100 }",
        )
        .await;
        assert_eq!(second.status, StatusCode::CREATED);
        assert!(second.replayed(), "second request must be a replay");
        assert_eq!(second.body, first.body);
        assert_eq!(second.header("location"), first.header("location"));
        assert_eq!(second.header("x-order-run"), Some("1"));
        assert_eq!(second.header("content-type"), Some("application/json"));
        assert!(
            second.header("date").is_some(),
            "date is regenerated, not replayed"
        );
        assert_eq!(h.runs(), 1, "handler ran once");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_different_body_is_422_and_stored_result_is_untouched() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).redis(env.redis()).build()).await;
    let c = http();
    let first = post(&c, addr, Some("k-reuse"), None, r#"{"amount":100}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);

    let other = post(&c, addr, Some("k-reuse"), None, r#"{"amount":200}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(other.body["title"], "Idempotency-Key is already used");
    assert_eq!(other.body["status"], 422);

    // Also decided by PostgreSQL alone (Redis emptied).
    env.flush_redis().await;
    let other = post(&c, addr, Some("k-reuse"), None, r#"{"amount":200}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);

    let again = post(&c, addr, Some("k-reuse"), None, r#"{"amount":100}"#).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(
        again.body, first.body,
        "stored result untouched by the refused reuse"
    );
    assert_eq!(h.runs(), 1);

    // Stripe-compatible error style.
    let h2 = Counting::default();
    let addr2 = app(
        &env,
        &h2,
        layer(&env)
            .error_style(ErrorStyle::Stripe)
            .account(|_| Some("stripe-style".into()))
            .build(),
    )
    .await;
    post(&c, addr2, Some("k-s"), None, r#"{"amount":1}"#).await;
    let r = post(&c, addr2, Some("k-s"), None, r#"{"amount":2}"#).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["error"]["type"], "idempotency_error");
    assert!(r.body["error"]["message"].as_str().is_some());
    env.cleanup().await;
}

/// While the first request runs, the same key with another body is 422 (not a 409 that
/// invites a retry of the wrong request) and the same request is 409 with `Retry-After`;
/// decided by the Redis lock when there is one, by PostgreSQL otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_request_runs_another_request_is_422_and_a_duplicate_409() {
    let env = TestEnv::new().await;
    for with_redis in [true, false] {
        let h = Counting::gated();
        let addr = app(&env, &h, layer_with_redis_if(&env, with_redis).build()).await;
        let c = http();
        let key = format!("running-{with_redis}");
        let first = {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move { post(&c, addr, Some(&key), None, r#"{"amount":100}"#).await })
        };
        poll(Duration::from_secs(10), || {
            let runs = h.runs();
            async move { (runs == 1).then_some(()) }
        })
        .await;

        let other = post(&c, addr, Some(&key), None, r#"{"amount":200}"#).await;
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "redis: {with_redis}"
        );
        assert_eq!(other.body["title"], "Idempotency-Key is already used");
        let duplicate = post(&c, addr, Some(&key), None, r#"{"amount":100}"#).await;
        assert_eq!(
            duplicate.status,
            StatusCode::CONFLICT,
            "redis: {with_redis}"
        );
        assert!(duplicate.header("retry-after").is_some());

        h.gate.as_ref().unwrap().add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        assert_eq!(h.runs(), 1);
    }
    env.cleanup().await;
}

/// A client that gives up does not cancel its request: it runs on detached, `drain` waits for
/// it at shutdown, and its result is stored for the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_a_request_whose_client_went_away() {
    let env = TestEnv::new().await;
    let h = Counting::gated();
    let layer = layer(&env).build();
    let addr = app(&env, &h, layer.clone()).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("http://{addr}/orders"))
        .header("idempotency-key", "k-detached")
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#)
        .send()
        .await;
    assert!(
        gave_up.is_err(),
        "the client timed out while the handler was held"
    );
    assert_eq!(h.runs(), 1);

    assert!(
        !layer.drain(Duration::from_millis(200)).await,
        "the detached request is still running"
    );
    h.gate.as_ref().unwrap().add_permits(1);
    assert!(layer.drain(Duration::from_secs(10)).await);

    let retry = post(&http(), addr, Some("k-detached"), None, r#"{"amount":100}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the detached run stored its result");
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_presence_length_and_forms() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).build()).await;
    let c = http();

    let missing = post(&c, addr, None, None, "{}").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.body["title"], "Idempotency-Key is missing");

    let long = "k".repeat(256);
    let r = post(&c, addr, Some(&long), None, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let max = "k".repeat(255);
    let r = post(&c, addr, Some(&max), None, "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = post(&c, addr, Some(&max), None, "{}").await;
    assert!(r.replayed());

    // Quoted sf-string (IETF) and bare token (Stripe) are one key.
    let quoted = post(
        &c,
        addr,
        Some("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""),
        None,
        "{}",
    )
    .await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    assert!(!quoted.replayed());
    let bare = post(
        &c,
        addr,
        Some("8e03978e-40d5-43e8-bc93-6894a57f9324"),
        None,
        "{}",
    )
    .await;
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);

    // Not visible ASCII, and the header twice: 400.
    let r = post(&c, addr, Some("has space"), None, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = c
        .post(format!("http://{addr}/orders"))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(h.runs(), 2);

    // GET is not covered: no key needed, never replayed.
    let g = c.get(format!("http://{addr}/orders")).send().await.unwrap();
    assert_eq!(g.status(), StatusCode::OK);
    assert!(g.headers().get("idempotent-replayed").is_none());

    // Optional keys: requests without one pass straight through.
    let h2 = Counting::default();
    let addr2 = app(&env, &h2, layer(&env).key_required(false).build()).await;
    assert_eq!(
        post(&c, addr2, None, None, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        post(&c, addr2, None, None, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(h2.runs(), 2);
    env.cleanup().await;
}

async fn hundred_at_once(env: &TestEnv, h: &Counting, addr: SocketAddr, key: &str) -> Vec<Reply> {
    let c = http();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let c = c.clone();
        let key = key.to_owned();
        set.spawn(async move { post(&c, addr, Some(&key), None, r#"{"amount":5}"#).await });
    }
    let mut replies = Vec::new();
    if let Some(gate) = &h.gate {
        // The one execution is held inside the handler: every other request must be refused.
        while replies.len() < 99 {
            // Bounded: a second execution would block on the gate, which must fail, not hang.
            let next = tokio::time::timeout(Duration::from_secs(60), set.join_next())
                .await
                .expect("a request hung: a second execution is waiting on the gate");
            replies.push(next.unwrap().unwrap());
        }
        gate.add_permits(1);
    }
    while let Some(r) = set.join_next().await {
        replies.push(r.unwrap());
    }
    let _ = env;
    replies
}

fn check_hundred(replies: &[Reply], h: &Counting) {
    assert_eq!(replies.len(), 100);
    assert_eq!(h.runs(), 1, "handler must run exactly once");
    let executed: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1);
    for r in replies {
        match r.status {
            StatusCode::CONFLICT => {
                let ra: u64 = r
                    .header("retry-after")
                    .expect("Retry-After on 409")
                    .parse()
                    .unwrap();
                assert!(ra >= 1);
                assert_eq!(
                    r.body["title"],
                    "A request is outstanding for this Idempotency-Key"
                );
            }
            StatusCode::CREATED => assert_eq!(r.body, executed[0].body),
            other => panic!("unexpected status {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_requests_one_key_run_once() {
    let env = TestEnv::new().await;
    // PostgreSQL alone, the execution held open: 99 × 409, then the one 201.
    let h = Counting::gated();
    let addr = app(&env, &h, layer(&env).build()).await;
    let replies = hundred_at_once(&env, &h, addr, "k-100-pg").await;
    check_hundred(&replies, &h);
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.status == StatusCode::CONFLICT)
            .count(),
        99
    );

    // With Redis, free running: each answer is the execution, a 409 or the replay.
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).redis(env.redis()).build()).await;
    let replies = hundred_at_once(&env, &h, addr, "k-100-redis").await;
    check_hundred(&replies, &h);

    // Redis stopped: PostgreSQL decides, still once.
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).redis(env.dead_redis()).build()).await;
    let replies = hundred_at_once(&env, &h, addr, "k-100-dead-redis").await;
    check_hundred(&replies, &h);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_under_two_accounts_is_two_requests() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).redis(env.redis()).build()).await;
    let c = http();
    let a = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_a"),
        r#"{"amount":1}"#,
    )
    .await;
    let b = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_b"),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_ne!(a.body, b.body);
    assert_eq!(h.runs(), 2);
    let a2 = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_a"),
        r#"{"amount":1}"#,
    )
    .await;
    let b2 = post(
        &c,
        addr,
        Some("shared-key"),
        Some("acct_b"),
        r#"{"amount":1}"#,
    )
    .await;
    assert!(a2.replayed() && b2.replayed());
    assert_eq!(a2.body["account"], "acct_a");
    assert_eq!(b2.body["account"], "acct_b");
    assert_eq!(h.runs(), 2);
    // A caller the extractor cannot identify is refused, never pooled with others.
    let anonymous = post(
        &c,
        addr,
        Some("shared-key"),
        Some("none"),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(h.runs(), 2);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_ttl_a_key_executes_again_and_expired_rows_are_deleted() {
    let env = TestEnv::new().await;
    for with_redis in [false, true] {
        let h = Counting::default();
        let b = layer_with_redis_if(&env, with_redis).ttl(Duration::from_secs(1));
        let addr = app(&env, &h, b.build()).await;
        let c = http();
        let key = format!("k-ttl-{with_redis}");
        let first = post(&c, addr, Some(&key), None, "{}").await;
        assert_eq!(first.status, StatusCode::CREATED);
        // Within the TTL every answer is the replay; once it has passed, a new execution.
        let fresh = poll(Duration::from_secs(20), || {
            let c = c.clone();
            let key = key.clone();
            async move {
                let r = post(&c, addr, Some(&key), None, "{}").await;
                assert_eq!(r.status, StatusCode::CREATED);
                (!r.replayed()).then_some(r)
            }
        })
        .await;
        assert_eq!(fresh.header("x-order-run"), Some("2"));
        assert_eq!(h.runs(), 2);
    }

    // Batch deletion: five expired keys, two per statement.
    let store = env.store();
    let fp = Fingerprint([1; 32]);
    for i in 0..5 {
        let k = format!("gc-{i}");
        let Claim::Acquired(t) = store
            .claim(
                "gc",
                &k,
                &fp,
                Duration::from_secs(30),
                Duration::from_millis(200),
            )
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        store
            .complete("gc", &k, t, &stored(200, "x"))
            .await
            .unwrap();
    }
    let gc_count = |expired_only: bool| {
        let pool = env.pool.clone();
        async move {
            let sql = if expired_only {
                "SELECT count(*) FROM idempotency_keys WHERE account = 'gc' AND expires_at <= now()"
            } else {
                "SELECT count(*) FROM idempotency_keys WHERE account = 'gc'"
            };
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    poll(Duration::from_secs(20), || async {
        (gc_count(true).await == 5).then_some(())
    })
    .await;
    let deleted = store.delete_expired(2).await.unwrap();
    assert!(deleted >= 5, "all expired rows deleted, {deleted}");
    assert_eq!(gc_count(false).await, 0);

    // The spawnable background task does the same.
    for i in 0..3 {
        let k = format!("gc-task-{i}");
        let Claim::Acquired(t) = store
            .claim(
                "gc",
                &k,
                &fp,
                Duration::from_secs(30),
                Duration::from_millis(200),
            )
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        store
            .complete("gc", &k, t, &stored(200, "x"))
            .await
            .unwrap();
    }
    let task = store.spawn_expiry_task(Duration::from_millis(100), 2);
    poll(Duration::from_secs(20), || async {
        (gc_count(false).await == 0).then_some(())
    })
    .await;
    task.abort();
    env.cleanup().await;
}

fn stored(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.to_owned().into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declined_402_is_replayed_and_5xx_releases_the_key() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).redis(env.redis()).build()).await;
    let c = http();

    let d1 = post(&c, addr, Some("k-402"), None, r#"{"mode":"declined"}"#).await;
    assert_eq!(d1.status, StatusCode::PAYMENT_REQUIRED);
    let d2 = post(&c, addr, Some("k-402"), None, r#"{"mode":"declined"}"#).await;
    assert_eq!(d2.status, StatusCode::PAYMENT_REQUIRED);
    assert!(d2.replayed(), "a declined card stays declined");
    assert_eq!(d2.body, d1.body);
    assert_eq!(h.runs(), 1);

    let f1 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(f1.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!f1.replayed());
    let f2 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert_eq!(f2.status, StatusCode::CREATED, "the retry executes");
    assert!(!f2.replayed());
    assert_eq!(h.runs(), 3);
    let f3 = post(&c, addr, Some("k-5xx"), None, r#"{"mode":"fail_once"}"#).await;
    assert!(f3.replayed());
    assert_eq!(h.runs(), 3);

    // 429 (like 408, 409 and 425) says "not now", not "this is the outcome": not stored.
    let t1 = post(&c, addr, Some("k-429"), None, r#"{"mode":"busy_once"}"#).await;
    assert_eq!(t1.status, StatusCode::TOO_MANY_REQUESTS);
    let t2 = post(&c, addr, Some("k-429"), None, r#"{"mode":"busy_once"}"#).await;
    assert_eq!(
        t2.status,
        StatusCode::CREATED,
        "the retry after a 429 executes"
    );
    assert!(!t2.replayed());
    assert_eq!(h.runs(), 5);

    // A refusal the handler marks `NotExecuted` (failed validation) is not stored either: the
    // client corrects the request and retries with the same key.
    let v1 = post(&c, addr, Some("k-invalid"), None, r#"{"mode":"invalid"}"#).await;
    assert_eq!(v1.status, StatusCode::BAD_REQUEST);
    let v2 = post(&c, addr, Some("k-invalid"), None, r#"{"amount":100}"#).await;
    assert_eq!(
        v2.status,
        StatusCode::CREATED,
        "the corrected request executes"
    );
    assert!(!v2.replayed());
    assert_eq!(h.runs(), 7);

    // keep_5xx: Stripe's behaviour, the 500 is replayed.
    let h2 = Counting::default();
    let addr2 = app(
        &env,
        &h2,
        layer(&env)
            .keep_5xx(true)
            .account(|_| Some("keep".into()))
            .build(),
    )
    .await;
    let b1 = post(&c, addr2, Some("k-keep"), None, r#"{"mode":"boom"}"#).await;
    assert_eq!(b1.status, StatusCode::INTERNAL_SERVER_ERROR);
    let b2 = post(&c, addr2, Some("k-keep"), None, r#"{"mode":"boom"}"#).await;
    assert_eq!(b2.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(b2.replayed());
    assert_eq!(h2.runs(), 1);
    env.cleanup().await;
}

/// A server in a runtime of its own, so that dropping the runtime kills it like a crashed
/// process: no completion, no release, the claim just stops being renewed.
struct DoomedServer {
    addr: SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    entered: Arc<AtomicU64>,
}

impl DoomedServer {
    fn start(db_url: String, lease: Duration) -> Self {
        let entered = Arc::new(AtomicU64::new(0));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let e = entered.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let pool = sqlx::PgPool::connect(&db_url).await.unwrap();
                let layer = IdempotencyLayer::builder(PgIdempotencyStore::new(pool))
                    .lease(lease)
                    .build();
                let router = Router::new()
                    .route(
                        "/orders",
                        axum::routing::post(move || {
                            let e = e.clone();
                            async move {
                                e.fetch_add(1, Ordering::SeqCst);
                                // Mid-handler when the process dies.
                                std::future::pending::<()>().await;
                                StatusCode::CREATED
                            }
                        }),
                    )
                    .layer(layer);
                let addr = serve(router).await;
                addr_tx.send(addr).unwrap();
                let _ = kill_rx.await;
            });
            // Dropping the runtime drops every task: the process is gone.
            drop(rt);
        });
        let addr = addr_rx.recv().unwrap();
        Self {
            addr,
            kill: Some(kill_tx),
            thread: Some(thread),
            entered,
        }
    }

    fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_request_holds_the_key_until_its_lease_ends_then_one_retry_runs() {
    let env = TestEnv::new().await;
    let lease = Duration::from_secs(5);
    let doomed = DoomedServer::start(env.url.clone(), lease);
    let c = http();
    let doomed_addr = doomed.addr;
    let c2 = c.clone();
    let in_flight = tokio::spawn(async move {
        let _ = c2
            .post(format!("http://{doomed_addr}/orders"))
            .header("idempotency-key", "k-crash")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await;
    });
    let entered = doomed.entered.clone();
    poll(Duration::from_secs(20), || {
        let entered = entered.clone();
        async move { (entered.load(Ordering::SeqCst) == 1).then_some(()) }
    })
    .await;
    doomed.kill();
    let _ = in_flight.await;

    // A healthy replica of the service, same database.
    let h = Counting::default();
    let addr = app(
        &env,
        &h,
        IdempotencyLayer::builder(env.store()).lease(lease).build(),
    )
    .await;
    let refused = post(&c, addr, Some("k-crash"), None, "{}").await;
    assert_eq!(
        refused.status,
        StatusCode::CONFLICT,
        "refused while the lease runs"
    );
    assert!(refused.header("retry-after").is_some());
    assert_eq!(h.runs(), 0);

    // Retry (as a client honouring Retry-After would) until the lease has lapsed.
    let done = poll(Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let r = post(&c, addr, Some("k-crash"), None, "{}").await;
            match r.status {
                StatusCode::CONFLICT => {
                    assert!(r.header("retry-after").is_some());
                    None
                }
                _ => Some(r),
            }
        }
    })
    .await;
    assert_eq!(done.status, StatusCode::CREATED);
    assert!(!done.replayed());
    assert_eq!(h.runs(), 1, "taken over by exactly one retry");
    let again = post(&c, addr, Some("k-crash"), None, "{}").await;
    assert!(again.replayed());
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_lease_was_taken_over_cannot_complete_or_release() {
    let env = TestEnv::new().await;
    let store = env.store();
    let fp = Fingerprint([9; 32]);
    let lease = Duration::from_millis(300);
    let ttl = Duration::from_secs(3600);
    let Claim::Acquired(old) = store.claim("a", "k", &fp, lease, ttl).await.unwrap() else {
        panic!("first claim")
    };
    // Another fingerprint never takes over, even after the lease (while the key's TTL runs).
    let other = Fingerprint([8; 32]);
    poll(Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let lapsed: bool = sqlx::query_scalar(
                "SELECT locked_until <= now() FROM idempotency_keys WHERE account = 'a' AND key = 'k'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            lapsed.then_some(())
        }
    })
    .await;
    assert!(matches!(
        store.claim("a", "k", &other, lease, ttl).await.unwrap(),
        Claim::InProgress { fingerprint, .. } if fingerprint == fp
    ));
    let new = poll(Duration::from_secs(20), || {
        let store = store.clone();
        async move {
            match store.claim("a", "k", &fp, lease, ttl).await.unwrap() {
                Claim::Acquired(t) => Some(t),
                Claim::InProgress { .. } => None,
                Claim::Completed { .. } => panic!("nothing completed"),
            }
        }
    })
    .await;
    assert!(matches!(
        store.claim("a", "k", &other, lease, ttl).await.unwrap(),
        Claim::InProgress { fingerprint, .. } if fingerprint == fp
    ));
    assert_eq!(
        store
            .complete("a", "k", old, &stored(201, "old"))
            .await
            .unwrap(),
        Ownership::Lost
    );
    assert_eq!(store.release("a", "k", old).await.unwrap(), Ownership::Lost);
    assert!(matches!(
        store
            .complete("a", "k", new, &stored(201, "new"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
    match store.claim("a", "k", &fp, lease, ttl).await.unwrap() {
        Claim::Completed { response, .. } => assert_eq!(&response.body[..], b"new"),
        other => panic!("expected the new holder's result, got {other:?}"),
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_claim_past_its_ttl_is_neither_taken_over_nor_collected() {
    let env = TestEnv::new().await;
    let store = env.store();
    let fp = Fingerprint([7; 32]);
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_millis(200);
    let Claim::Acquired(token) = store.claim("a", "slow", &fp, lease, ttl).await.unwrap() else {
        panic!("first claim")
    };
    poll(Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let expired: bool = sqlx::query_scalar(
                "SELECT expires_at <= now() FROM idempotency_keys WHERE account = 'a' AND key = 'slow'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            expired.then_some(())
        }
    })
    .await;
    for fingerprint in [fp, Fingerprint([6; 32])] {
        assert!(
            matches!(
                store
                    .claim("a", "slow", &fingerprint, lease, ttl)
                    .await
                    .unwrap(),
                Claim::InProgress { .. }
            ),
            "a live lease wins over an expired TTL"
        );
    }
    assert_eq!(
        store.delete_expired(100).await.unwrap(),
        0,
        "a running claim is not collected"
    );
    assert!(matches!(
        store
            .complete("a", "slow", token, &stored(201, "done"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replays_skip_postgres_and_a_flushed_or_stopped_redis_changes_nothing() {
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
    poll(Duration::from_secs(20), || {
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

/// Loses the first `n` responses on their way to the client: the handler has finished, the
/// status line goes out, then the body fails and the connection is cut.
#[derive(Clone)]
struct Lose(Arc<AtomicU64>);

async fn lose_response(State(lose): State<Lose>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let lost = lose
        .0
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !lost {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    let broken = futures::stream::once(async {
        Err::<axum::body::Bytes, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "response lost",
        ))
    });
    Response::from_parts(parts, Body::from_stream(broken))
}

fn quick_client() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
        max_retries: 6,
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
        max_retry_after: Duration::from_secs(2),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_charge_timeline_a_lost_response_and_a_retry_charge_once() {
    let env = TestEnv::new().await;
    let provider_lost = Arc::new(AtomicU64::new(1));
    let checkout_lost = Arc::new(AtomicU64::new(1));

    // The provider stub, itself behind the layer; its first response to checkout is lost too.
    let provider_layer = IdempotencyLayer::builder(env.store())
        .account(example::provider_account)
        .redis(env.redis())
        .build();
    let provider = example::provider_router(env.pool.clone(), provider_layer).layer(
        middleware::from_fn_with_state(Lose(provider_lost.clone()), lose_response),
    );
    let provider_addr = serve(provider).await;

    let checkout_layer = IdempotencyLayer::builder(env.store())
        .account(example::checkout_account)
        .redis(env.redis())
        .build();
    let state = CheckoutState {
        pool: env.pool.clone(),
        provider_url: format!("http://{provider_addr}"),
        client: quick_client(),
    };
    let checkout = example::checkout_router(state, checkout_layer).layer(
        middleware::from_fn_with_state(Lose(checkout_lost.clone()), lose_response),
    );
    let checkout_addr = serve(checkout).await;

    // The client: one key for the payment, retried with it.
    let client = quick_client();
    let pay = PaymentRequest {
        amount: 4200,
        currency: "eur".into(),
        source: "tok_visa".into(),
    };
    let url = format!("http://{checkout_addr}/v1/payments");
    let resp = client.post_json(&url, Some("acct_1"), &pay).await.unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    assert_eq!(resp.attempts, 2, "first response lost, retried once");
    assert!(resp.replayed(), "the retry got the stored payment");
    assert_eq!(
        provider_lost.load(Ordering::SeqCst),
        0,
        "provider response was lost once"
    );
    assert_eq!(
        checkout_lost.load(Ordering::SeqCst),
        0,
        "checkout response was lost once"
    );

    let http = reqwest::Client::new();
    let payments: Value = http
        .get(&url)
        .bearer_auth("acct_1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(payments["data"].as_array().unwrap().len(), 1, "one payment");
    assert_eq!(payments["data"][0]["idempotency_key"], resp.key.as_str());
    let charges: Value = http
        .get(format!("http://{provider_addr}/v1/charges"))
        .bearer_auth("acct_1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        charges["data"].as_array().unwrap().len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(charges["data"][0]["idempotency_key"], resp.key.as_str());
    assert_eq!(
        charges["data"][0]["executions"], 1,
        "the provider's charge code ran once: its layer replayed the retry"
    );

    // A second operation is a new key and a second charge; a declined card is final (402).
    let resp2 = client.post_json(&url, Some("acct_1"), &pay).await.unwrap();
    assert_eq!(resp2.status, StatusCode::CREATED);
    assert_ne!(resp2.key, resp.key);
    let declined = PaymentRequest {
        source: "tok_chargeDeclined".into(),
        ..pay.clone()
    };
    let d = client
        .post_json(&url, Some("acct_1"), &declined)
        .await
        .unwrap();
    assert_eq!(d.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(d.attempts, 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM provider_charges")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);
    // No bearer: refused before the layer.
    let r = http
        .post(&url)
        .header("idempotency-key", "x")
        .json(&pay)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_helper_retries_with_one_key_and_stops_on_other_4xx() {
    use axum::routing::post as route_post;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Script {
        replies: Arc<Mutex<Vec<u16>>>,
        keys: Arc<Mutex<Vec<String>>>,
    }
    async fn scripted(State(s): State<Script>, headers: HeaderMap) -> Response {
        s.keys.lock().unwrap().push(
            headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
        );
        let status = {
            let mut r = s.replies.lock().unwrap();
            if r.is_empty() {
                200
            } else {
                r.remove(0)
            }
        };
        let mut resp = Response::new(Body::from("{}"));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        if status == 409 {
            resp.headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
        resp
    }
    let client = quick_client();
    for (script, final_status, attempts) in [
        (vec![503, 500, 408, 409, 201], 201, 5),
        (vec![400], 400, 1),
        (vec![402], 402, 1),
        (vec![422], 422, 1),
        (vec![502, 404], 404, 2),
    ] {
        let s = Script::default();
        *s.replies.lock().unwrap() = script.clone();
        let addr = serve(
            Router::new()
                .route("/op", route_post(scripted))
                .with_state(s.clone()),
        )
        .await;
        let r = client
            .post_json(&format!("http://{addr}/op"), None, &json!({"x": 1}))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), final_status, "{script:?}");
        assert_eq!(r.attempts, attempts, "{script:?}");
        let keys = s.keys.lock().unwrap().clone();
        assert_eq!(keys.len(), attempts as usize);
        assert!(
            keys.iter().all(|k| k == r.key.as_str()),
            "one key per operation: {keys:?}"
        );
    }
    // Network errors are retried, then reported.
    let err = client
        .post_json("http://127.0.0.1:1/op", None, &json!({}))
        .await
        .unwrap_err();
    match err {
        dedup_worker::idempotency::ClientError::Network { attempts, .. } => assert_eq!(attempts, 7),
        other => panic!("unexpected {other}"),
    }
    let _ = Method::POST;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_lease_keeps_its_claim() {
    let env = TestEnv::new().await;
    let h = Counting::gated();
    let lease = Duration::from_millis(600);
    let addr = app(&env, &h, layer(&env).lease(lease).build()).await;
    let c = http();
    let c2 = c.clone();
    let first = tokio::spawn(async move { post(&c2, addr, Some("k-slow"), None, "{}").await });
    let hh = h.clone();
    poll(Duration::from_secs(20), || {
        let hh = hh.clone();
        async move { (hh.runs() == 1).then_some(()) }
    })
    .await;
    // Wait (by PostgreSQL's clock) until the claim is older than three leases: only the
    // heartbeat of the live request can have kept it.
    poll(Duration::from_secs(20), || {
        let pool = env.pool.clone();
        async move {
            let old: bool = sqlx::query_scalar(
                "SELECT now() - created_at > interval '1800 milliseconds' FROM idempotency_keys WHERE key = 'k-slow'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            old.then_some(())
        }
    })
    .await;
    let second = post(&c, addr, Some("k-slow"), None, "{}").await;
    assert_eq!(
        second.status,
        StatusCode::CONFLICT,
        "a live request is never taken over"
    );
    assert_eq!(h.runs(), 1);
    h.gate.as_ref().unwrap().add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(post(&c, addr, Some("k-slow"), None, "{}").await.replayed());
    assert_eq!(h.runs(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_413_and_nothing_runs() {
    let env = TestEnv::new().await;
    let h = Counting::default();
    let addr = app(&env, &h, layer(&env).max_body_bytes(64).build()).await;
    let c = http();
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100));
    let r = post(&c, addr, Some("k-big"), None, &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(h.runs(), 0);
    // Nothing was claimed: the key is still free for a request that fits.
    let ok = post(&c, addr, Some("k-big"), None, "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert!(!ok.replayed());
    env.cleanup().await;
}

/// `(seq_tup_read, idx_scan)` of `idempotency_keys` as PostgreSQL's statistics last saw them:
/// rows read by sequential scans, and index scans.
async fn table_reads(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT seq_tup_read, COALESCE(idx_scan, 0) FROM pg_stat_user_tables
          WHERE relname = 'idempotency_keys'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
/// One request's claim and completion through the store (grouped with whatever runs beside it).
async fn claim_and_complete(store: &PgIdempotencyStore, key: String) {
    let fp = Fingerprint([3; 32]);
    let (lease, ttl) = (Duration::from_secs(60), Duration::from_secs(3600));
    let Claim::Acquired(token) = store.claim("acct", &key, &fp, lease, ttl).await.unwrap() else {
        panic!("a new key is claimed")
    };
    assert!(matches!(
        store
            .complete("acct", &key, token, &stored(201, "ok"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
}

/// The grouped statement's plan is made while the table is empty and then reused. Grown to
/// 50,000 rows, the table must still be probed by its primary key, never read whole: left to
/// the planner, that cached plan was a sequential scan feeding a hash join, and first
/// executions slowed down as the table grew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_writes_probe_the_primary_key_after_the_table_has_grown() {
    let env = TestEnv::new().await;
    let store = env.store();
    // Enough statements on the empty table for PostgreSQL to cache a generic plan on every
    // writer connection (it switches after five).
    for i in 0..24 {
        claim_and_complete(&store, format!("warm-{i}")).await;
    }
    sqlx::query(
        "INSERT INTO idempotency_keys (account, key, fingerprint, status, response_status,
                                       response_headers, response_body, expires_at)
         SELECT 'other', 'k' || g, '\\x00', 'completed', 201, '[]', '\\x00',
                now() + interval '1 hour'
           FROM generate_series(1, 50000) g",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let (read_before, idx_before) = table_reads(&env.pool).await;
    let requests = 32;
    let all: Vec<_> = (0..requests)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { claim_and_complete(&store, format!("grown-{i}")).await })
        })
        .collect();
    for request in all {
        request.await.unwrap();
    }
    // Backends report their statistics when idle (within about ten seconds). Each claim
    // probes the index for a conflict and each completion probes it for its row, so
    // `requests * 2` more index scans say the writers' statistics have arrived. (Rows read
    // by sequential scans, not their number, tell a whole-table read: the migration's index
    // builds are sequential scans of the empty table that may be reported late.)
    let (read_after, idx_after) = poll(Duration::from_secs(60), || {
        let pool = env.pool.clone();
        async move {
            let (read, idx) = table_reads(&pool).await;
            (read >= read_before + 50_000 || idx >= idx_before + requests * 2)
                .then_some((read, idx))
        }
    })
    .await;
    assert!(
        read_after - read_before < 50_000,
        "grouped writes read the whole table ({} rows by sequential scans, {} index scans)",
        read_after - read_before,
        idx_after - idx_before
    );
    env.cleanup().await;
}

/// A store outage must be a 503 the client retries, never a success and never a hang: requests
/// made while PostgreSQL has stopped answering are told 503 (problem+json, `Retry-After`) after
/// at most one statement timeout, with nothing executed. The requests queued behind the statement
/// that timed out are refused by the writer's breaker at once, without a statement or a new
/// connection each. When PostgreSQL answers again the same keys execute, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_that_stops_answering_is_503_and_the_breaker_refuses_the_queue() {
    use std::str::FromStr;
    let env = TestEnv::new().await;
    let gate = PgGate::start(&env.url).await;
    let through_gate = sqlx::postgres::PgConnectOptions::from_str(&env.url)
        .expect("url")
        .host("127.0.0.1")
        .port(gate.port);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(through_gate);
    let grouped = PgIdempotencyStore::new(pool.clone()).with_grouping(Some(GroupOptions {
        writers: 1,
        statement_timeout: Duration::from_secs(2),
        ..GroupOptions::default()
    }));
    let h = Counting::default();
    let addr = app(&env, &h, layer_on(grouped.clone()).build()).await;
    let c = http();
    let body = r#"{"amount":100}"#;

    let before = post(&c, addr, Some("before"), None, body).await;
    assert_eq!(before.status, StatusCode::CREATED);
    assert_eq!(h.runs(), 1);

    gate.hang().await;
    let statements = grouped.query_count();
    let send = |key: String| {
        let c = c.clone();
        tokio::spawn(async move { post(&c, addr, Some(&key), None, body).await })
    };
    // The first request's statement goes out on the writer's connection and is never answered.
    let mut waiting = vec![send("during-0".into())];
    poll(Duration::from_secs(10), || async {
        (grouped.query_count() > statements).then_some(())
    })
    .await;
    // These queue behind it.
    waiting.extend((1..=8).map(|i| send(format!("during-{i}"))));
    for reply in waiting {
        let reply = reply.await.expect("request task");
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert!(!reply.replayed());
    }
    assert_eq!(h.runs(), 1, "nothing executed during the outage");
    assert_eq!(
        grouped.query_count() - statements,
        1,
        "the queued requests were refused by the breaker, not sent one statement each"
    );
    assert_eq!(
        gate.accepted_while_hung(),
        0,
        "no connection attempt while the breaker is open"
    );

    // The same outage without grouping: the pool's acquire timeout bounds it.
    let ungrouped = PgIdempotencyStore::new(pool.clone()).with_grouping(None);
    let single = app(&env, &h, layer_on(ungrouped).build()).await;
    let reply = post(&c, single, Some("during-single"), None, body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.runs(), 1);

    // PostgreSQL answers again: once the breaker lets a group through, the refused keys execute.
    gate.open();
    let after = poll(Duration::from_secs(30), || async {
        let reply = post(&c, addr, Some("during-0"), None, body).await;
        (reply.status != StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
    })
    .await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed());
    assert_eq!(h.runs(), 2);
    let replay = post(&c, addr, Some("during-0"), None, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, after.body);
    let other = post(&c, addr, Some("during-1"), None, body).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(
        h.runs(),
        3,
        "each refused key executes once, after the outage"
    );
    drop(gate);
    pool.close().await;
    env.cleanup().await;
}
