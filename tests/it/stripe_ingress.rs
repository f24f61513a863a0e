//! The Stripe ingress over real HTTP: signatures made by the official stripe-python library
//! are accepted; every failed check is a 400 problem+json naming the check; nothing rejected
//! is enqueued; the published vector verifies at its own timestamp (injected clock).

use crate::helpers::{
    now, stripe_event, stripe_python_sign, test_settings, Backend, TestApp, TestDb,
};
use dedup_worker::Service;
use serde_json::{json, Value};

const SECRET: &str = "whsec_test_secret";
const QUEUE: &str = "dedup.events";

/// Ingress only, so accepted events stay on the queue where the test can count them.
async fn ingress_only(db: &TestDb, extra: &[(&str, Value)], service: Service) -> TestApp {
    let mut values = vec![
        ("roles.consumer", json!(false)),
        ("roles.relay", json!(false)),
        (
            "stripe.secrets",
            json!(format!("whsec_old_rotated,{SECRET}")),
        ),
    ];
    values.extend(extra.iter().cloned());
    TestApp::spawn(test_settings(&db.url, &values), service).await
}

async fn post(app: &TestApp, header: Option<&str>, body: &[u8]) -> (u16, String, Value) {
    let client = reqwest::Client::new();
    let mut request = client.post(app.url("/webhooks/stripe")).body(body.to_vec());
    if let Some(h) = header {
        request = request.header("Stripe-Signature", h);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, content_type, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_signed_by_the_official_library_are_accepted() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, &[], Service::new()).await;
    let t = now();
    let payloads: Vec<(Vec<u8>, i64)> = (0..5)
        .map(|i| {
            (
                stripe_event(&format!("evt_py_{i}"), "payment_intent.succeeded"),
                t,
            )
        })
        .collect();
    let headers = stripe_python_sign(SECRET, &payloads);
    for ((payload, _), header) in payloads.iter().zip(&headers) {
        let (status, _, body) = post(&app, Some(header), payload).await;
        assert_eq!(status, 200, "{body}");
    }
    // A secret being rotated out still verifies.
    let old = stripe_python_sign(
        "whsec_old_rotated",
        &[(stripe_event("evt_py_old", "x.y"), t)],
    );
    let (status, _, _) = post(&app, Some(&old[0]), &stripe_event("evt_py_old", "x.y")).await;
    assert_eq!(status, 200);
    assert_eq!(app.store.queue().depth(QUEUE).await.unwrap(), 6);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failed_check_is_a_400_problem_naming_it() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, &[], Service::new()).await;
    let t = now();
    let body = stripe_event("evt_bad", "charge.succeeded");
    let tampered = {
        let mut b = body.clone();
        let pos = b
            .iter()
            .position(|c| *c == b'9')
            .expect("a digit to change");
        b[pos] = b'8';
        b
    };
    let signed = stripe_python_sign(
        SECRET,
        &[
            (body.clone(), t),
            (body.clone(), t - 400),
            (body.clone(), t + 400),
        ],
    );
    let wrong_secret = stripe_python_sign("whsec_someone_else", &[(body.clone(), t)]);
    let v1_only = signed[0]
        .split(',')
        .find(|p| p.starts_with("v1="))
        .expect("v1")
        .to_owned();
    let cases: Vec<(&str, Option<String>, Vec<u8>, &str)> = vec![
        (
            "tampered body",
            Some(signed[0].clone()),
            tampered,
            "signature_mismatch",
        ),
        (
            "wrong secret",
            Some(wrong_secret[0].clone()),
            body.clone(),
            "signature_mismatch",
        ),
        (
            "stale timestamp",
            Some(signed[1].clone()),
            body.clone(),
            "timestamp_tolerance",
        ),
        (
            "future timestamp",
            Some(signed[2].clone()),
            body.clone(),
            "timestamp_tolerance",
        ),
        ("missing header", None, body.clone(), "missing_header"),
        (
            "malformed header",
            Some("this is not a signature".into()),
            body.clone(),
            "malformed_header",
        ),
        (
            "no timestamp",
            Some(v1_only.clone()),
            body.clone(),
            "malformed_header",
        ),
        (
            "no v1",
            Some(format!("t={t},v0={}", "ab".repeat(32))),
            body.clone(),
            "no_v1_signature",
        ),
    ];
    for (name, header, payload, check) in cases {
        let (status, content_type, problem) = post(&app, header.as_deref(), &payload).await;
        assert_eq!(status, 400, "{name}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{name}");
        assert_eq!(problem["check"], check, "{name}: {problem}");
        assert_eq!(problem["status"], 400, "{name}");
        assert!(
            problem["title"].is_string() && problem["detail"].is_string(),
            "{name}: {problem}"
        );
        // Never a hint of the expected signature.
        let expected = dedup_worker_core::signature::stripe::compute_signature(SECRET, t, &payload);
        assert!(
            !problem.to_string().contains(&expected),
            "{name} leaks the signature"
        );
    }
    assert_eq!(
        app.store.queue().depth(QUEUE).await.unwrap(),
        0,
        "nothing rejected is enqueued"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_vector_verifies_at_its_own_timestamp() {
    let vector = include_bytes!("../vectors/stripe_invoiceitem_created.json");
    let header = "t=1533204620,v1=d7373bc68f4bd320b253cd7461f87af6e1cdf1b4d7db1614d8d1d746972d2d0a";
    let db = TestDb::new(Backend::Sqlite).await;
    let clock = || 1_533_204_620 + 42;
    let app = ingress_only(
        &db,
        &[("stripe.secrets", json!("secret"))],
        Service::new().clock(clock),
    )
    .await;
    let (status, _, body) = post(&app, Some(header), vector).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], "evt_123");
    app.stop().await;

    // With the real clock the same delivery is years stale.
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, &[("stripe.secrets", json!("secret"))], Service::new()).await;
    let (status, _, body) = post(&app, Some(header), vector).await;
    assert_eq!(status, 400);
    assert_eq!(body["check"], "timestamp_tolerance");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tolerance_is_configurable() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, &[("stripe.tolerance", json!("3600s"))], Service::new()).await;
    let body = stripe_event("evt_late", "charge.succeeded");
    let header = stripe_python_sign(SECRET, &[(body.clone(), now() - 1800)]);
    let (status, _, problem) = post(&app, Some(&header[0]), &body).await;
    assert_eq!(status, 200, "{problem}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_unparsable_and_idless_payloads_are_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(
        &db,
        &[("http.body_limit_bytes", json!(4096))],
        Service::new(),
    )
    .await;
    let sign =
        |body: &[u8]| dedup_worker_core::signature::stripe::signature_header(SECRET, now(), body);

    let big = {
        let mut v = serde_json::to_vec(&json!({"id": "evt_big", "pad": "x".repeat(5000)})).unwrap();
        v.push(b'\n');
        v
    };
    let (status, content_type, problem) = post(&app, Some(&sign(&big)), &big).await;
    assert_eq!(status, 413, "{problem}");
    assert_eq!(content_type, "application/problem+json");

    let not_json = b"id=evt_1&type=x".to_vec();
    let (status, _, problem) = post(&app, Some(&sign(&not_json)), &not_json).await;
    assert_eq!(
        (status, problem["check"].as_str()),
        (400, Some("payload_json")),
        "{problem}"
    );

    let no_id = serde_json::to_vec(&json!({"type": "charge.succeeded"})).unwrap();
    let (status, _, problem) = post(&app, Some(&sign(&no_id)), &no_id).await;
    assert_eq!(
        (status, problem["check"].as_str()),
        (400, Some("payload_id")),
        "{problem}"
    );

    assert_eq!(app.store.queue().depth(QUEUE).await.unwrap(), 0);
    app.stop().await;
}

#[test]
fn sign_command_prints_the_published_vector() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
        .args(["sign", "--secret", "secret", "--timestamp", "1533204620"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/vectors/stripe_invoiceitem_created.json"
        ))
        .output()
        .expect("run sign");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "t=1533204620,v1=d7373bc68f4bd320b253cd7461f87af6e1cdf1b4d7db1614d8d1d746972d2d0a"
    );
}

#[test]
fn invalid_configuration_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"));
        cmd.arg("serve")
            .env_clear()
            .env(
                "DATABASE_URL",
                format!("sqlite://{}/x.db", dir.path().display()),
            )
            .env("DEDUP_LISTEN", "127.0.0.1:0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run");
        assert!(!out.status.success(), "must refuse to start with {env:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&[]).contains("stripe.secrets"));
    let err = run(&[
        ("STRIPE_WEBHOOK_SECRET", "whsec_x"),
        ("DEDUP_LISTEN", "nonsense"),
    ]);
    assert!(err.contains("http.listen"), "{err}");
    let err = run(&[
        ("STRIPE_WEBHOOK_SECRET", "whsec_x"),
        ("DEDUP_SINK", "gopher://x"),
    ]);
    assert!(err.contains("outbox.sink"), "{err}");
    let err = run(&[
        ("STRIPE_WEBHOOK_SECRET", "whsec_x"),
        ("DEDUP_CONSUMER__BATCH_SIZE", "0"),
    ]);
    assert!(err.contains("consumer.batch_size"), "{err}");

    // A --config file overrides the defaults and is itself overridden by the environment.
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[consumer]\nworkers = 0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
        .args(["serve", "--config"])
        .arg(&file)
        .env_clear()
        .env("STRIPE_WEBHOOK_SECRET", "whsec_x")
        .env(
            "DATABASE_URL",
            format!("sqlite://{}/x.db", dir.path().display()),
        )
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("consumer.workers"));
}
