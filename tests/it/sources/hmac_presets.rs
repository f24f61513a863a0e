//! `scheme = "hmac"` with each shipped preset (`preset = "typeform"`, …): a delivery signed as
//! the sender documents it (its official library where one signs: HubSpot's, Standard
//! Webhooks' for Clerk's and Resend's Svix scheme; see `helpers::hmac_senders`) is accepted and
//! enqueued with the sender's id and type; the same delivery signed with another secret, and
//! (senders that sign a timestamp) one signed too long ago, are refused with nothing enqueued.
//! Each source's first secret is a retired one: every secret is tried.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{handler_runs_after, ingress_only, once_each, queued, Delivery};
use crate::helpers::hmac_senders::{preset_sign, PresetItem};
use crate::helpers::{now, Backend, TestDb};

/// A Standard Webhooks (Svix) secret, as Clerk and Resend show it.
const SVIX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SVIX_OTHER: &str = "whsec_QWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFh";

/// One preset's case: its name, the body its sender posts, the id in a header (senders that
/// send one), the dedup id and type the preset must find (and those of the batch's other
/// events, for a sender posting several), whether it signs a timestamp.
#[derive(Clone, Copy)]
struct Case<'b> {
    preset: &'static str,
    body: &'b str,
    header_id: &'static str,
    id: &'static str,
    event_type: &'static str,
    others: &'static [(&'static str, &'static str)],
    timestamped: bool,
}

/// A HubSpot delivery: a batch of its events 1, 2 and 3, as it posts them.
const HUBSPOT_BATCH: &str = concat!(
    r#"[{"eventId":1700000001,"subscriptionId":42,"portalId":7,"occurredAt":1700000000000,"#,
    r#""subscriptionType":"contact.creation","attemptNumber":0,"objectId":123},"#,
    r#"{"eventId":1700000002,"subscriptionId":43,"portalId":7,"occurredAt":1700000000100,"#,
    r#""subscriptionType":"contact.propertyChange","attemptNumber":0,"objectId":123,"#,
    r#""propertyName":"email","propertyValue":"a@example.com"},"#,
    r#"{"eventId":1700000003,"subscriptionId":44,"portalId":7,"occurredAt":1700000000200,"#,
    r#""subscriptionType":"deal.creation","attemptNumber":0,"objectId":456}]"#,
);

/// HubSpot's event 4, which came after the batch.
const HUBSPOT_EVENT_4: &str = r#"{"eventId":1700000004,"subscriptionId":44,"portalId":7,"occurredAt":1700000000300,"subscriptionType":"deal.creation","attemptNumber":0,"objectId":789}"#;

/// The elements of a JSON array, each as its text in it.
fn elements(array: &str) -> Vec<String> {
    serde_json::from_str::<Vec<&serde_json::value::RawValue>>(array)
        .expect("an array")
        .iter()
        .map(|raw| raw.get().to_owned())
        .collect()
}

const CASES: &[Case<'static>] = &[
    Case {
        preset: "bitbucket",
        body: r#"{"push":{"changes":[]},"repository":{"full_name":"a/b"}}"#,
        header_id: "8b1f4d0c-2c1a-4c4e-9d8e-0f0e3a6b1c2d",
        id: "8b1f4d0c-2c1a-4c4e-9d8e-0f0e3a6b1c2d",
        event_type: "repo:push",
        others: &[],
        timestamped: false,
    },
    Case {
        preset: "calendly",
        body: r#"{"created_at":"2026-01-01T00:00:00.000000Z","event":"invitee.created","payload":{"uri":"https://api.calendly.com/scheduled_events/E1/invitees/I1"}}"#,
        header_id: "",
        id: "invitee.created:https://api.calendly.com/scheduled_events/E1/invitees/I1",
        event_type: "invitee.created",
        others: &[],
        timestamped: true,
    },
    Case {
        preset: "clerk",
        body: r#"{"data":{"id":"user_29w83sxmDNGwOuEthce5gg56FcC"},"object":"event","type":"user.created"}"#,
        header_id: "msg_2bxR1a3hX8c2t7qW9y0ZzN5vQ1k",
        id: "msg_2bxR1a3hX8c2t7qW9y0ZzN5vQ1k",
        event_type: "user.created",
        others: &[],
        timestamped: true,
    },
    Case {
        preset: "hubspot",
        body: HUBSPOT_BATCH,
        header_id: "",
        id: "1700000001",
        event_type: "contact.creation",
        others: &[
            ("1700000002", "contact.propertyChange"),
            ("1700000003", "deal.creation"),
        ],
        timestamped: true,
    },
    Case {
        preset: "intercom",
        body: r#"{"type":"notification_event","id":"notif_ccd8a4d2-c3b4-4c1e-9f3e-0d2f1a2b3c4d","topic":"conversation.user.created","data":{}}"#,
        header_id: "",
        id: "notif_ccd8a4d2-c3b4-4c1e-9f3e-0d2f1a2b3c4d",
        event_type: "conversation.user.created",
        others: &[],
        timestamped: false,
    },
    Case {
        preset: "resend",
        body: r#"{"type":"email.delivered","created_at":"2026-01-01T00:00:00.000Z","data":{"email_id":"4ef9a417"}}"#,
        header_id: "msg_2c9T4b5kY1d3u8rX0z1AaO6wR2l",
        id: "msg_2c9T4b5kY1d3u8rX0z1AaO6wR2l",
        event_type: "email.delivered",
        others: &[],
        timestamped: true,
    },
    Case {
        preset: "sentry",
        body: r#"{"action":"created","data":{"issue":{"id":"1"}},"installation":{"uuid":"u"}}"#,
        header_id: "d5e1f2a3-b4c5-4d6e-8f90-a1b2c3d4e5f6",
        id: "d5e1f2a3-b4c5-4d6e-8f90-a1b2c3d4e5f6",
        event_type: "issue",
        others: &[],
        timestamped: false,
    },
    Case {
        preset: "twitch",
        body: r#"{"subscription":{"id":"f1c2a387","type":"channel.follow","version":"2"},"event":{"user_id":"1337"}}"#,
        header_id: "befa7b53-d79d-478f-86b9-120f112b044e",
        id: "befa7b53-d79d-478f-86b9-120f112b044e",
        event_type: "channel.follow",
        others: &[],
        timestamped: true,
    },
    Case {
        preset: "typeform",
        body: r#"{"event_id":"01HQ3W1Z2Y","event_type":"form_response","form_response":{"form_id":"lT4Z3j"}}"#,
        header_id: "",
        id: "01HQ3W1Z2Y",
        event_type: "form_response",
        others: &[],
        timestamped: false,
    },
    Case {
        preset: "vercel",
        body: r#"{"id":"uXRBJBSqWCnLDkZeSUNBbSNx","type":"deployment.created","createdAt":1700000000000,"payload":{}}"#,
        header_id: "",
        id: "uXRBJBSqWCnLDkZeSUNBbSNx",
        event_type: "deployment.created",
        others: &[],
        timestamped: false,
    },
];

/// The secret a preset's source is configured with and its sender signs with.
fn secret(preset: &str) -> &'static str {
    match preset {
        "clerk" | "resend" => SVIX_SECRET,
        _ => "s3cret-from-the-senders-dashboard",
    }
}

/// Another secret of the same form.
fn other_secret(preset: &str) -> &'static str {
    match preset {
        "clerk" | "resend" => SVIX_OTHER,
        _ => "not-the-secret-the-source-has",
    }
}

/// Where each source is said to be (HubSpot signs it).
fn public_url(preset: &str) -> String {
    format!("https://hooks.example.com/webhooks/{preset}")
}

/// Each preset as a source of its own name, its retired secret listed first.
fn preset_sources() -> Value {
    let mut tables = serde_json::Map::new();
    for case in CASES {
        let retired = match case.preset {
            "clerk" | "resend" => "whsec_cmV0aXJlZC1rZXktcmV0aXJlZC1rZXk=",
            _ => "retired-secret",
        };
        let mut table = json!({
            "scheme": "hmac",
            "preset": case.preset,
            "secrets": [retired, secret(case.preset)],
        });
        if case.preset == "hubspot" {
            table["public_url"] = json!(public_url(case.preset));
        }
        tables.insert(case.preset.to_owned(), table);
    }
    Value::Object(tables)
}

/// The headers of `case`'s delivery signed with `secret` at `t`.
fn signed(cases: &[(&Case, &str, i64)]) -> Vec<Vec<(String, String)>> {
    let urls: Vec<String> = cases.iter().map(|(c, _, _)| public_url(c.preset)).collect();
    let items: Vec<PresetItem<'_>> = cases
        .iter()
        .zip(&urls)
        .map(|((case, secret, t), url)| PresetItem {
            preset: case.preset,
            secret,
            body: case.body,
            t: *t,
            id: case.header_id,
            url,
        })
        .collect();
    preset_sign(&items)
}

/// Posts `body` with `headers` to `/webhooks/{name}`: the status and the JSON answer.
async fn post(base: &str, name: &str, headers: &[(String, String)], body: &str) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/webhooks/{name}"))
        .body(body.to_owned());
    for (header, value) in headers {
        request = request.header(header, value);
    }
    let response = request.send().await.expect("the ingress answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_preset_accepts_its_senders_signature_and_refuses_forgeries() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = ingress_only(&db, preset_sources()).await;
    let t = now();
    let mut to_sign = Vec::new();
    for case in CASES {
        to_sign.push((case, secret(case.preset), t));
        to_sign.push((case, other_secret(case.preset), t));
        to_sign.push((case, secret(case.preset), t - 3_600));
    }
    let hubspot = *CASES
        .iter()
        .find(|c| c.preset == "hubspot")
        .expect("hubspot");
    let empty = Case {
        body: "[]",
        ..hubspot
    };
    to_sign.push((&empty, secret("hubspot"), t));
    let headers = signed(&to_sign);
    let (status, problem) = post(&app.url(""), "hubspot", &headers[3 * CASES.len()], "[]").await;
    assert_eq!(status, 400, "an empty batch: {problem}");
    assert_eq!(problem["check"], "empty_batch", "{problem}");
    for (i, case) in CASES.iter().enumerate() {
        let [good, other, stale] = [&headers[3 * i], &headers[3 * i + 1], &headers[3 * i + 2]];
        let (status, answer) = post(&app.url(""), case.preset, good, case.body).await;
        assert_eq!(status, 200, "{}: {answer}", case.preset);
        // A batch's receipt names its last event.
        let last = case.others.last().map_or(case.id, |(id, _)| id);
        assert_eq!(answer["id"], last, "{}", case.preset);
        let mut forgeries = vec![
            (
                "another secret",
                other.clone(),
                case.body.to_owned(),
                "signature_mismatch",
            ),
            (
                "one byte changed",
                good.clone(),
                case.body.replacen('"', "'", 1),
                "signature_mismatch",
            ),
            (
                "no headers",
                Vec::new(),
                case.body.to_owned(),
                "missing_header",
            ),
        ];
        if case.timestamped {
            forgeries.push((
                "an hour ago",
                stale.clone(),
                case.body.to_owned(),
                "timestamp_tolerance",
            ));
        }
        for (what, headers, body, check) in forgeries {
            let (status, problem) = post(&app.url(""), case.preset, &headers, &body).await;
            assert_eq!(status, 400, "{} {what}: {problem}", case.preset);
            assert_eq!(problem["check"], check, "{} {what}: {problem}", case.preset);
        }
    }
    let mut found: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut hubspot_payloads = Vec::new();
    for m in queued(&app.store).await {
        let source = m.source.unwrap_or_default();
        if source == "hubspot" {
            hubspot_payloads.push(String::from_utf8(m.payload).expect("utf-8"));
        }
        found.entry(source).or_default().push((
            m.message_id.unwrap_or_default(),
            m.message_type.unwrap_or_default(),
        ));
    }
    let expected: BTreeMap<String, Vec<(String, String)>> = CASES
        .iter()
        .map(|c| {
            let events = std::iter::once((c.id, c.event_type))
                .chain(c.others.iter().copied())
                .map(|(id, t)| (id.to_owned(), t.to_owned()))
                .collect();
            (c.preset.to_owned(), events)
        })
        .collect();
    // HubSpot's batch is three events, each its payload byte for byte as it was in the batch.
    assert_eq!(hubspot_payloads, elements(HUBSPOT_BATCH));
    assert_eq!(found, expected, "one message per event, and nothing else");
    app.stop().await;
}

/// A preset's sender retrying one event (the same body, signed anew) is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presets_retries_are_handled_once() {
    let case = CASES.iter().find(|c| c.preset == "clerk").expect("clerk");
    let t = now();
    let headers = signed(&[(case, SVIX_SECRET, t - 30), (case, SVIX_SECRET, t)]);
    let deliveries: Vec<Delivery> = headers
        .iter()
        .map(|h| {
            let mut d = Delivery::new(&[], case.body);
            for (name, value) in h {
                let name: &'static str = match name.as_str() {
                    "svix-id" => "svix-id",
                    "svix-timestamp" => "svix-timestamp",
                    _ => "svix-signature",
                };
                d.headers.push((name, value.clone()));
            }
            d
        })
        .collect();
    let runs = handler_runs_after(
        Backend::Sqlite,
        json!({ "clerk": { "scheme": "hmac", "preset": "clerk", "secrets": [SVIX_SECRET] } }),
        "clerk",
        &deliveries,
    )
    .await;
    assert_eq!(runs, once_each("clerk", &[case.id]));
}

/// HubSpot regrouping its events: events 1, 2, 3 in one delivery, then 2, 3 and a new 4 in
/// another (signed anew). Each event is handled exactly once, none lost as a duplicate of the
/// batch it arrived with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hubspots_regrouped_batches_handle_each_event_once() {
    let first = *CASES
        .iter()
        .find(|c| c.preset == "hubspot")
        .expect("hubspot");
    let mut regrouped = elements(HUBSPOT_BATCH)[1..].to_vec();
    regrouped.push(HUBSPOT_EVENT_4.to_owned());
    let regrouped = format!("[{}]", regrouped.join(","));
    let second = Case {
        body: &regrouped,
        ..first
    };
    let t = now();
    let secret = secret("hubspot");
    let headers = signed(&[(&first, secret, t - 30), (&second, secret, t)]);
    let deliveries: Vec<Delivery> = [&first, &second]
        .iter()
        .zip(&headers)
        .map(|(case, h)| {
            let mut d = Delivery::new(&[], case.body);
            for (name, value) in h {
                let name: &'static str = match name.as_str() {
                    "X-HubSpot-Signature-v3" => "X-HubSpot-Signature-v3",
                    _ => "X-HubSpot-Request-Timestamp",
                };
                d.headers.push((name, value.clone()));
            }
            d
        })
        .collect();
    let runs = handler_runs_after(
        Backend::Sqlite,
        json!({ "hubspot": {
            "scheme": "hmac", "preset": "hubspot", "secrets": [secret],
            "public_url": public_url("hubspot"),
        } }),
        "hubspot",
        &deliveries,
    )
    .await;
    assert_eq!(
        runs,
        once_each(
            "hubspot",
            &["1700000001", "1700000002", "1700000003", "1700000004"]
        )
    );
}
