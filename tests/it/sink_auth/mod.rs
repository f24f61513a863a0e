//! Issue 39, item 6, through the binary: receivers that ask for more than a shared secret. An
//! HTTPS receiver that requires a client certificate from its own CA accepts every delivery of
//! a sink with `[outbox.sinks.NAME.tls]`, and refuses the handshake of a sink without one; an
//! OAuth 2.0 receiver (a client credentials token endpoint in RFC 6749 §4.4's shapes, and a
//! receiver that wants `Authorization: Bearer` and revokes its token once) gets every event
//! with the token fetched twice and no attempt spent on the 401, while a sink with a wrong
//! secret fails its deliveries showing `invalid_client`, and neither secret nor token reaches
//! the logs; a `tls` file that cannot be read, and the other bad settings, stop the start
//! naming their key. The CA and certificates are made by the `openssl` command.
//!
//! * `mtls.rs`: the CA, the HTTPS receiver requiring a client certificate, the sinks;
//! * `oauth.rs`: the token endpoint and the receiver wanting its token, the sinks;
//! * here: what both start and read, and the refusals.

mod mtls;
mod oauth;

use std::path::Path;

use axum::http::HeaderMap;

use self::mtls::Pki;
use crate::helpers::{post_signed, stripe_event, RunningBinary, TestDb};
use crate::settings_refused::{start, Start};

const SECRET: &str = "whsec_test_secret";
const CLIENT_ID: &str = "relay-one";
const CLIENT_SECRET: &str = "cs-Zq8v-oauth-client-secret";

/// A delivery's `Idempotency-Key` (empty if it has none).
fn idempotency_key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The binary on `db` with `env`, its relay quick to poll and to retry, logging at debug.
fn binary(db: &TestDb, work: &Path, env: &[(&str, String)]) -> RunningBinary {
    let mut all = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__RETRY_BASE", "200ms".to_owned()),
        // Everything the process says, so that "no secret in the logs" covers the debug lines.
        ("RUST_LOG", "debug".to_owned()),
    ];
    all.extend(env.iter().cloned());
    RunningBinary::start(&all, work)
}

/// A signed `invoice.paid` webhook for each id, each acknowledged.
async fn send(binary: &RunningBinary, ids: &[String]) {
    let client = reqwest::Client::new();
    for id in ids {
        let body = stripe_event(id, "invoice.paid");
        let r = post_signed(&client, &binary.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// `n` event ids, `{prefix}_000` on.
fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i:03}")).collect()
}

/// `(status, attempts, last_error)` of every outbox row of `lane`.
async fn lane_rows(db: &TestDb, lane: &str) -> Vec<(String, i64, Option<String>)> {
    let store = db.store().await;
    const SQL: &str =
        "SELECT status, CAST(attempts AS BIGINT), last_error FROM outbox WHERE sink = $1";
    let pool = store.sqlite_pool().expect("the tests here run on SQLite");
    sqlx::query_as(SQL)
        .bind(lane)
        .fetch_all(pool)
        .await
        .unwrap()
}
/// Settings, the key their refusal names, and a word of its reason.
type Refused = (Vec<(&'static str, String)>, &'static str, &'static str);

/// `serve` with `env` on a fresh SQLite file: the refusal's stderr, or a failure if it started.
fn refusal(work: &Path, env: &[(&str, String)]) -> String {
    let mut all = vec![("STRIPE_WEBHOOK_SECRET", SECRET.to_owned())];
    all.extend(env.iter().cloned());
    match start(&all, work) {
        Start::Refused { stderr } => stderr,
        Start::Listening {
            mut child, addr, ..
        } => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the binary started on {addr} with {env:?}")
        }
    }
}

#[tokio::test]
async fn bad_tls_and_oauth_settings_refuse_the_start_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    let pki = Pki::new(work.path());
    std::fs::write(work.path().join("garbage.pem"), "not a PEM file\n").unwrap();
    let missing = work.path().join("missing.crt").display().to_string();
    let sink = |url: &str| ("DEDUP_OUTBOX__SINKS__BILLING__URL", url.to_owned());
    let https = sink("https://billing.example.com/hooks");
    let cert = |path: String| ("DEDUP_OUTBOX__SINKS__BILLING__TLS__CLIENT_CERT", path);
    let key = |path: String| ("DEDUP_OUTBOX__SINKS__BILLING__TLS__CLIENT_KEY", path);
    let oauth = |field: &str, value: &str| {
        let name = match field {
            "TOKEN_URL" => "DEDUP_OUTBOX__SINKS__BILLING__OAUTH__TOKEN_URL",
            "CLIENT_ID" => "DEDUP_OUTBOX__SINKS__BILLING__OAUTH__CLIENT_ID",
            "CLIENT_SECRET" => "DEDUP_OUTBOX__SINKS__BILLING__OAUTH__CLIENT_SECRET",
            other => unreachable!("{other}"),
        };
        (name, value.to_owned())
    };
    let complete_oauth = [
        oauth("TOKEN_URL", "https://auth.example.com/oauth/token"),
        oauth("CLIENT_ID", CLIENT_ID),
        oauth("CLIENT_SECRET", CLIENT_SECRET),
    ];
    let cases: Vec<Refused> = vec![
        (
            vec![
                https.clone(),
                cert(missing.clone()),
                key(pki.path("client.key")),
            ],
            "outbox.sinks.billing.tls.client_cert",
            "cannot read",
        ),
        (
            vec![
                https.clone(),
                cert(pki.path("client.crt")),
                key(pki.path("garbage.pem")),
            ],
            "outbox.sinks.billing.tls.client_key",
            "no private key",
        ),
        (
            vec![https.clone(), key(pki.path("client.key"))],
            "outbox.sinks.billing.tls.client_cert",
            "is not set",
        ),
        (
            vec![
                https.clone(),
                (
                    "DEDUP_OUTBOX__SINKS__BILLING__TLS__CA",
                    pki.path("client.key"),
                ),
            ],
            "outbox.sinks.billing.tls.ca",
            "holds no certificate",
        ),
        (
            vec![
                sink("log"),
                ("DEDUP_OUTBOX__SINKS__BILLING__TLS__CA", pki.path("ca.crt")),
            ],
            "outbox.sinks.billing.tls",
            "not an http(s) URL",
        ),
        (
            vec![
                https.clone(),
                oauth("TOKEN_URL", "ftp://auth.example.com/token"),
                complete_oauth[1].clone(),
                complete_oauth[2].clone(),
            ],
            "outbox.sinks.billing.oauth.token_url",
            "not an http(s) URL",
        ),
        (
            vec![
                https.clone(),
                complete_oauth[0].clone(),
                complete_oauth[1].clone(),
            ],
            "outbox.sinks.billing.oauth.client_secret",
            "is not set",
        ),
    ];
    for (env, key, reason) in cases {
        let stderr = refusal(work.path(), &env);
        assert!(
            stderr.contains(&format!("configuration key `{key}`")) && stderr.contains(reason),
            "{env:?} should be refused naming `{key}` ({reason}): {stderr}"
        );
        assert!(!stderr.contains(CLIENT_SECRET), "{stderr}");
    }
}
