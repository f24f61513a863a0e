//! `scheme = "paddle"`: `Paddle-Signature` made by `paddle-python-sdk`'s
//! `PaddleSignature.calculate_hmac` (and checked by its `PaddleSignature.verify`), over the
//! timestamp and the body, within five minutes either way, any `h1` of a rotation; the dedup id
//! the body's `event_id`, the type its `event_type`.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::paddle_sign;
use crate::helpers::{now, Backend, TestDb};

const SECRET: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI5vEI";
const ROTATED: &str = "pdl_ntfset_01hx0000000000000000000000_newsecretnewsecretnewsecret";

/// A notification as Paddle sends it.
fn delivery(signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("Paddle-Signature", signature),
            ("Content-Type", "application/json"),
            ("User-Agent", "Paddle"),
        ],
        body,
    )
}

/// A notification of event `id`; `notification` is the per-destination id Paddle also sends.
fn event(id: &str, notification: &str) -> String {
    format!(
        r#"{{"event_id":"{id}","event_type":"transaction.completed","occurred_at":"2024-04-12T10:18:49.621022Z","notification_id":"{notification}","data":{{"id":"txn_01hv8wptq8987qeep44cyrewp9","status":"completed"}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_by_paddle_sdk_accepted_and_forgeries_refused_with_nothing_enqueued() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("paddle", "paddle", &[SECRET])])).await;
    let t = now();
    let body = event("evt_01hv8wt8nffy3ytpk3pzp2q0y5", "ntf_1");
    let (stale, future) = (t - 400, t + 400);
    let signatures = paddle_sign(
        &[SECRET],
        &[
            (t, body.as_str()),
            (stale, body.as_str()),
            (future, body.as_str()),
        ],
    );
    // A rotation: the header carries the new secret's h1 beside the configured one's.
    let rotation = paddle_sign(&[ROTATED, SECRET], &[(t, body.as_str())]).remove(0);
    let under_other = paddle_sign(&["pdl_ntfset_not_the_secret"], &[(t, body.as_str())]);
    let good = delivery(&signatures[0], &body);
    let (status, answer) = post(&app.url(""), "paddle", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "evt_01hv8wt8nffy3ytpk3pzp2q0y5");
    let (status, answer) = post(&app.url(""), "paddle", &delivery(&rotation, &body)).await;
    assert_eq!(status, 200, "{answer}");

    let h1 = signatures[0].split_once(";h1=").expect("one h1").1;
    assert_refused(
        &app,
        "paddle",
        &[
            (
                "signed with another secret",
                delivery(&under_other[0], &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "the signature of another timestamp",
                delivery(&format!("ts={};h1={h1}", t - 1), &body),
                "signature_mismatch",
            ),
            (
                "signed 400 s ago",
                delivery(&signatures[1], &body),
                "timestamp_tolerance",
            ),
            (
                "signed 400 s ahead",
                delivery(&signatures[2], &body),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good.without("Paddle-Signature"),
                "missing_header",
            ),
            (
                "no timestamp",
                delivery(&format!("h1={h1}"), &body),
                "malformed_header",
            ),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(
        queued.len(),
        2,
        "the two accepted deliveries and nothing else"
    );
    for message in &queued {
        assert_eq!(message.source.as_deref(), Some("paddle"));
        assert_eq!(
            message.message_id.as_deref(),
            Some("evt_01hv8wt8nffy3ytpk3pzp2q0y5")
        );
        assert_eq!(
            message.message_type.as_deref(),
            Some("transaction.completed")
        );
        assert_eq!(message.payload, body.as_bytes());
    }
    app.stop().await;
}

/// Paddle's retries of one event (the same `event_id`, signed anew at their own time) are
/// handled once, and so is the event's notification to a second destination pointed at the same
/// source (another `notification_id`, the same `event_id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_an_event_are_handled_once() {
    let first = event("evt_1", "ntf_1");
    let other_destination = event("evt_1", "ntf_2");
    let second = event("evt_2", "ntf_3");
    let t = now();
    let signatures = paddle_sign(
        &[SECRET],
        &[
            (t - 60, first.as_str()),
            (t - 5, first.as_str()),
            (t, other_destination.as_str()),
            (t, second.as_str()),
        ],
    );
    let runs = handler_runs_after(
        Backend::Sqlite,
        sources(&[("paddle", "paddle", &[SECRET])]),
        "paddle",
        &[
            delivery(&signatures[0], &first),
            delivery(&signatures[1], &first),
            delivery(&signatures[2], &other_destination),
            delivery(&signatures[3], &second),
        ],
    )
    .await;
    assert_eq!(runs, once_each("paddle", &["evt_1", "evt_2"]));
}
