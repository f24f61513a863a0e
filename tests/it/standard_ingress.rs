//! `POST /webhooks/standard` (Standard Webhooks): the official vector verifies at its own
//! timestamp, failures are 400 problems naming the check, the dedup key is `webhook-id` under
//! its own source (an equal Stripe event id is a different event), and the route is absent
//! when no secret is configured.

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::{
    now, pipeline_drained, post_signed, stripe_event, test_settings, wait_for, Backend, TestApp,
    TestDb,
};
use dedup_worker::Service;
use dedup_worker_core::signature::standard::{decode_secret, standard_signature};
use serde_json::{json, Value};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const T: i64 = 1_614_265_330;
const PAYLOAD: &str = r#"{"test": 2432232314}"#;
const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

async fn post(
    app: &TestApp,
    id: Option<&str>,
    t: i64,
    signature: &str,
    body: &str,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(app.url("/webhooks/standard"))
        .header("webhook-timestamp", t.to_string())
        .header("webhook-signature", signature)
        .body(body.to_owned());
    if let Some(id) = id {
        request = request.header("webhook-id", id);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_vector_and_failures() {
    let db = TestDb::new(Backend::Sqlite).await;
    let clock = || T + 10;
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("standard_webhooks.secrets", json!(SECRET)),
                ("roles.consumer", json!(false)),
                ("roles.relay", json!(false)),
            ],
        ),
        Service::new().clock(clock),
    )
    .await;
    let (status, body) = post(&app, Some(ID), T, EXPECTED, PAYLOAD).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], ID);
    let queued = app
        .store
        .queue()
        .claim("dedup.events", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].source.as_deref(), Some("standard"));
    assert_eq!(queued[0].message_id.as_deref(), Some(ID));
    assert_eq!(queued[0].payload, PAYLOAD.as_bytes());

    for (name, id, t, signature, body, check) in [
        (
            "tampered",
            Some(ID),
            T,
            EXPECTED,
            r#"{"test": 1}"#,
            "signature_mismatch",
        ),
        (
            "stale",
            Some(ID),
            T - 400,
            EXPECTED,
            PAYLOAD,
            "timestamp_tolerance",
        ),
        ("no id", None, T, EXPECTED, PAYLOAD, "missing_header"),
        // Neither a v1 nor a v1a item (a v1a item is a candidate now; see the v1a tests).
        (
            "no v1",
            Some(ID),
            T,
            "v2,abc v1b,abc",
            PAYLOAD,
            "no_v1_signature",
        ),
    ] {
        let (status, problem) = post(&app, id, t, signature, body).await;
        assert_eq!(status, 400, "{name}: {problem}");
        assert_eq!(problem["check"], check, "{name}: {problem}");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_id_dedups_under_its_own_source() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("standard_webhooks.secrets", json!(SECRET)),
                ("outbox.sink", json!(format!("file:{}", sink.display()))),
                ("consumer.handler", json!("ledger")),
                ("consumer.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    let key = decode_secret(SECRET).unwrap();
    let shared_id = "evt_shared_1";
    let body = format!(r#"{{"id":"{shared_id}","type":"user.created"}}"#);
    for _ in 0..3 {
        let t = now();
        let (status, _) = post(
            &app,
            Some(shared_id),
            t,
            &standard_signature(&key, shared_id, t, body.as_bytes()),
            &body,
        )
        .await;
        assert_eq!(status, 200);
    }
    // A Stripe event with the same id is another provider's event.
    let r = post_signed(
        &reqwest::Client::new(),
        &app.url("/webhooks/stripe"),
        "whsec_test_secret",
        stripe_event(shared_id, "invoice.paid"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);

    let store = Arc::new(app.store.clone());
    wait_for("both events delivered", Duration::from_secs(30), || {
        let (store, sink) = (store.clone(), sink.clone());
        async move {
            let lines = std::fs::read_to_string(&sink)
                .unwrap_or_default()
                .lines()
                .count();
            (lines >= 2 && pipeline_drained(&store, "dedup.events").await).then_some(())
        }
    })
    .await;
    let lines = std::fs::read_to_string(&sink).unwrap();
    assert_eq!(
        lines.lines().count(),
        2,
        "three standard deliveries and one stripe: two events\n{lines}"
    );
    let pool = store.postgres_pool().expect("a PostgreSQL test");
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT source, count(*) FROM event_ledger GROUP BY source ORDER BY source")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![("standard".to_owned(), 1), ("stripe".to_owned(), 1)]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_is_absent_without_a_secret() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(test_settings(&db.url, &[]), Service::new()).await;
    let (status, _) = post(&app, Some(ID), T, EXPECTED, PAYLOAD).await;
    assert_eq!(status, 404);
    app.stop().await;
}

#[test]
fn a_secret_that_is_not_base64_names_the_key() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
        .arg("serve")
        .env_clear()
        .env("STRIPE_WEBHOOK_SECRET", "whsec_x")
        .env("DEDUP_STANDARD_WEBHOOKS__SECRETS", "whsec_not base64!")
        .env("DATABASE_URL", "sqlite://./never-created.db")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("standard_webhooks.secrets"));
}
