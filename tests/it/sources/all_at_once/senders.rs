//! The run's senders, one function each: its source's settings as the binary's environment,
//! and the event's first delivery and the sender's retry of it, signed by the sender's library.

use super::super::Delivery;
use super::Sender;
use crate::helpers::senders::{
    adyen_sign, github_sign, linear_sign, paddle_sign, paypal_sign, shopify_sign, slack_sign,
    square_sign, standard_sign, twilio_sign, zoom_sign,
};
use crate::helpers::{stripe_event, stripe_python_sign};

/// Every sender of the run, one row each.
pub(super) fn senders(t: i64) -> Vec<Sender> {
    vec![
        github(),
        shopify(),
        slack(t),
        paddle(t),
        linear(t),
        zoom(t),
        square(),
        twilio(),
        adyen(),
        paypal(t),
        clerk(t),
        stripe(t),
        standard(t),
    ]
}

/// `[sources.NAME]` from the environment: its scheme and secret (and `public_url`).
fn source_env(vars: [&'static str; 2], scheme: &str, secret: &str) -> Vec<(&'static str, String)> {
    vec![(vars[0], scheme.to_owned()), (vars[1], secret.to_owned())]
}

/// GitHub redelivers (from its UI or API) with the same GUID.
fn github() -> Sender {
    let body = r#"{"ref":"refs/heads/main","after":"6dcb09b5b57875f334f61aebed695e2e4193db5e"}"#;
    let signature = github_sign("gh-all-secret", &[body]).remove(0);
    let delivery = || {
        Delivery::new(
            &[
                ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                ("X-GitHub-Event", "push"),
                ("X-GitHub-Hook-ID", "42"),
                ("X-Hub-Signature-256", &signature),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    Sender {
        name: "github",
        env: source_env(
            [
                "DEDUP_SOURCES__GITHUB__SCHEME",
                "DEDUP_SOURCES__GITHUB__SECRETS",
            ],
            "github",
            "gh-all-secret",
        ),
        deliveries: [delivery(), delivery()],
        id: "42:72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
    }
}

/// Shopify retries the same webhook, with the same event id.
fn shopify() -> Sender {
    const SECRET: &str = "shpss_all_at_once_00000000000000000";
    let body = r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"598.94"}"#;
    let hmac = shopify_sign(SECRET, &[body]).remove(0);
    let delivery = || {
        Delivery::new(
            &[
                ("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
                (
                    "X-Shopify-Webhook-Id",
                    "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
                ),
                ("X-Shopify-Topic", "orders/create"),
                ("X-Shopify-Shop-Domain", "example.myshopify.com"),
                ("X-Shopify-Hmac-Sha256", &hmac),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    Sender {
        name: "shopify",
        env: source_env(
            [
                "DEDUP_SOURCES__SHOPIFY__SCHEME",
                "DEDUP_SOURCES__SHOPIFY__SECRETS",
            ],
            "shopify",
            SECRET,
        ),
        deliveries: [delivery(), delivery()],
        id: "98880550-7158-44d4-b7cd-2c97c8a091b5".into(),
    }
}

/// Slack retries with `X-Slack-Retry-Num`, signed anew at its own time.
fn slack(t: i64) -> Sender {
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    let body = r#"{"token":"t","team_id":"T1","type":"event_callback","event_id":"Ev0ALL","event_time":1700000000,"event":{"type":"app_mention","text":"hi","user":"U1"}}"#;
    let signatures = slack_sign(SECRET, &[(t - 60, body), (t, body)]);
    let delivery = |t: i64, signature: &str, retry: Option<&str>| {
        let mut d = Delivery::new(
            &[
                ("X-Slack-Request-Timestamp", &t.to_string()),
                ("X-Slack-Signature", signature),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        if let Some(n) = retry {
            d.headers.push(("X-Slack-Retry-Num", n.to_owned()));
            d.headers
                .push(("X-Slack-Retry-Reason", "http_timeout".to_owned()));
        }
        d
    };
    Sender {
        name: "slack",
        env: source_env(
            [
                "DEDUP_SOURCES__SLACK__SCHEME",
                "DEDUP_SOURCES__SLACK__SECRETS",
            ],
            "slack",
            SECRET,
        ),
        deliveries: [
            delivery(t - 60, &signatures[0], None),
            delivery(t, &signatures[1], Some("1")),
        ],
        id: "Ev0ALL".into(),
    }
}

/// Paddle retries the event, signed anew at its own time.
fn paddle(t: i64) -> Sender {
    const SECRET: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_allAtOnceSecretAllAtOnce00";
    let body = r#"{"event_id":"evt_01all","event_type":"transaction.completed","occurred_at":"2024-04-12T10:18:49.621022Z","notification_id":"ntf_01all","data":{"id":"txn_01hv8wptq8987qeep44cyrewp9","status":"completed"}}"#;
    let signatures = paddle_sign(&[SECRET], &[(t - 60, body), (t, body)]);
    let delivery = |signature: &str| {
        Delivery::new(
            &[
                ("Paddle-Signature", signature),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    Sender {
        name: "paddle",
        env: source_env(
            [
                "DEDUP_SOURCES__PADDLE__SCHEME",
                "DEDUP_SOURCES__PADDLE__SECRETS",
            ],
            "paddle",
            SECRET,
        ),
        deliveries: [delivery(&signatures[0]), delivery(&signatures[1])],
        id: "evt_01all".into(),
    }
}

/// Linear retries the delivery (same `Linear-Delivery`), restamped and signed anew.
fn linear(t: i64) -> Sender {
    const SECRET: &str = "lin_wh_all_at_once_secret";
    let issue = |ms: i64| {
        format!(
            r#"{{"action":"create","type":"Issue","createdAt":"2024-04-12T10:18:49.621Z","data":{{"id":"i-all","title":"t"}},"url":"https://linear.app/x/issue/X-1","webhookId":"wh_1","webhookTimestamp":{ms}}}"#
        )
    };
    let (first, retry) = (issue(t * 1000 - 30_000), issue(t * 1000));
    let signatures = linear_sign(SECRET, &[&first, &retry]);
    let delivery = |signature: &str, body: &str| {
        Delivery::new(
            &[
                ("Linear-Delivery", "d-all"),
                ("Linear-Event", "Issue"),
                ("Linear-Signature", signature),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            body,
        )
    };
    Sender {
        name: "linear",
        env: source_env(
            [
                "DEDUP_SOURCES__LINEAR__SCHEME",
                "DEDUP_SOURCES__LINEAR__SECRETS",
            ],
            "linear",
            SECRET,
        ),
        deliveries: [
            delivery(&signatures[0], &first),
            delivery(&signatures[1], &retry),
        ],
        id: "d-all".into(),
    }
}

/// Zoom retries the event, signed anew at its own time.
fn zoom(t: i64) -> Sender {
    const SECRET: &str = "zm_all_at_once_secret";
    let body = r#"{"event":"meeting.started","payload":{"account_id":"AAAAAABBBB","object":{"id":"1234567890","uuid":"uuid-all==","host_id":"x1","topic":"t","type":2}},"event_ts":1700000000001}"#;
    let signed = zoom_sign(SECRET, &[(t - 60, body), (t, body)]);
    let delivery = |t: i64, signature: &str| {
        Delivery::new(
            &[
                ("x-zm-request-timestamp", &t.to_string()),
                ("x-zm-signature", signature),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            body,
        )
    };
    Sender {
        name: "zoom",
        env: source_env(
            [
                "DEDUP_SOURCES__ZOOM__SCHEME",
                "DEDUP_SOURCES__ZOOM__SECRETS",
            ],
            "zoom",
            SECRET,
        ),
        deliveries: [delivery(t - 60, &signed[0].0), delivery(t, &signed[1].0)],
        id: "meeting.started:1700000000001:uuid-all==".into(),
    }
}

/// Square retries the same bytes and signature, with `square-retry-number`.
fn square() -> Sender {
    const KEY: &str = "sq0wsk_all_at_once_key";
    const URL: &str = "https://hooks.example.com/webhooks/square";
    let body = r#"{"merchant_id":"6SSW7HV8K2ST5","type":"payment.updated","event_id":"e-all","created_at":"2024-04-12T10:18:49.621Z","data":{"type":"payment","id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","object":{"payment":{"status":"COMPLETED"}}}}"#;
    let signature = square_sign(KEY, &[(URL, body)]).remove(0);
    let delivery = |retry: Option<&str>| {
        let mut d = Delivery::new(
            &[
                ("x-square-hmacsha256-signature", &signature),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        if let Some(n) = retry {
            d.headers.push(("square-retry-number", n.to_owned()));
            d.headers
                .push(("square-retry-reason", "http_timeout".to_owned()));
        }
        d
    };
    let mut env = source_env(
        [
            "DEDUP_SOURCES__SQUARE__SCHEME",
            "DEDUP_SOURCES__SQUARE__SECRETS",
        ],
        "square",
        KEY,
    );
    env.push(("DEDUP_SOURCES__SQUARE__PUBLIC_URL", URL.to_owned()));
    Sender {
        name: "square",
        env,
        deliveries: [delivery(None), delivery(Some("1"))],
        id: "e-all".into(),
    }
}

/// Stripe retries the event, signed anew (by `stripe-python`) at its own time.
fn stripe(t: i64) -> Sender {
    const SECRET: &str = "whsec_all_at_once";
    let body = stripe_event("evt_all_at_once", "invoice.paid");
    let headers = stripe_python_sign(SECRET, &[(body.clone(), t - 60), (body.clone(), t)]);
    let body = String::from_utf8(body).expect("JSON");
    let delivery = |header: &str| {
        Delivery::new(
            &[
                ("Stripe-Signature", header),
                ("Content-Type", "application/json"),
            ],
            &body,
        )
    };
    Sender {
        name: "stripe",
        env: vec![("STRIPE_WEBHOOK_SECRET", SECRET.to_owned())],
        deliveries: [delivery(&headers[0]), delivery(&headers[1])],
        id: "evt_all_at_once".into(),
    }
}

/// A Standard Webhooks sender retries with the same `webhook-id`, signed anew (by the
/// `standardwebhooks` library) at its own time.
fn standard(t: i64) -> Sender {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = r#"{"type":"user.created","data":{"id":"u_all"}}"#;
    let signatures = standard_sign(SECRET, &[("msg_all", t - 60, body), ("msg_all", t, body)]);
    let delivery = |t: i64, signature: &str| {
        Delivery::new(
            &[
                ("webhook-id", "msg_all"),
                ("webhook-timestamp", &t.to_string()),
                ("webhook-signature", signature),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    Sender {
        name: "standard",
        env: vec![
            ("DEDUP_STANDARD_WEBHOOKS__SECRETS", SECRET.to_owned()),
            ("DEDUP_STANDARD_WEBHOOKS__SOURCE", "standard".to_owned()),
        ],
        deliveries: [
            delivery(t - 60, &signatures[0]),
            delivery(t, &signatures[1]),
        ],
        id: "msg_all".into(),
    }
}

/// Twilio retries a status callback with the same `I-Twilio-Idempotency-Token` and signature.
fn twilio() -> Sender {
    const TOKEN: &str = "twilio_all_at_once_auth_token";
    const URL: &str = "https://hooks.example.com/webhooks/twilio";
    let params = super::super::twilio::status_params("SM-all", "delivered");
    let signed = twilio_sign(TOKEN, &[super::super::twilio::form_item(URL, &params)]);
    let delivery = || super::super::twilio::form(&signed[0].0, &params, Some("idem-all"));
    let mut env = source_env(
        [
            "DEDUP_SOURCES__TWILIO__SCHEME",
            "DEDUP_SOURCES__TWILIO__SECRETS",
        ],
        "twilio",
        TOKEN,
    );
    env.push(("DEDUP_SOURCES__TWILIO__PUBLIC_URL", URL.to_owned()));
    Sender {
        name: "twilio",
        env,
        deliveries: [delivery(), delivery()],
        id: "idem-all".into(),
    }
}

/// Adyen redelivers the same batch (here of one item) until it is answered `[accepted]`.
fn adyen() -> Sender {
    const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    let signed = adyen_sign(
        KEY,
        &[super::super::adyen::item(
            "8616178914061999",
            "AUTHORISATION",
            1130,
        )],
    );
    let delivery = || super::super::adyen::batch(&signed);
    Sender {
        name: "adyen",
        env: source_env(
            [
                "DEDUP_SOURCES__ADYEN__SCHEME",
                "DEDUP_SOURCES__ADYEN__SECRETS",
            ],
            "adyen",
            KEY,
        ),
        deliveries: [delivery(), delivery()],
        id: "ShopECOM:8616178914061999:AUTHORISATION:true".into(),
    }
}

/// PayPal retries the event as a new transmission (its own id and time), signed anew; the
/// certificate (a test key's, named as PayPal's) is configured, so nothing is fetched.
fn paypal(t: i64) -> Sender {
    use super::super::paypal::{delivery, event, rfc3339, PAYPAL_CERT_URL};
    const WEBHOOK_ID: &str = "1JE4291016473214C";
    let body = event("WH-ALL-AT-ONCE-0001");
    let (first_at, retry_at) = (rfc3339(t - 60), rfc3339(t));
    let (certificate, signatures) = paypal_sign(
        &[
            ("tx-all-1", &first_at, WEBHOOK_ID, &body),
            ("tx-all-2", &retry_at, WEBHOOK_ID, &body),
        ],
        (-1, 30),
    );
    let mut env = vec![
        ("DEDUP_SOURCES__PAYPAL__SCHEME", "paypal".to_owned()),
        ("DEDUP_SOURCES__PAYPAL__WEBHOOK_ID", WEBHOOK_ID.to_owned()),
    ];
    env.push(("DEDUP_SOURCES__PAYPAL__CERTIFICATE", certificate));
    Sender {
        name: "paypal",
        env,
        deliveries: [
            delivery(
                ("tx-all-1", &first_at),
                &signatures[0],
                PAYPAL_CERT_URL,
                &body,
            ),
            delivery(
                ("tx-all-2", &retry_at),
                &signatures[1],
                PAYPAL_CERT_URL,
                &body,
            ),
        ],
        id: "WH-ALL-AT-ONCE-0001".into(),
    }
}

/// A sender of the declarative scheme: Clerk (the `clerk` preset, Svix's scheme), which retries
/// with the same `svix-id`, signed anew (by the `standardwebhooks` library) at its own time.
fn clerk(t: i64) -> Sender {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = r#"{"data":{"id":"user_all"},"object":"event","type":"user.created"}"#;
    let signatures = standard_sign(
        SECRET,
        &[("msg_clerk_all", t - 60, body), ("msg_clerk_all", t, body)],
    );
    let delivery = |t: i64, signature: &str| {
        Delivery::new(
            &[
                ("svix-id", "msg_clerk_all"),
                ("svix-timestamp", &t.to_string()),
                ("svix-signature", signature),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let mut env = source_env(
        [
            "DEDUP_SOURCES__CLERK__SCHEME",
            "DEDUP_SOURCES__CLERK__SECRETS",
        ],
        "hmac",
        SECRET,
    );
    env.push(("DEDUP_SOURCES__CLERK__PRESET", "clerk".to_owned()));
    Sender {
        name: "clerk",
        env,
        deliveries: [
            delivery(t - 60, &signatures[0]),
            delivery(t, &signatures[1]),
        ],
        id: "msg_clerk_all".into(),
    }
}
