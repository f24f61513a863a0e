//! Load harness for the webhook ingress: many keep-alive connections, each request a fresh event
//! signed at send time, latencies in an HDR histogram.
//!
//! ```text
//! cargo run --release --example loadgen -- --url http://127.0.0.1:8080/webhooks/stripe \
//!     --secret whsec_bench --connections 64 --seconds 10
//! cargo run --release --example loadgen -- --url http://127.0.0.1:8080/webhooks/github \
//!     --scheme github --secret bench --connections 64 --seconds 10
//! ```
//! `--scheme github` sends what a GitHub source receives (the same JSON body, signed in
//! `X-Hub-Signature-256`, its id in `X-GitHub-Delivery`), so the two routes can be compared on
//! the same work.
//! Prints requests/s, p50/p99/max latency and the count of non-2xx answers. The loop is bounded
//! by `--seconds` (and `--requests`, if given) and stops by itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

#[derive(Debug, Parser)]
struct Args {
    /// The ingress URL (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:8080/webhooks/stripe")]
    url: String,
    /// The webhook secret the server was started with.
    #[arg(long, default_value = "whsec_bench")]
    secret: String,
    /// Concurrent keep-alive connections, one request in flight on each.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// How long to send.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Stop after this many requests in total (0: no limit).
    #[arg(long, default_value_t = 0)]
    requests: u64,
    /// Fraction of requests that repeat an earlier event id (duplicate deliveries).
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
    /// Prefix of generated event ids, so runs do not collide.
    #[arg(long, default_value = "evt_load")]
    prefix: String,
    /// Ids spread like Stripe's (`evt_` + 32 hex characters derived from the prefix, the worker
    /// and the count) instead of `{prefix}_{worker}_{n}`, whose shared prefix lands every new id
    /// on the same few index pages.
    #[arg(long)]
    random_ids: bool,
    /// How each request is signed: `stripe` (`Stripe-Signature`, the id in the body) or
    /// `github` (`X-Hub-Signature-256`, the id in `X-GitHub-Delivery`).
    #[arg(long, value_enum, default_value_t = Scheme::Stripe)]
    scheme: Scheme,
}

/// The sender whose signature and headers each request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scheme {
    Stripe,
    Github,
}

/// `request`'s signature and id headers for `scheme`, over `body` signed with `secret`.
fn signed(
    request: hyper::http::request::Builder,
    scheme: Scheme,
    secret: &str,
    id: &str,
    body: &str,
) -> hyper::http::request::Builder {
    match scheme {
        Scheme::Stripe => {
            let t = chrono::Utc::now().timestamp();
            let signature =
                dedup_worker_core::signature::stripe::signature_header(secret, t, body.as_bytes());
            request.header("stripe-signature", signature)
        }
        Scheme::Github => {
            use hmac::Mac;
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
                .expect("HMAC takes any key");
            mac.update(body.as_bytes());
            let signature = hex::encode(mac.finalize().into_bytes());
            request
                .header("x-hub-signature-256", format!("sha256={signature}"))
                .header("x-github-event", "issues")
                .header("x-github-hook-id", "1")
                .header("x-github-delivery", id)
        }
    }
}

/// A Stripe-like id for `(prefix, worker, n)`: random-looking, and the same for a repeat.
fn spread_id(prefix: &str, worker: usize, n: u64) -> String {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, prefix, worker, n).hash(&mut h);
        h.finish()
    };
    format!("evt_{:016x}{:016x}", half(1), half(2))
}

struct Totals {
    sent: AtomicU64,
    failed: AtomicU64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri: hyper::Uri = args.url.parse()?;
    let host = uri.host().unwrap_or("127.0.0.1").to_owned();
    anyhow::ensure!(
        host == "127.0.0.1" || host == "localhost" || host == "[::1]",
        "load is only sent to loopback"
    );
    let port = uri.port_u16().unwrap_or(80);
    let path = uri.path().to_owned();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let totals = Arc::new(Totals {
        sent: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..args.connections {
        let (host, path, secret, prefix, totals) = (
            host.clone(),
            path.clone(),
            args.secret.clone(),
            args.prefix.clone(),
            totals.clone(),
        );
        let (limit, duplicates, random_ids, scheme) =
            (args.requests, args.duplicates, args.random_ids, args.scheme);
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            let mut n: u64 = 0;
            // As Stripe's: set when the event is made, the same on every delivery of it.
            let created = chrono::Utc::now().timestamp();
            while Instant::now() < deadline {
                if limit > 0 && totals.sent.fetch_add(1, Ordering::Relaxed) >= limit {
                    break;
                }
                // Every k-th request of a worker repeats its previous event: a duplicate.
                let repeat = duplicates > 0.0 && n > 0 && rand::random::<f64>() < duplicates;
                if !repeat {
                    n += 1;
                }
                let id = if random_ids {
                    spread_id(&prefix, worker, n)
                } else {
                    format!("{prefix}_{worker}_{n}")
                };
                let body = format!(
                    r#"{{"id":"{id}","object":"event","type":"invoice.paid","created":{created},"data":{{"object":{{"id":"in_{id}","amount_paid":1999,"currency":"usd"}}}}}}"#
                );
                let request = hyper::Request::post(path.as_str())
                    .header("host", host.as_str())
                    .header("content-type", "application/json");
                let request = signed(request, scheme, &secret, &id, &body)
                    .body(Full::new(Bytes::from(body)))?;
                let sent_at = Instant::now();
                let response = sender.send_request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                histogram.record(sent_at.elapsed().as_micros() as u64).ok();
                if limit == 0 {
                    totals.sent.fetch_add(1, Ordering::Relaxed);
                }
                if !status.is_success() {
                    totals.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(histogram)
        }));
    }
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for task in tasks {
        histogram.add(task.await??)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = histogram.len();
    println!(
        "requests: {count} in {elapsed:.1} s = {:.0} req/s; non-2xx: {}; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} connections)",
        count as f64 / elapsed,
        totals.failed.load(Ordering::Relaxed),
        histogram.value_at_quantile(0.50) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
        histogram.max() as f64 / 1000.0,
        args.connections,
    );
    Ok(())
}
