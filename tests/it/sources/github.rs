//! `scheme = "github"`: `X-Hub-Signature-256` made by `@octokit/webhooks-methods`, the dedup id
//! `X-GitHub-Delivery`, the type `X-GitHub-Event`.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::github_sign;
use crate::helpers::{Backend, TestDb};

const SECRET: &str = "gh-webhook-secret-1";
const ROTATED: &str = "gh-webhook-secret-2";

/// A GitHub delivery of `body` as GitHub sends it: id, event and signature headers.
fn delivery(id: &str, event: &str, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("X-GitHub-Delivery", id),
            ("X-GitHub-Event", event),
            ("X-Hub-Signature-256", signature),
            ("Content-Type", "application/json"),
            ("User-Agent", "GitHub-Hookshot/test"),
        ],
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_by_octokit_accepted_and_forgeries_refused_with_nothing_enqueued() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("github", "github", &[SECRET, ROTATED])])).await;
    let body = r#"{"action":"opened","issue":{"number":1347},"repository":{"full_name":"o/r"}}"#;
    let ping = r#"{"zen":"Design for failure.","hook_id":42}"#;
    let [signed, under_rotated, ping_signed, under_other] = <[String; 4]>::try_from(
        [
            github_sign(SECRET, &[body]),
            github_sign(ROTATED, &[ping]),
            github_sign(SECRET, &[ping]),
            github_sign("not-the-secret", &[body]),
        ]
        .concat(),
    )
    .expect("four signatures");
    let good = delivery(
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "issues",
        &signed,
        body,
    );
    let (status, answer) = post(&app.url(""), "github", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    // Either configured secret verifies (rotation).
    let (status, answer) = post(
        &app.url(""),
        "github",
        &delivery("d1", "ping", &under_rotated, ping),
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    assert_refused(
        &app,
        "github",
        &[
            (
                "signed with another secret",
                delivery("f1", "issues", &under_other, body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "another delivery's signature",
                delivery("f2", "issues", &ping_signed, body),
                "signature_mismatch",
            ),
            (
                "no signature",
                good.without("X-Hub-Signature-256"),
                "missing_header",
            ),
            (
                "the SHA-1 prefix",
                delivery("f3", "issues", &signed.replace("sha256=", "sha1="), body),
                "malformed_header",
            ),
            // Verified, but nothing to deduplicate on.
            (
                "no delivery id",
                good.without("X-GitHub-Delivery"),
                "missing_id",
            ),
        ],
    )
    .await;

    // Over http.body_limit_bytes (1 MiB by default): 413 before any verification work.
    let huge = "x".repeat(1024 * 1024 + 1);
    let (status, problem) = post(
        &app.url(""),
        "github",
        &delivery("f4", "issues", &signed, &huge),
    )
    .await;
    assert_eq!(status, 413, "{problem}");

    let queued = queued(&app.store).await;
    let seen: Vec<_> = queued
        .iter()
        .map(|m| {
            (
                m.source.as_deref(),
                m.message_id.as_deref(),
                m.message_type.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                Some("github"),
                Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                Some("issues")
            ),
            (Some("github"), Some("d1"), Some("ping")),
        ],
        "the two accepted deliveries and nothing else"
    );
    assert_eq!(
        queued[0].payload,
        body.as_bytes(),
        "the raw body, as signed"
    );
    app.stop().await;
}

/// A redelivery (the same `X-GitHub-Delivery`, asked for in GitHub's UI or API) is handled
/// once; another delivery of the same hook is another event. On both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_delivery_is_handled_once() {
    let body = r#"{"ref":"refs/heads/main","after":"6dcb09b5b57875f334f61aebed695e2e4193db5e"}"#;
    let other = r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000001"}"#;
    let signatures = github_sign(SECRET, &[body, other]);
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let runs = handler_runs_after(
            backend,
            sources(&[("github", "github", &[SECRET])]),
            "github",
            &[
                delivery("guid-1", "push", &signatures[0], body),
                delivery("guid-1", "push", &signatures[0], body),
                delivery("guid-2", "push", &signatures[1], other),
                delivery("guid-1", "push", &signatures[0], body),
            ],
        )
        .await;
        assert_eq!(
            runs,
            once_each("github", &["guid-1", "guid-2"]),
            "{backend:?}"
        );
    }
}
