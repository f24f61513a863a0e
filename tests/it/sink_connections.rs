//! The HTTP sink keeps its connections: a receiver answering with a body of some size gets the
//! lane's deliveries over connections reused, not a new TCP (or TLS) handshake per delivery. A
//! body left unread makes the HTTP client close the connection instead of reusing it; the sink
//! reads it (up to 64 KiB) and drops it. Counted at a proxy between the binary and the receiver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::Router;

use crate::helpers::fault_proxy::FaultProxy;
use crate::helpers::{post_signed, serve, stripe_event, wait_for, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_test_secret";
const EVENTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_to_a_receiver_answering_with_a_body_reuse_connections() {
    let received = Arc::new(AtomicUsize::new(0));
    let router = Router::new()
        .route(
            "/hook",
            post(|State(received): State<Arc<AtomicUsize>>| async move {
                received.fetch_add(1, Ordering::SeqCst);
                // A body of several reads, smaller than what the sink drains (a body read at once
                // is complete before the client looks, and its connection kept either way).
                format!(r#"{{"received":true,"note":"{}"}}"#, "x".repeat(30_000))
            }),
        )
        .with_state(received.clone());
    let receiver = serve(router).await;
    let proxy = FaultProxy::start(&receiver.to_string()).await;
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        (
            "DEDUP_SINK",
            format!("http://127.0.0.1:{}/hook", proxy.port),
        ),
        ("DEDUP_OUTBOX__CONCURRENCY", "1".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
    ];
    let app = RunningBinary::start(&env, work.path());
    let client = reqwest::Client::new();
    for i in 0..EVENTS {
        let body = stripe_event(&format!("evt_conn_{i:02}"), "invoice.paid");
        let r = post_signed(&client, &app.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_for("every event delivered", Duration::from_secs(30), || async {
        (received.load(Ordering::SeqCst) >= EVENTS).then_some(())
    })
    .await;
    // Unread, every answer closes its connection: one per delivery. Read, the connection goes
    // back to the pool, though the next delivery sometimes starts before it is back (six of
    // twenty here on a quiet machine).
    let connections = proxy.accepted();
    assert!(
        connections <= (EVENTS * 3 / 4) as u64,
        "{connections} connections for {EVENTS} deliveries one at a time"
    );
}
