//! The real binary, its sources configured from the environment (`DEDUP_SOURCES__NAME__…`):
//! comma-separated secrets each verify, the metrics count under the source's name, and a
//! source that cannot work (an empty secret, a taken name, an unknown scheme or preset, `hmac`
//! rules that sign a timestamp they cannot find, a PayPal source without its webhook id or with
//! an unreadable certificate) stops the start naming its key.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{post, Delivery};
use crate::helpers::senders::github_sign;
use crate::helpers::{dedup_command, post_signed, stripe_event, Backend, RunningBinary, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_from_the_environment_each_verify_and_metrics_name_the_source() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().expect("tempdir");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", "whsec_test_secret".into()),
            ("DEDUP_SOURCES__GITHUB__SCHEME", "github".into()),
            (
                "DEDUP_SOURCES__GITHUB__SECRETS",
                "old-gh-secret, new-gh-secret".into(),
            ),
            ("DEDUP_ROLES__CONSUMER", "false".into()),
            ("DEDUP_ROLES__RELAY", "false".into()),
        ],
        work.path(),
    );
    let body = r#"{"zen":"Keep it logically awesome.","hook_id":7}"#;
    let signed = [
        github_sign("old-gh-secret", &[body]).remove(0),
        github_sign("new-gh-secret", &[body]).remove(0),
        github_sign("old-gh-secret,new-gh-secret", &[body]).remove(0),
    ];
    let delivery = |id: &str, signature: &str| {
        Delivery::new(
            &[
                ("X-GitHub-Delivery", id),
                ("X-GitHub-Event", "ping"),
                ("X-Hub-Signature-256", signature),
            ],
            body,
        )
    };
    for (id, signature) in [("d-old", &signed[0]), ("d-new", &signed[1])] {
        let (status, answer) = post(&bin.url(""), "github", &delivery(id, signature)).await;
        assert_eq!(status, 200, "{answer}\n{}", bin.stderr());
    }
    // The variable is a list, not one secret with a comma in it.
    let (status, _) = post(&bin.url(""), "github", &delivery("d-3", &signed[2])).await;
    assert_eq!(status, 400);
    let (status, problem) = post(&bin.url(""), "gitlab", &delivery("d-4", &signed[0])).await;
    assert_eq!(status, 404, "an unconfigured name: {problem}");
    // Stripe's route is as it was beside `/webhooks/{name}`.
    let stripe = post_signed(
        &reqwest::Client::new(),
        &bin.url("/webhooks/stripe"),
        "whsec_test_secret",
        stripe_event("evt_beside_sources", "invoice.paid"),
    )
    .await
    .expect("the ingress answers");
    assert_eq!(stripe.status(), 200);

    let metrics = reqwest::get(bin.url("/metrics"))
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("text");
    for line in [
        r#"dedup_webhooks_total{source="github",outcome="accepted"} 2"#,
        r#"dedup_webhooks_total{source="github",outcome="rejected"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains("gitlab"), "unknown names are not labels");

    let store = db.store().await;
    let queued = super::queued(&store).await;
    let ids: Vec<_> = queued.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(
        ids,
        [Some("d-old"), Some("d-new"), Some("evt_beside_sources")]
    );
}

/// Runs `serve` with `vars` and waits for it to stop, at most 30 s (a start that was not refused
/// would serve forever: it is killed and the test fails); its exit status and stderr.
fn refused_start(vars: &[(&str, String)], work: &Path) -> (ExitStatus, String) {
    let log = work.join("stderr.log");
    let mut child = dedup_command(vars)
        .env("DEDUP_LISTEN", "127.0.0.1:0")
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("run the binary");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{vars:?}: still serving after 30 s, not refused: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn a_source_that_cannot_work_stops_the_start_naming_its_key() {
    let work = tempfile::tempdir().expect("tempdir");
    let database = format!("sqlite://{}", work.path().join("never.db").display());
    for (env, key) in [
        (
            &[
                ("DEDUP_SOURCES__GITHUB__SCHEME", "github"),
                ("DEDUP_SOURCES__GITHUB__SECRETS", ""),
            ][..],
            "sources.github.secrets",
        ),
        (
            &[
                ("DEDUP_SOURCES__GITHUB__SCHEME", "github"),
                ("DEDUP_SOURCES__GITHUB__SECRETS", " , "),
            ][..],
            "sources.github.secrets",
        ),
        (
            &[("DEDUP_SOURCES__SLACK__SCHEME", "slack")][..],
            "sources.slack.secrets",
        ),
        (
            &[
                ("DEDUP_SOURCES__STRIPE__SCHEME", "github"),
                ("DEDUP_SOURCES__STRIPE__SECRETS", "x"),
            ][..],
            "sources.stripe",
        ),
        (
            &[
                ("DEDUP_SOURCES__GITHUB__SCHEME", "gitlab"),
                ("DEDUP_SOURCES__GITHUB__SECRETS", "x"),
            ][..],
            "sources.github.scheme",
        ),
        (
            &[("DEDUP_SOURCES__PAYPAL__SCHEME", "paypal")][..],
            "sources.paypal.webhook_id",
        ),
        (
            &[
                ("DEDUP_SOURCES__PAYPAL__SCHEME", "paypal"),
                ("DEDUP_SOURCES__PAYPAL__WEBHOOK_ID", "1JE4291016473214C"),
                (
                    "DEDUP_SOURCES__PAYPAL__CERTIFICATE",
                    "/nonexistent/paypal.pem",
                ),
            ][..],
            "sources.paypal.certificate",
        ),
        (
            &[
                ("DEDUP_SOURCES__FORMS__SCHEME", "hmac"),
                ("DEDUP_SOURCES__FORMS__SECRETS", "x"),
                ("DEDUP_SOURCES__FORMS__PRESET", "typeforms"),
            ][..],
            "sources.forms.preset",
        ),
        (
            &[
                ("DEDUP_SOURCES__FORMS__SCHEME", "hmac"),
                ("DEDUP_SOURCES__FORMS__SECRETS", "x"),
                ("DEDUP_SOURCES__FORMS__PRESET", "typeform"),
                ("DEDUP_SOURCES__FORMS__HMAC__SIGNED", "{timestamp}.{body}"),
            ][..],
            "sources.forms.hmac.signed",
        ),
        (
            &[
                ("DEDUP_SOURCES__ADYEN__SCHEME", "adyen"),
                ("DEDUP_SOURCES__ADYEN__SECRETS", "00ff"),
                ("DEDUP_SOURCES__ADYEN__ID_FIELD", "/pspReference"),
            ][..],
            "sources.adyen.id_field",
        ),
    ] {
        let mut vars = vec![
            ("DATABASE_URL", database.clone()),
            ("STRIPE_WEBHOOK_SECRET", "whsec_x".to_owned()),
        ];
        vars.extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let (status, stderr) = refused_start(&vars, work.path());
        assert!(!status.success(), "{env:?} started");
        assert!(
            stderr.contains(&format!("`{key}`")),
            "{env:?}: the error names {key}: {stderr}"
        );
    }
    assert!(
        !work.path().join("never.db").exists(),
        "refused before the database is touched"
    );
}
