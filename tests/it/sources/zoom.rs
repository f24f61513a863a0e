//! `scheme = "zoom"`: `x-zm-signature` over the timestamp and the body (a plain HMAC, as Zoom
//! signs; `@zoom/rivet`'s receiver accepts each one the test sends), within five minutes either
//! way; the dedup id the body's event, `event_ts` and object; `endpoint.url_validation` answered
//! as Rivet answers it, verified first, nothing enqueued.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::zoom_sign;
use crate::helpers::{now, Backend, TestDb};

const SECRET: &str = "zm_0123456789abcdefABCDEF";

/// A notification as Zoom sends it, signed at `t`.
pub(super) fn delivery(t: i64, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("x-zm-request-timestamp", &t.to_string()),
            ("x-zm-signature", signature),
            ("x-zm-trackingid", "v=2.0;clid=aw1;rid=WEB_1"),
            ("Content-Type", "application/json; charset=utf-8"),
            ("User-Agent", "Zoom Marketplace/1.0a"),
        ],
        body,
    )
}

/// A `meeting.started` of meeting instance `uuid`, at `event_ts` (ms).
pub(super) fn started(uuid: &str, event_ts: i64) -> String {
    format!(
        r#"{{"event":"meeting.started","payload":{{"account_id":"AAAAAABBBB","object":{{"id":"1234567890","uuid":"{uuid}","host_id":"x1","topic":"t","type":2}}}},"event_ts":{event_ts}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_as_zoom_and_accepted_by_rivet_accepted_and_forgeries_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("zoom", "zoom", &[SECRET])])).await;
    let t = now();
    let body = started("4444AAAiAAAAAiAiAiiAii==", 1_626_230_691_572);
    let (stale, future) = (t - 400, t + 400);
    let signed = zoom_sign(
        SECRET,
        &[
            (t, body.as_str()),
            (stale, body.as_str()),
            (future, body.as_str()),
        ],
    );
    let under_other = zoom_sign("zm_not_the_secret", &[(t, body.as_str())]);
    let good = delivery(t, &signed[0].0, &body);
    let (status, answer) = post(&app.url(""), "zoom", &good).await;
    assert_eq!(status, 200, "{answer}");
    let id = "meeting.started:1626230691572:4444AAAiAAAAAiAiAiiAii==";
    assert_eq!(answer["id"], id);

    assert_refused(
        &app,
        "zoom",
        &[
            (
                "signed with another secret",
                delivery(t, &under_other[0].0, &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "the signature of another timestamp",
                delivery(t - 1, &signed[0].0, &body),
                "signature_mismatch",
            ),
            (
                "signed 400 s ago",
                delivery(stale, &signed[1].0, &body),
                "timestamp_tolerance",
            ),
            (
                "signed 400 s ahead",
                delivery(future, &signed[2].0, &body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good.without("x-zm-signature"),
                "missing_header",
            ),
            (
                "no timestamp",
                good.without("x-zm-request-timestamp"),
                "missing_header",
            ),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(queued.len(), 1, "the accepted delivery and nothing else");
    assert_eq!(queued[0].source.as_deref(), Some("zoom"));
    assert_eq!(queued[0].message_id.as_deref(), Some(id));
    assert_eq!(queued[0].message_type.as_deref(), Some("meeting.started"));
    assert_eq!(queued[0].payload, body.as_bytes());
    app.stop().await;
}

/// Zoom's `endpoint.url_validation`: answered exactly as `@zoom/rivet` answers it once
/// verified; a forged one is refused like any forgery; neither is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_validation_is_answered_as_rivet_answers_it_once_verified() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("zoom", "zoom", &[SECRET])])).await;
    let t = now();
    let body = r#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let (signature, rivet) = zoom_sign(SECRET, &[(t, body)]).remove(0);
    assert!(rivet["encryptedToken"].is_string(), "{rivet}");
    let (status, answer) = post(&app.url(""), "zoom", &delivery(t, &signature, body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, rivet);
    let forged = zoom_sign("zm_not_the_secret", &[(t, body)]).remove(0).0;
    assert_refused(
        &app,
        "zoom",
        &[(
            "a url_validation under another secret",
            delivery(t, &forged, body),
            "signature_mismatch",
        )],
    )
    .await;
    assert!(queued(&app.store).await.is_empty(), "nothing enqueued");
    app.stop().await;
}

/// Zoom's retries (+5, +20, +60 minutes: the same body, signed anew at their own time) are
/// handled once; another instance of the meeting is another event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_handled_once() {
    let (first, second) = (
        started("uuid-1==", 1_700_000_000_001),
        started("uuid-2==", 1_700_000_000_001),
    );
    let t = now();
    let signed = zoom_sign(
        SECRET,
        &[
            (t - 200, first.as_str()),
            (t - 5, first.as_str()),
            (t, first.as_str()),
            (t, second.as_str()),
        ],
    );
    let runs = handler_runs_after(
        Backend::Sqlite,
        sources(&[("zoom", "zoom", &[SECRET])]),
        "zoom",
        &[
            delivery(t - 200, &signed[0].0, &first),
            delivery(t - 5, &signed[1].0, &first),
            delivery(t, &signed[2].0, &first),
            delivery(t, &signed[3].0, &second),
        ],
    )
    .await;
    assert_eq!(
        runs,
        once_each(
            "zoom",
            &[
                "meeting.started:1700000000001:uuid-1==",
                "meeting.started:1700000000001:uuid-2=="
            ]
        )
    );
}
