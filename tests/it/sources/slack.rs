//! `scheme = "slack"`: `X-Slack-Signature` made by `slack_sdk`'s `SignatureVerifier`, over the
//! timestamp and the body, within five minutes either way; the dedup id the body's `event_id`;
//! `url_verification` answered with its challenge, verified first, nothing enqueued.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::slack_sign;
use crate::helpers::{now, Backend, TestDb};

const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// An Events API delivery as Slack sends it, signed at `t`.
fn delivery(t: i64, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("X-Slack-Request-Timestamp", &t.to_string()),
            ("X-Slack-Signature", signature),
            ("Content-Type", "application/json"),
        ],
        body,
    )
}

fn event(id: &str) -> String {
    format!(
        r#"{{"token":"t","team_id":"T1","type":"event_callback","event_id":"{id}","event_time":1700000000,"event":{{"type":"app_mention","text":"hi","user":"U1"}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_by_slack_sdk_accepted_and_forgeries_refused_with_nothing_enqueued() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("slack", "slack", &[SECRET])])).await;
    let t = now();
    let body = event("Ev01");
    let (stale, future) = (t - 400, t + 400);
    let signatures = slack_sign(
        SECRET,
        &[
            (t, body.as_str()),
            (stale, body.as_str()),
            (future, body.as_str()),
        ],
    );
    let under_other = slack_sign("0000000000another0signing0secret", &[(t, body.as_str())]);
    let good = delivery(t, &signatures[0], &body);
    let (status, answer) = post(&app.url(""), "slack", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "Ev01");

    assert_refused(
        &app,
        "slack",
        &[
            (
                "signed with another secret",
                delivery(t, &under_other[0], &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "the signature of another timestamp",
                delivery(t - 1, &signatures[0], &body),
                "signature_mismatch",
            ),
            (
                "signed 400 s ago",
                delivery(stale, &signatures[1], &body),
                "timestamp_tolerance",
            ),
            (
                "signed 400 s ahead",
                delivery(future, &signatures[2], &body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good.without("X-Slack-Signature"),
                "missing_header",
            ),
            (
                "no timestamp",
                good.without("X-Slack-Request-Timestamp"),
                "missing_header",
            ),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(queued.len(), 1, "the accepted delivery and nothing else");
    assert_eq!(queued[0].source.as_deref(), Some("slack"));
    assert_eq!(queued[0].message_id.as_deref(), Some("Ev01"));
    assert_eq!(queued[0].message_type.as_deref(), Some("app_mention"));
    assert_eq!(queued[0].payload, body.as_bytes());
    app.stop().await;
}

/// Slack's handshake when the request URL is set: answered with the challenge once verified;
/// a forged one is refused like any forgery; neither is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_verification_is_answered_with_its_challenge_once_verified() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("slack", "slack", &[SECRET])])).await;
    let t = now();
    let body = r#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let signed = slack_sign(SECRET, &[(t, body)]).remove(0);
    let (status, answer) = post(&app.url(""), "slack", &delivery(t, &signed, body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    let forged = slack_sign("not-the-signing-secret", &[(t, body)]).remove(0);
    assert_refused(
        &app,
        "slack",
        &[(
            "a challenge under another secret",
            delivery(t, &forged, body),
            "signature_mismatch",
        )],
    )
    .await;
    assert!(queued(&app.store).await.is_empty(), "nothing enqueued");
    app.stop().await;
}

/// Slack's retries (`X-Slack-Retry-Num`, the same `event_id`, signed anew at their own time) are
/// handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_handled_once() {
    let (first, second) = (event("Ev1"), event("Ev2"));
    let t = now();
    let signatures = slack_sign(
        SECRET,
        &[
            (t - 60, first.as_str()),
            (t - 5, first.as_str()),
            (t, first.as_str()),
            (t, second.as_str()),
        ],
    );
    let retry = |t: i64, signature: &str, n: &str| {
        let mut d = delivery(t, signature, &first);
        d.headers.push(("X-Slack-Retry-Num", n.to_owned()));
        d.headers
            .push(("X-Slack-Retry-Reason", "http_timeout".to_owned()));
        d
    };
    let runs = handler_runs_after(
        Backend::Sqlite,
        sources(&[("slack", "slack", &[SECRET])]),
        "slack",
        &[
            delivery(t - 60, &signatures[0], &first),
            retry(t - 5, &signatures[1], "1"),
            retry(t, &signatures[2], "2"),
            delivery(t, &signatures[3], &second),
        ],
    )
    .await;
    assert_eq!(runs, once_each("slack", &["Ev1", "Ev2"]));
}
