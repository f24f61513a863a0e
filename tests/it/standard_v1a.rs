//! `POST /webhooks/standard` with `v1a` (ed25519) signatures made by an independent signer,
//! Python's `cryptography`: through the real app, served with public keys alone, a valid one is
//! enqueued and reaches the sink once; a tampered one is a 400 problem naming the check; a valid
//! `v1a` beside garbage `v1` items verifies; too many items, or too much ed25519 work, is a 400
//! before any verification; a bad `whpk_` key refuses the start, naming its configuration key.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use dedup_worker::Service;
use serde_json::{json, Value};

use crate::helpers::{
    ed25519_python_sign, pipeline_drained, test_settings, wait_for, Backend, TestApp, TestDb,
};

const T: i64 = 1_614_265_330;
/// RFC 8032 section 7.1 TEST 2's public key: a second trusted key, so that the ed25519 work
/// bound (v1a items × keys) is reached with fewer items than the item bound.
const OTHER_WHPK: &str = "whpk_PUAXw+hDiVqStwqnTRt+vJyYLM8uxJaMwM1V8Sr0Zgw=";

/// Posts a Standard Webhooks delivery; its status, problem or answer, and content type.
async fn post(app: &TestApp, id: &str, signature: &str, body: &[u8]) -> (u16, Value, String) {
    let response = reqwest::Client::new()
        .post(app.url("/webhooks/standard"))
        .header("webhook-id", id)
        .header("webhook-timestamp", T.to_string())
        .header("webhook-signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .expect("post");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        status,
        response.json().await.unwrap_or(Value::Null),
        content_type,
    )
}

/// `item` (`v1a,<base64>`) with one bit of its signature flipped.
fn flip_bit(item: &str, bit: usize) -> String {
    let mut signature = BASE64
        .decode(item.strip_prefix("v1a,").expect("v1a"))
        .expect("base64");
    signature[bit / 8] ^= 1 << (bit % 8);
    format!("v1a,{}", BASE64.encode(signature))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1a_signed_by_python_cryptography_is_enqueued_once_and_tampering_is_refused() {
    let bodies: Vec<Vec<u8>> = (1..=3)
        .map(|i| format!(r#"{{"type":"user.created","data":{{"n":{i}}}}}"#).into_bytes())
        .collect();
    let ids = ["msg_v1a_1", "msg_v1a_2", "msg_v1a_3"];
    let signer = ed25519_python_sign(
        &ids.iter()
            .zip(&bodies)
            .map(|(id, body)| (*id, T, &body[..]))
            .collect::<Vec<_>>(),
    );
    let sig = &signer.signatures;

    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("out.jsonl");
    let clock = || T + 10;
    // Public keys only: no `standard_webhooks.secrets`, and the route is served.
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                (
                    "standard_webhooks.public_keys",
                    json!(format!("{OTHER_WHPK}, {}", signer.whpk)),
                ),
                ("outbox.sink", json!(format!("file:{}", sink.display()))),
                ("consumer.poll_interval", json!("50ms")),
                ("outbox.poll_interval", json!("50ms")),
            ],
        ),
        Service::new().clock(clock),
    )
    .await;

    // Valid: 200, and again 200 for the redelivery (deduplicated below).
    for _ in 0..2 {
        let (status, answer, _) = post(&app, ids[0], &sig[0], &bodies[0]).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["id"], ids[0]);
    }

    // Tampered: the body changed after signing, one bit of the signature, the id, a signature
    // over another delivery.
    let mut changed_body = bodies[0].clone();
    changed_body[2] ^= 1;
    for (name, id, signature, body) in [
        ("body changed", ids[0], sig[0].clone(), changed_body),
        (
            "signature bit",
            ids[0],
            flip_bit(&sig[0], 100),
            bodies[0].clone(),
        ),
        (
            "last signature bit",
            ids[0],
            flip_bit(&sig[0], 511),
            bodies[0].clone(),
        ),
        ("other id", ids[1], sig[0].clone(), bodies[0].clone()),
    ] {
        let (status, problem, content_type) = post(&app, id, &signature, &body).await;
        assert_eq!(status, 400, "{name}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{name}");
        assert_eq!(problem["check"], "signature_mismatch", "{name}: {problem}");
        assert!(
            !problem.to_string().contains(&sig[0]["v1a,".len()..]),
            "{name}: the expected signature is never told: {problem}"
        );
    }

    // A valid v1a beside garbage v1 items (and a malformed v1a) verifies.
    let garbage = format!("v1,garbage!! v1,AAAA v1a,%%% {}", sig[1]);
    let (status, answer, _) = post(&app, ids[1], &garbage, &bodies[1]).await;
    assert_eq!(status, 200, "{answer}");

    // Over the bounds, refused before any verification, though the valid item is among them:
    // 17 items (v1 and v1a together), and 9 v1a items × 2 public keys = 18 ed25519 checks.
    let filler = flip_bit(&sig[2], 3);
    let seventeen = format!("v1,AAAA {}{}", format!("{filler} ").repeat(15), sig[2]);
    let nine = format!("{}{}", format!("{filler} ").repeat(8), sig[2]);
    for (name, signature, wanted) in [
        ("17 items", seventeen, "more than 16 v1 and v1a"),
        ("18 ed25519 checks", nine, "16 ed25519 verifications"),
    ] {
        let (status, problem, content_type) = post(&app, ids[2], &signature, &bodies[2]).await;
        assert_eq!(status, 400, "{name}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{name}");
        assert_eq!(problem["check"], "malformed_header", "{name}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(wanted),
            "{name}: {problem}"
        );
    }
    // Within them, the same signature verifies: 8 v1a items × 2 keys.
    let eight = format!("{}{}", format!("{filler} ").repeat(7), sig[2]);
    let (status, answer, _) = post(&app, ids[2], &eight, &bodies[2]).await;
    assert_eq!(status, 200, "{answer}");

    // Each accepted event at the sink once, the redelivery of the first deduplicated.
    let store = Arc::new(app.store.clone());
    wait_for("three events delivered", Duration::from_secs(30), || {
        let (store, sink) = (store.clone(), sink.clone());
        async move {
            let lines = std::fs::read_to_string(&sink).unwrap_or_default();
            (lines.lines().count() >= 3 && pipeline_drained(&store, "dedup.events").await)
                .then_some(())
        }
    })
    .await;
    let delivered = std::fs::read_to_string(&sink).unwrap();
    let mut delivered: Vec<Value> = delivered
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    delivered.sort_by_key(|v| v["data"]["n"].as_i64());
    let expected: Vec<Value> = bodies
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .collect();
    assert_eq!(
        delivered, expected,
        "each accepted event once, none of the refused"
    );
    app.stop().await;
}

/// Public keys that cannot verify anything refuse the start, naming the configuration key and
/// the public key; with one valid key beside them it is the bad one that is named.
#[test]
fn a_public_key_that_is_not_a_usable_point_names_the_key() {
    let mut off_curve = [0u8; 32];
    off_curve[0] = 2; // y = 2: no x satisfies the curve equation.
    let thirty_one = format!("whpk_{}", BASE64.encode([9u8; 31]));
    let off_curve = format!("whpk_{}", BASE64.encode(off_curve));
    for (bad, wanted) in [
        (thirty_one, "decodes to 31 bytes"),
        (off_curve, "not a point of the ed25519 curve"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
            .arg("serve")
            .env_clear()
            .env("STRIPE_WEBHOOK_SECRET", "whsec_x")
            .env(
                "DEDUP_STANDARD_WEBHOOKS__PUBLIC_KEYS",
                format!("{OTHER_WHPK},{bad}"),
            )
            .env("DATABASE_URL", "sqlite://./never-created.db")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        for needed in ["standard_webhooks.public_keys", bad.as_str(), wanted] {
            assert!(stderr.contains(needed), "{needed:?} missing from: {stderr}");
        }
    }
}

/// Sanity of the test's own constant: RFC 8032 TEST 2's public key.
#[test]
fn other_whpk_is_rfc8032_test_2() {
    assert_eq!(
        hex::encode(BASE64.decode(&OTHER_WHPK["whpk_".len()..]).unwrap()),
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
    );
}
