//! `id_field`: a source whose sender documents no id (Zoom, Twilio) can be told where the dedup
//! id is: a JSON pointer into a JSON body, or a form parameter's name. The id the ingress answers
//! and enqueues is that field's; a verified delivery without it is the `missing_id` 400 with
//! nothing enqueued.

use serde_json::json;

use super::{assert_refused, ingress_only, post, queued};
use crate::helpers::senders::{twilio_sign, zoom_sign};
use crate::helpers::{now, Backend, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_id_is_read_where_the_source_says() {
    const ZOOM_SECRET: &str = "zm_id_field_secret";
    const TOKEN: &str = "twilio_id_field_auth_token";
    const URL: &str = "https://hooks.example.com/webhooks/twilio";
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(
        &db,
        json!({
            "zoom": { "scheme": "zoom", "secrets": [ZOOM_SECRET], "id_field": "/payload/object/id" },
            "twilio": { "scheme": "twilio", "secrets": [TOKEN], "public_url": URL, "id_field": "MessageSid" },
        }),
    )
    .await;

    let t = now();
    let body = super::zoom::started("uuid-a==", 1_626_230_691_572);
    let without = r#"{"event":"meeting.started","payload":{"object":{"uuid":"u"}},"event_ts":1}"#;
    let signed = zoom_sign(ZOOM_SECRET, &[(t, body.as_str()), (t, without)]);
    let (status, answer) = post(
        &app.url(""),
        "zoom",
        &super::zoom::delivery(t, &signed[0].0, &body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["id"], "1234567890",
        "the meeting's id, not the scheme's choice"
    );

    // The idempotency token, the scheme's own choice, is there; the source said MessageSid.
    let params = super::twilio::status_params("SM-id-field", "delivered");
    let twilio = twilio_sign(TOKEN, &[super::twilio::form_item(URL, &params)]);
    let form = super::twilio::form(&twilio[0].0, &params, Some("idem-not-used"));
    let (status, answer) = post(&app.url(""), "twilio", &form).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "SM-id-field");

    assert_refused(
        &app,
        "zoom",
        &[(
            "a verified delivery without the field",
            super::zoom::delivery(t, &signed[1].0, without),
            "missing_id",
        )],
    )
    .await;
    let store = db.store().await;
    let mut ids: Vec<String> = queued(&store)
        .await
        .into_iter()
        .filter_map(|m| m.message_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["1234567890", "SM-id-field"]);
}
