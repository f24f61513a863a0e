//! Slow and hostile clients: connections that never finish their headers, or trickle a body a
//! byte at a time, neither delay a webhook nor stay open past the configured timeouts; past the
//! concurrency cap, requests are answered 503 with `Retry-After` at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{post_signed, stripe_event, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_slow";

fn start(db: &TestDb, work: &std::path::Path, extra: &[(&str, &str)]) -> RunningBinary {
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_HTTP__HEADER_READ_TIMEOUT", "4000ms".to_owned()),
        ("DEDUP_HTTP__BODY_READ_TIMEOUT", "4000ms".to_owned()),
        ("DEDUP_HTTP__REQUEST_TIMEOUT", "6000ms".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    RunningBinary::start(&env, work)
}

/// The head of a webhook that announces a body of almost 1 MiB (within the body limit).
fn head_with_body(addr: SocketAddr) -> String {
    format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Stripe-Signature: t=1,v1=00\r\nContent-Length: 1000000\r\n\r\n"
    )
}

/// Connections that were closed by the server, and how long each one had been open.
#[derive(Default)]
struct Closed {
    count: AtomicUsize,
    open_for: Mutex<Vec<Duration>>,
}

/// Opens a connection, sends `first`, then (with `trickle`) one more byte every `trickle`,
/// until the server closes the connection, which it records.
async fn slow_client(
    addr: SocketAddr,
    first: String,
    trickle: Option<Duration>,
    closed: Arc<Closed>,
) -> tokio::task::JoinHandle<()> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(first.as_bytes()).await.expect("send");
    let opened = Instant::now();
    tokio::spawn(async move {
        let (mut read, mut write) = stream.into_split();
        let mut buf = [0u8; 1024];
        let mut tick = tokio::time::interval(trickle.unwrap_or(Duration::from_secs(3600)));
        tick.tick().await;
        loop {
            tokio::select! {
                n = read.read(&mut buf) => match n {
                    Ok(0) | Err(_) => break,
                    // A response (408, 503): the close follows.
                    Ok(_) => {}
                },
                _ = tick.tick(), if trickle.is_some() => {
                    if write.write_all(b"x").await.is_err() {
                        break;
                    }
                }
            }
        }
        closed.open_for.lock().unwrap().push(opened.elapsed());
        closed.count.fetch_add(1, Ordering::SeqCst);
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_slow_clients_neither_delay_a_webhook_nor_stay_connected() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(&db, work.path(), &[]);
    let closed = Arc::new(Closed::default());
    let mut clients = Vec::new();
    for i in 0..300 {
        let (first, trickle) = if i % 2 == 0 {
            // Never finishes its headers.
            (
                format!(
                    "POST /webhooks/stripe HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
                    bin.addr
                ),
                None,
            )
        } else {
            // Finishes its headers, then sends the body a byte per second: no pause is long
            // enough for the body-read timeout, only the request timeout ends it.
            (head_with_body(bin.addr), Some(Duration::from_secs(1)))
        };
        clients.push(slow_client(bin.addr, first, trickle, closed.clone()).await);
    }
    assert_eq!(closed.count.load(Ordering::SeqCst), 0);

    // A webhook is served at once all the same.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let started = Instant::now();
    let body = stripe_event("evt_beside_the_slow", "charge.succeeded");
    let response = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
        .await
        .expect("served while 300 slow clients are connected");
    assert_eq!(response.status(), 200);
    eprintln!(
        "webhook beside 300 slow clients answered in {:?}",
        started.elapsed()
    );

    // Header read 4 s, request 6 s: all are closed by the server soon after.
    bin.wait_for(
        "the server to close all 300 slow connections",
        Duration::from_secs(30),
        || {
            let closed = closed.clone();
            async move { (closed.count.load(Ordering::SeqCst) == 300).then_some(()) }
        },
    )
    .await;
    let longest = closed.open_for.lock().unwrap().iter().max().copied();
    eprintln!("slow connections closed after at most {longest:?}");
    for client in clients {
        client.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_concurrency_cap_requests_are_503_with_retry_after() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let bin = start(
        &db,
        work.path(),
        &[
            ("DEDUP_HTTP__MAX_CONCURRENT_REQUESTS", "2"),
            // Longer than the test: the two hold their places until it lets them go.
            ("DEDUP_HTTP__REQUEST_TIMEOUT", "120000ms"),
        ],
    );
    // Two requests that trickle their bodies take the two places. One that arrives while a
    // request of the loop below holds a place for a moment is refused (and its connection
    // closed): it is replaced, until a request finds both places taken.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = bin.url("/webhooks/stripe");
    let closed = Arc::new(Closed::default());
    let mut holders: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut every = tokio::time::interval(Duration::from_millis(50));
    let refused = loop {
        every.tick().await;
        holders.retain(|holder| !holder.is_finished());
        while holders.len() < 2 {
            let trickle = Some(Duration::from_millis(500));
            holders.push(
                slow_client(bin.addr, head_with_body(bin.addr), trickle, closed.clone()).await,
            );
        }
        let body = stripe_event("evt_past_the_cap", "charge.succeeded");
        if let Ok(response) = post_signed(&client, &url, SECRET, body).await {
            if response.status() == 503 {
                break response;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no request was refused past the cap within 30 s; the binary logged:\n{}",
            bin.stderr()
        );
    };
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        refused
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["type"], "urn:dedup-worker:problem:overloaded");
    // Once the two holders are gone, the same event is accepted.
    for holder in holders {
        holder.abort();
    }
    bin.wait_for("the cap to free up", Duration::from_secs(30), || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let body = stripe_event("evt_past_the_cap", "charge.succeeded");
            let response = post_signed(&client, &url, SECRET, body).await.ok()?;
            (response.status() == 200).then_some(())
        }
    })
    .await;
}
