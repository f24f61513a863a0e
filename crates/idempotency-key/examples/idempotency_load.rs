//! Load harness for the Idempotency-Key layer: requests/s and latency percentiles for first
//! executions and for replays, beside the same handler without the layer.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/ \
//!     cargo run --release -p idempotency-key --example idempotency_load -- --connections 32 --seconds 10
//! ```
//!
//! Creates a scratch database `idem_bench_<uuid>` (dropped at the end) and a Redis prefix,
//! serves a trivial JSON handler on 127.0.0.1:0 in this process and drives it over
//! `--connections` keep-alive HTTP/1.1 connections, one request in flight on each. Scenarios:
//! `plain` (no layer), `first-pg` / `first-redis` (a new key per request), `replay-pg` /
//! `replay-redis` (keys executed in a warm-up, then repeated). With a handler that writes one
//! row (the checkout example's provider stub: one insert, no unique key of its own):
//! `insert-plain` (no layer), `insert-first` (behind the layer, the row committed on its own) and
//! `insert-first-tx` (the transactional mode: the row and the stored response in one commit).
//! Load generator and server share the machine, so the figures are a lower bound for the server
//! alone.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idempotency_key::{
    GroupOptions, IdempotencyLayer, IdempotentTx, PgIdempotencyStore, RedisCache,
};
// The store's statement counter (statements per request), the crate's `test-util`.
use idempotency_key::test_util::StoreProtocol;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};

#[derive(Debug, Parser)]
struct Args {
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds per scenario.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Keys per connection executed in the warm-up and then replayed.
    #[arg(long, default_value_t = 64)]
    replay_keys: usize,
    /// PostgreSQL pool size of the server.
    #[arg(long, default_value_t = 32)]
    pool: u32,
    /// `synchronous_commit` of the scratch database (`on` is the durable default; `off` shows
    /// how much of the cost is the WAL flush).
    #[arg(long, default_value = "on")]
    synchronous_commit: String,
    /// Most claims plus completions per grouped statement; 0 writes one statement per request.
    /// Default: the store's default (`GroupOptions::default()`).
    #[arg(long)]
    group_max: Option<usize>,
    /// Grouped statements in flight (partitions of the key space, one writer each). Default:
    /// the store's default.
    #[arg(long)]
    group_writers: Option<usize>,
    /// Run in this existing database (its tables are created if missing) and keep it, so that
    /// `bench/ceilings.sh` can run pgbench on the same tables; default: a scratch database,
    /// dropped at the end.
    #[arg(long)]
    database: Option<String>,
    /// Let the pool ping each connection before lending it (sqlx's default,
    /// `test_before_acquire`): one more round trip per transaction, to measure what it costs.
    #[arg(long)]
    ping_on_acquire: bool,
    /// Scenarios to run (comma-separated).
    #[arg(
        long,
        default_value = "plain,first-pg,first-redis,replay-pg,replay-redis,insert-plain,insert-first,insert-first-tx"
    )]
    scenarios: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    None,
    Fresh,
    Replay,
}

struct Outcome {
    requests: u64,
    bad: u64,
    replayed: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

async fn handler() -> (StatusCode, [(&'static str, &'static str); 1], &'static str) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        r#"{"id":"pay_1","status":"succeeded"}"#,
    )
}

/// The provider stub's work: one row, committed on its own.
async fn insert_handler(
    axum::extract::State(pool): axum::extract::State<sqlx::PgPool>,
) -> (StatusCode, String) {
    match pool.acquire().await {
        Ok(mut conn) => insert_charge(&mut conn).await,
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The same, in the transaction the layer commits with the stored response.
async fn insert_handler_tx(mut tx: IdempotentTx) -> (StatusCode, String) {
    insert_charge(&mut tx).await
}

async fn insert_charge(conn: &mut PgConnection) -> (StatusCode, String) {
    let id: Result<i64, _> = sqlx::query_scalar(
        "INSERT INTO bench_charges (merchant, amount, currency) VALUES ('acct_bench', 4200, 'eur') RETURNING id",
    )
    .fetch_one(conn)
    .await;
    match id {
        Ok(id) => (
            StatusCode::CREATED,
            format!(r#"{{"id":"ch_{id}","status":"succeeded"}}"#),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn serve(router: Router) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

async fn drive(
    addr: SocketAddr,
    connections: usize,
    duration: Duration,
    keys: Keys,
    tag: &str,
    replay_keys: usize,
) -> anyhow::Result<Outcome> {
    let requests = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let replayed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (requests, bad, replayed) = (requests.clone(), bad.clone(), replayed.clone());
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut i: u64 = 0;
            while Instant::now() < end {
                i += 1;
                let mut req = hyper::Request::post(format!("http://{addr}/v1/payments"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer acct_bench");
                match keys {
                    Keys::None => {}
                    Keys::Fresh => {
                        req = req.header("idempotency-key", format!("{tag}-{c}-{i}"));
                    }
                    Keys::Replay => {
                        let k = i as usize % replay_keys;
                        req = req.header("idempotency-key", format!("{tag}-{c}-{k}"));
                    }
                }
                let req = req.body(Full::new(Bytes::from_static(
                    br#"{"amount":4200,"currency":"eur"}"#,
                )))?;
                sender.ready().await?;
                let t = Instant::now();
                let resp = sender.send_request(req).await?;
                let status = resp.status();
                let was_replay = resp.headers().contains_key("idempotent-replayed");
                resp.into_body().collect().await?;
                hist.record(t.elapsed().as_micros() as u64)?;
                requests.fetch_add(1, Ordering::Relaxed);
                if status != StatusCode::CREATED {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                if was_replay {
                    replayed.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(hist)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        hist.add(t.await??)?;
    }
    Ok(Outcome {
        requests: requests.load(Ordering::Relaxed),
        bad: bad.load(Ordering::Relaxed),
        replayed: replayed.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
        hist,
    })
}

fn report(name: &str, o: &Outcome) {
    let rps = o.requests as f64 / o.elapsed.as_secs_f64();
    println!(
        "{name:<13} {rps:>10.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms  max {:>7.2} ms  requests {:>8}  non-201 {:>6}  replayed {:>8}",
        o.hist.value_at_quantile(0.50) as f64 / 1000.0,
        o.hist.value_at_quantile(0.99) as f64 / 1000.0,
        o.hist.value_at_quantile(0.999) as f64 / 1000.0,
        o.hist.max() as f64 / 1000.0,
        o.requests,
        o.bad,
        o.replayed,
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let db = args
        .database
        .clone()
        .unwrap_or_else(|| format!("idem_bench_{id}"));
    let mut admin = PgConnection::connect(&admin_url).await?;
    if args.database.is_none() {
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut admin)
            .await?;
    }
    anyhow::ensure!(
        matches!(args.synchronous_commit.as_str(), "on" | "off" | "local"),
        "--synchronous-commit must be on, off or local"
    );
    sqlx::query(&format!(
        "ALTER DATABASE {db} SET synchronous_commit = {}",
        args.synchronous_commit
    ))
    .execute(&mut admin)
    .await?;
    let url = match admin_url.rfind('/') {
        Some(i) => format!("{}/{db}", &admin_url[..i]),
        None => anyhow::bail!("DATABASE_URL has no database part"),
    };
    let result = run(&args, &url, &redis_url, &id).await;
    if args.database.is_none() {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .execute(&mut admin)
            .await?;
    }
    if let Ok(client) = redis::Client::open(redis_url.as_str()) {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("idem_bench:{id}:*"))
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            for chunk in keys.chunks(1000) {
                let _: Result<i64, _> = redis::cmd("DEL").arg(chunk).query_async(&mut c).await;
            }
        }
    }
    result
}

async fn run(args: &Args, url: &str, redis_url: &str, id: &str) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(args.pool)
        .test_before_acquire(args.ping_on_acquire)
        .connect(url)
        .await?;
    idempotency_key::migrate(&pool).await?;
    let defaults = GroupOptions::default();
    let grouping = (args.group_max != Some(0)).then_some(GroupOptions {
        max_batch: args.group_max.unwrap_or(defaults.max_batch),
        writers: args.group_writers.unwrap_or(defaults.writers),
        ..defaults
    });
    let store = PgIdempotencyStore::new(pool.clone()).with_grouping(grouping);
    let redis = RedisCache::new(redis_url, format!("idem_bench:{id}"))?;
    let account = |p: &http::request::Parts| {
        p.headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let plain = serve(Router::new().route("/v1/payments", post(handler))).await?;
    let pg_only = serve(
        Router::new().route("/v1/payments", post(handler)).layer(
            IdempotencyLayer::builder(store.clone())
                .account(account)
                .build(),
        ),
    )
    .await?;
    let with_redis = serve(
        Router::new().route("/v1/payments", post(handler)).layer(
            IdempotencyLayer::builder(store.clone())
                .account(account)
                .redis(redis)
                .build(),
        ),
    )
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_charges (id BIGSERIAL PRIMARY KEY, merchant TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&pool)
    .await?;
    let pg_layer = || {
        IdempotencyLayer::builder(store.clone())
            .account(account)
            .build()
    };
    let insert_plain = serve(
        Router::new()
            .route("/v1/payments", post(insert_handler))
            .with_state(pool.clone()),
    )
    .await?;
    let insert_first = serve(
        Router::new()
            .route("/v1/payments", post(insert_handler))
            .layer(pg_layer())
            .with_state(pool.clone()),
    )
    .await?;
    let insert_first_tx = serve(
        Router::new()
            .route("/v1/payments", post(insert_handler_tx))
            .layer(pg_layer()),
    )
    .await?;
    let d = Duration::from_secs(args.seconds);
    let n = args.connections;
    // Keys are unique to this run: a kept `--database` sees several runs.
    let run_tag = |scenario: &str| format!("{}-{scenario}", &id[..8]);
    println!(
        "connections {n}, {} s per scenario, server pool {}, synchronous_commit {}, grouping {:?}",
        args.seconds, args.pool, args.synchronous_commit, grouping
    );
    for scenario in args.scenarios.split(',').map(str::trim) {
        let q0 = store.query_count();
        let o = match scenario {
            "plain" => drive(plain, n, d, Keys::None, &run_tag("plain"), 1).await?,
            "first-pg" => drive(pg_only, n, d, Keys::Fresh, &run_tag("fpg"), 1).await?,
            "first-redis" => drive(with_redis, n, d, Keys::Fresh, &run_tag("fr"), 1).await?,
            "insert-plain" => drive(insert_plain, n, d, Keys::None, &run_tag("ip"), 1).await?,
            "insert-first" => drive(insert_first, n, d, Keys::Fresh, &run_tag("if"), 1).await?,
            "insert-first-tx" => {
                drive(insert_first_tx, n, d, Keys::Fresh, &run_tag("ift"), 1).await?
            }
            "replay-pg" | "replay-redis" => {
                let addr = if scenario == "replay-pg" {
                    pg_only
                } else {
                    with_redis
                };
                let tag = run_tag(&format!("rp-{scenario}"));
                // Warm-up: execute every key once (each connection its own keys).
                let mut warm = Vec::new();
                for c in 0..n {
                    let tag = tag.clone();
                    let keys = args.replay_keys;
                    warm.push(tokio::spawn(async move {
                        let client = reqwest::Client::new();
                        for k in 0..keys {
                            client
                                .post(format!("http://{addr}/v1/payments"))
                                .header("content-type", "application/json")
                                .header("authorization", "Bearer acct_bench")
                                .header("idempotency-key", format!("{tag}-{c}-{k}"))
                                .body(r#"{"amount":4200,"currency":"eur"}"#)
                                .send()
                                .await?;
                        }
                        anyhow::Ok(())
                    }));
                }
                for w in warm {
                    w.await??;
                }
                let q = store.query_count();
                let o = drive(addr, n, d, Keys::Replay, &tag, args.replay_keys).await?;
                println!(
                    "  ({scenario}: PostgreSQL statements during the measured replays: {})",
                    store.query_count() - q
                );
                o
            }
            other => anyhow::bail!("unknown scenario {other}"),
        };
        report(scenario, &o);
        if scenario.contains("first") && o.requests > 0 {
            println!(
                "  (PostgreSQL statements per first execution: {:.2})",
                (store.query_count() - q0) as f64 / o.requests as f64
            );
        }
    }
    Ok(())
}
