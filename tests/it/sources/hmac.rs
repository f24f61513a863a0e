//! `scheme = "hmac"` configured with Slack's and Zoom's rules, as settings: deliveries signed
//! by `slack_sdk` and checked by `@zoom/rivet` (the signers of `slack.rs` and `zoom.rs`) are
//! accepted and enqueued with the id and type the rules point at; the usual forgeries are 400
//! problems naming the check, with nothing enqueued. (Zoom's `endpoint.url_validation` and
//! Slack's `url_verification` are not answered by the declarative scheme: `scheme = "zoom"` /
//! `"slack"` do that.)

use serde_json::json;

use super::{assert_refused, ingress_only, post, queued, Delivery};
use crate::helpers::senders::{slack_sign, zoom_sign};
use crate::helpers::{now, Backend, TestDb};

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const ZOOM_SECRET: &str = "zm_0123456789abcdefABCDEF";

/// Slack's and Zoom's schemes written as `[sources.NAME.hmac]` tables, the first secret of
/// each a retired one (every secret is tried).
fn rules_as_settings() -> serde_json::Value {
    json!({
        "slack-rules": {
            "scheme": "hmac",
            "secrets": ["retired-secret", SLACK_SECRET],
            "hmac": {
                "signature_header": "X-Slack-Signature",
                "signature_prefix": "v0=",
                "signed": "v0:{timestamp}:{body}",
                "timestamp_header": "X-Slack-Request-Timestamp",
                "id_pointer": "/event_id",
                "type_pointer": "/event/type",
            },
        },
        "zoom-rules": {
            "scheme": "hmac",
            "secrets": [ZOOM_SECRET],
            "hmac": {
                "algorithm": "sha256",
                "encoding": "hex",
                "signature_header": "x-zm-signature",
                "signature_prefix": "v0=",
                "signed": "v0:{timestamp}:{body}",
                "timestamp_header": "x-zm-request-timestamp",
                "id_pointer": ["/event", "/event_ts", "/payload/object/uuid"],
                "type_pointer": "/event",
            },
        },
    })
}

fn slack(t: i64, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("X-Slack-Request-Timestamp", &t.to_string()),
            ("X-Slack-Signature", signature),
        ],
        body,
    )
}

fn zoom(t: i64, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("x-zm-request-timestamp", &t.to_string()),
            ("x-zm-signature", signature),
        ],
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_and_zoom_rules_as_settings_accept_their_signers_and_refuse_forgeries() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, rules_as_settings()).await;
    let t = now();
    let slack_body = r#"{"token":"t","team_id":"T1","type":"event_callback","event_id":"Ev01","event":{"type":"app_mention","text":"hi"}}"#;
    let zoom_body = r#"{"event":"meeting.started","event_ts":1700000000123,"payload":{"account_id":"a","object":{"uuid":"4444AAAiAAAAAiAiAiiAii==","id":"6962400003"}}}"#;
    let slack_sigs = slack_sign(
        SLACK_SECRET,
        &[
            (t, slack_body),
            (t - 400, slack_body),
            (t + 400, slack_body),
        ],
    );
    let slack_other = slack_sign("0000000000another0signing0secret", &[(t, slack_body)]);
    let zoom_sigs = zoom_sign(ZOOM_SECRET, &[(t, zoom_body), (t - 400, zoom_body)]);
    let zoom_other = zoom_sign("another-secret-token", &[(t, zoom_body)]);

    let good_slack = slack(t, &slack_sigs[0], slack_body);
    let (status, answer) = post(&app.url(""), "slack-rules", &good_slack).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "Ev01");
    let good_zoom = zoom(t, &zoom_sigs[0].0, zoom_body);
    let (status, answer) = post(&app.url(""), "zoom-rules", &good_zoom).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["id"],
        "meeting.started:1700000000123:4444AAAiAAAAAiAiAiiAii=="
    );

    assert_refused(
        &app,
        "slack-rules",
        &[
            (
                "another secret",
                slack(t, &slack_other[0], slack_body),
                "signature_mismatch",
            ),
            (
                "one byte changed",
                good_slack.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "another timestamp",
                slack(t - 1, &slack_sigs[0], slack_body),
                "signature_mismatch",
            ),
            (
                "400 s ago",
                slack(t - 400, &slack_sigs[1], slack_body),
                "timestamp_tolerance",
            ),
            (
                "400 s ahead",
                slack(t + 400, &slack_sigs[2], slack_body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good_slack.without("X-Slack-Signature"),
                "missing_header",
            ),
            (
                "no timestamp",
                good_slack.without("X-Slack-Request-Timestamp"),
                "missing_header",
            ),
            (
                "no prefix",
                slack(t, &slack_sigs[0][3..], slack_body),
                "malformed_header",
            ),
        ],
    )
    .await;
    assert_refused(
        &app,
        "zoom-rules",
        &[
            (
                "another secret",
                zoom(t, &zoom_other[0].0, zoom_body),
                "signature_mismatch",
            ),
            (
                "one byte changed",
                good_zoom.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "400 s ago",
                zoom(t - 400, &zoom_sigs[1].0, zoom_body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good_zoom.without("x-zm-signature"),
                "missing_header",
            ),
            (
                "no timestamp",
                good_zoom.without("x-zm-request-timestamp"),
                "missing_header",
            ),
        ],
    )
    .await;

    let mut queued: Vec<_> = queued(&app.store)
        .await
        .into_iter()
        .map(|m| (m.source, m.message_id, m.message_type, m.payload))
        .collect();
    queued.sort();
    assert_eq!(
        queued,
        [
            (
                Some("slack-rules".to_owned()),
                Some("Ev01".to_owned()),
                Some("app_mention".to_owned()),
                slack_body.as_bytes().to_vec()
            ),
            (
                Some("zoom-rules".to_owned()),
                Some("meeting.started:1700000000123:4444AAAiAAAAAiAiAiiAii==".to_owned()),
                Some("meeting.started".to_owned()),
                zoom_body.as_bytes().to_vec()
            ),
        ],
        "the two accepted deliveries and nothing else"
    );
    app.stop().await;
}
