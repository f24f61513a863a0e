//! `scheme = "twilio"`: `X-Twilio-Signature` over the configured `public_url` with the
//! request's query and the sorted form parameters, or, for a JSON body, over the URL carrying
//! its `bodySHA256`; each signature made by the `twilio` library's `RequestValidator`. The
//! dedup id is `I-Twilio-Idempotency-Token`, else the resource's sid and status; the type the
//! status. A form body is not JSON: the pipeline test shows it handled once all the same.

use serde_json::{json, Value};

use super::{assert_refused, handler_runs_after, ingress_only, once_each, post, queued, Delivery};
use crate::helpers::senders::twilio_sign;
use crate::helpers::{Backend, TestDb};

const TOKEN: &str = "12345678901234567890123456789012";
/// The URL Twilio was given: a proxy's, not the test server's own address.
const URL: &str = "https://hooks.example.com/webhooks/twilio";
/// The query string the test's requests carry (Twilio signs it with the URL).
const QUERY: &str = "tenant=a%20b&x=1";

fn twilio_source() -> Value {
    json!({ "twilio": { "scheme": "twilio", "secrets": ["an-old-token", TOKEN], "public_url": URL } })
}

/// A message status callback's parameters, as Twilio posts them.
pub(super) fn status_params(sid: &str, status: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AccountSid", "AC0123456789abcdef0123456789abcdef".into()),
        ("ApiVersion", "2010-04-01".into()),
        ("From", "+15017122661".into()),
        ("MessageSid", sid.into()),
        ("MessageStatus", status.into()),
        ("SmsSid", sid.into()),
        ("SmsStatus", status.into()),
        ("To", "+15558675310".into()),
        ("Body", "Ahoy & grüße = 100%".into()),
    ]
}

/// `params` as the `twilio` library takes them, to sign for `url`.
pub(super) fn form_item(url: &str, params: &[(&'static str, String)]) -> Value {
    let params: serde_json::Map<String, Value> = params
        .iter()
        .map(|(n, v)| ((*n).to_owned(), Value::from(v.as_str())))
        .collect();
    json!({ "url": url, "params": params })
}

/// A form POST of `params` signed `signature`, with an idempotency token when given.
pub(super) fn form(
    signature: &str,
    params: &[(&'static str, String)],
    token: Option<&str>,
) -> Delivery {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().map(|(n, v)| (*n, v.as_str())))
        .finish();
    let mut delivery = Delivery::new(
        &[
            ("X-Twilio-Signature", signature),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("User-Agent", "TwilioProxy/1.1"),
        ],
        &body,
    );
    if let Some(token) = token {
        delivery
            .headers
            .push(("I-Twilio-Idempotency-Token", token.to_owned()));
    }
    delivery
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_by_the_twilio_library_accepted_and_forgeries_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, twilio_source()).await;
    let url = format!("{URL}?{QUERY}");
    let params = status_params("SM8f1e2d", "delivered");
    let changed = status_params("SM8f1e2d", "failed");
    let event = r#"[{"specversion":"1.0","type":"com.twilio.messaging.message.delivered","source":"/2010-04-01/Accounts/AC0/Messages/SM1.json","id":"EZ5c7a","data":{"messageSid":"SM1"}}]"#;
    let signed = twilio_sign(
        TOKEN,
        &[
            form_item(&url, &params),
            // Twilio's back end may sign the default port spelled out; its validator accepts it.
            form_item(
                &format!("https://hooks.example.com:443/webhooks/twilio?{QUERY}"),
                &params,
            ),
            form_item(
                &format!("https://hooks.example.com/webhooks/other?{QUERY}"),
                &params,
            ),
            json!({ "url": URL, "body": event }),
            json!({ "url": URL, "body": "{\"type\":\"other\"}" }),
        ],
    );
    let under_other = twilio_sign("not-the-token", &[form_item(&url, &params)]);
    let on = |query: &str| format!("twilio?{query}");

    let good = form(&signed[0].0, &params, Some("idem-1"));
    let (status, answer) = post(&app.url(""), &on(QUERY), &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "idem-1");
    let with_port = form(&signed[1].0, &params, Some("idem-2"));
    let (status, answer) = post(&app.url(""), &on(QUERY), &with_port).await;
    assert_eq!(status, 200, "{answer}");
    let json_body = Delivery::new(
        &[
            ("X-Twilio-Signature", signed[3].0.as_str()),
            ("Content-Type", "application/json"),
            ("I-Twilio-Idempotency-Token", "idem-3"),
        ],
        event,
    );
    let (status, answer) = post(&app.url(""), &on(&signed[3].1), &json_body).await;
    assert_eq!(status, 200, "{answer}");

    for (what, delivery, query, check) in [
        (
            "signed with another token",
            form(&under_other[0].0, &params, None),
            QUERY.to_owned(),
            "signature_mismatch",
        ),
        (
            "a parameter changed",
            form(&signed[0].0, &changed, None),
            QUERY.to_owned(),
            "signature_mismatch",
        ),
        (
            "signed for another URL",
            form(&signed[2].0, &params, None),
            QUERY.to_owned(),
            "signature_mismatch",
        ),
        (
            "the query changed",
            form(&signed[0].0, &params, None),
            "tenant=a%20b&x=2".to_owned(),
            "signature_mismatch",
        ),
        (
            "no signature",
            good.without("X-Twilio-Signature"),
            QUERY.to_owned(),
            "missing_header",
        ),
        (
            "the JSON body changed",
            json_body.with_one_byte_changed(),
            signed[3].1.clone(),
            "body_hash_mismatch",
        ),
        (
            "another body's hash in the URL",
            Delivery::new(&[("X-Twilio-Signature", signed[3].0.as_str())], event),
            signed[4].1.clone(),
            "signature_mismatch",
        ),
        (
            "another body under a signed URL and hash",
            Delivery::new(&[("X-Twilio-Signature", signed[4].0.as_str())], event),
            signed[4].1.clone(),
            "body_hash_mismatch",
        ),
    ] {
        let (status, problem) = post(&app.url(""), &on(&query), &delivery).await;
        assert_eq!(status, 400, "{what}: {problem}");
        assert_eq!(problem["check"], check, "{what}: {problem}");
    }
    assert_refused(
        &app,
        "twilio",
        &[("not base64", form("%%%", &params, None), "malformed_header")],
    )
    .await;

    let queued = queued(&app.store).await;
    let seen: Vec<(Option<&str>, Option<&str>, Option<&str>)> = queued
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
            (Some("twilio"), Some("idem-1"), Some("delivered")),
            (Some("twilio"), Some("idem-2"), Some("delivered")),
            // An Event Streams array: each CloudEvent its own event, on its own id.
            (
                Some("twilio"),
                Some("EZ5c7a"),
                Some("com.twilio.messaging.message.delivered")
            ),
        ],
        "the accepted deliveries and nothing else"
    );
    assert_eq!(queued[0].payload, good.body.as_bytes());
    assert_eq!(queued[2].payload, &event.as_bytes()[1..event.len() - 1]);
    app.stop().await;
}

/// A retry (the same token, the same signed request) is handled once; without a token, the
/// message's sid and status are the id, so its retry is handled once too. The payload is a form
/// body, not JSON: the consumer takes the transport's id and type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_handled_once_through_the_pipeline() {
    let url = format!("{URL}?{QUERY}");
    let (first, second) = (
        status_params("SM-one", "sent"),
        status_params("SM-two", "delivered"),
    );
    let signed = twilio_sign(TOKEN, &[form_item(&url, &first), form_item(&url, &second)]);
    let runs = handler_runs_after(
        Backend::Postgres,
        twilio_source(),
        &format!("twilio?{QUERY}"),
        &[
            form(&signed[0].0, &first, Some("idem-a")),
            form(&signed[0].0, &first, Some("idem-a")),
            form(&signed[1].0, &second, None),
            form(&signed[1].0, &second, None),
        ],
    )
    .await;
    let mut runs = runs;
    // The database's collation orders the ids; the test does not depend on it.
    runs.sort();
    assert_eq!(runs, once_each("twilio", &["SM-two:delivered", "idem-a"]));
}
