//! `scheme = "linear"`: `Linear-Signature` over the raw body (a plain HMAC, as `@linear/sdk`
//! only verifies; its `LinearWebhookClient.verify` accepts each fresh one the test sends), the
//! body's `webhookTimestamp` within 60 s either way; the dedup id `Linear-Delivery`, the type
//! `Linear-Event`.

use super::{
    assert_refused, handler_runs_after, ingress_only, once_each, post, queued, sources, Delivery,
};
use crate::helpers::senders::linear_sign;
use crate::helpers::{now, Backend, TestDb};

const SECRET: &str = "lin_wh_0123456789abcdef0123456789abcdef";

/// A delivery as Linear sends it.
fn delivery(id: &str, signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("Linear-Delivery", id),
            ("Linear-Event", "Issue"),
            ("Linear-Signature", signature),
            ("Content-Type", "application/json; charset=utf-8"),
            ("User-Agent", "Linear-Webhook"),
        ],
        body,
    )
}

/// An Issue event's body, stamped at `ms` (Unix milliseconds).
fn issue(issue_id: &str, ms: i64) -> String {
    format!(
        r#"{{"action":"create","type":"Issue","createdAt":"2024-04-12T10:18:49.621Z","data":{{"id":"{issue_id}","title":"t"}},"url":"https://linear.app/x/issue/X-1","webhookId":"wh_1","webhookTimestamp":{ms}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_as_linear_and_accepted_by_its_sdk_accepted_and_forgeries_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, sources(&[("linear", "linear", &[SECRET])])).await;
    let ms = now() * 1000 + 123;
    let body = issue("i-1", ms);
    let (stale, future) = (issue("i-1", ms - 90_000), issue("i-1", ms + 90_000));
    let signatures = linear_sign(SECRET, &[&body, &stale, &future]);
    let under_other = linear_sign("lin_wh_not_the_secret", &[&body]);
    let good = delivery("d-1", &signatures[0], &body);
    let (status, answer) = post(&app.url(""), "linear", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "d-1");

    assert_refused(
        &app,
        "linear",
        &[
            (
                "signed with another secret",
                delivery("d-2", &under_other[0], &body),
                "signature_mismatch",
            ),
            (
                "body changed by one byte",
                good.with_one_byte_changed(),
                "signature_mismatch",
            ),
            (
                "stamped 90 s ago",
                delivery("d-3", &signatures[1], &stale),
                "timestamp_tolerance",
            ),
            (
                "stamped 90 s ahead",
                delivery("d-4", &signatures[2], &future),
                "timestamp_tolerance",
            ),
            (
                "no signature",
                good.without("Linear-Signature"),
                "missing_header",
            ),
            (
                "a sha256= prefix",
                delivery("d-5", &format!("sha256={}", signatures[0]), &body),
                "malformed_header",
            ),
            // Verified, but nothing to deduplicate on.
            (
                "no delivery id",
                good.without("Linear-Delivery"),
                "missing_id",
            ),
        ],
    )
    .await;

    let queued = queued(&app.store).await;
    assert_eq!(queued.len(), 1, "the accepted delivery and nothing else");
    assert_eq!(queued[0].source.as_deref(), Some("linear"));
    assert_eq!(queued[0].message_id.as_deref(), Some("d-1"));
    assert_eq!(queued[0].message_type.as_deref(), Some("Issue"));
    assert_eq!(queued[0].payload, body.as_bytes());
    app.stop().await;
}

/// A retry with the same `Linear-Delivery` (restamped, so signed anew) is handled once; another
/// delivery is another event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delivery_is_handled_once() {
    let ms = now() * 1000;
    let (first, retry, second) = (
        issue("i-1", ms - 30_000),
        issue("i-1", ms),
        issue("i-2", ms),
    );
    let signatures = linear_sign(SECRET, &[&first, &retry, &second]);
    let runs = handler_runs_after(
        Backend::Sqlite,
        sources(&[("linear", "linear", &[SECRET])]),
        "linear",
        &[
            delivery("d-1", &signatures[0], &first),
            delivery("d-1", &signatures[1], &retry),
            delivery("d-1", &signatures[1], &retry),
            delivery("d-2", &signatures[2], &second),
        ],
    )
    .await;
    assert_eq!(runs, once_each("linear", &["d-1", "d-2"]));
}
