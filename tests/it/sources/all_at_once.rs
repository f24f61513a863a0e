//! Issue 37's must-show: one run of the real binary with every source at once (each named
//! scheme, Stripe and Standard Webhooks) on PostgreSQL and RabbitMQ. Each sender's event is
//! signed by its own library and delivered twice (the first delivery, then the sender's retry of
//! it, after the first was handled); then each event was handled exactly once (one row of the
//! `ledger` handler), its retry was recognised as a duplicate, and both `dedup-worker events list
//! --source NAME` and the console's `/events?source=NAME` list that source's event and no other.
//!
//! Adding a source is one row: a function returning its [`Sender`], named in [`senders`].

use std::time::Duration;

use super::{post, Delivery};
use crate::console::TOKEN;
use crate::helpers::senders::{
    github_sign, linear_sign, paddle_sign, shopify_sign, slack_sign, square_sign, standard_sign,
    zoom_sign,
};
use crate::helpers::{
    amqp_url, cli_json_lines, now, stripe_event, stripe_python_sign, wait_for, Backend,
    RunningBinary, TestDb, TestQueue, Transport,
};

/// One sender of the run.
struct Sender {
    /// The source's name: its route `/webhooks/{name}` and `--source NAME`.
    name: &'static str,
    /// Its settings, as the binary's environment.
    env: Vec<(&'static str, String)>,
    /// The event's first delivery, then the sender's retry of it, signed by its library.
    deliveries: [Delivery; 2],
    /// The id the event is deduplicated on.
    id: String,
}

/// Every sender of the run, one row each.
fn senders(t: i64) -> Vec<Sender> {
    vec![
        github(),
        shopify(),
        slack(t),
        paddle(t),
        linear(t),
        zoom(t),
        square(),
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

/// The `ledger` handler's rows as (source, event id, handler runs), sorted.
async fn ledger(pool: &sqlx::PgPool) -> Vec<(String, String, i64)> {
    sqlx::query_as(
        "SELECT source, event_id, count(*) FROM event_ledger GROUP BY source, event_id \
         ORDER BY source, event_id",
    )
    .fetch_all(pool)
    .await
    .expect("the ledger")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_source_at_once_on_postgres_and_rabbitmq() {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq).await;
    let work = tempfile::tempdir().expect("tempdir");
    let senders = senders(now());
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("DEDUP_TRANSPORT", "rabbitmq".to_owned()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("AMQP_URL", amqp_url()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "50".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL_MS", "50".to_owned()),
    ];
    for sender in &senders {
        env.extend(sender.env.iter().cloned());
    }
    let mut serve_env = env.clone();
    serve_env.push(("DEDUP_ADMIN__LISTEN", "127.0.0.1:0".to_owned()));
    serve_env.push(("DEDUP_ADMIN__TOKEN", TOKEN.to_owned()));
    let bin = RunningBinary::start(&serve_env, work.path());
    let store = db.store().await;
    let pool = store.postgres_pool().expect("PostgreSQL").clone();

    // Every first delivery, then (once all are handled) every retry: a sender retries an event
    // it was not answered for, later.
    for round in 0..2 {
        for sender in &senders {
            let (status, answer) = post(&bin.url(""), sender.name, &sender.deliveries[round]).await;
            assert_eq!(
                status,
                200,
                "{} delivery {round}: {answer}\n{}",
                sender.name,
                bin.stderr()
            );
        }
        let (pool, store, queue) = (&pool, &store, &queue);
        let recorded = senders.len() as i64;
        wait_for(
            "every delivery handled",
            Duration::from_secs(60),
            || async move {
                let handled = ledger(pool).await.len() as i64;
                let duplicates: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM duplicate_deliveries")
                        .fetch_one(pool)
                        .await
                        .expect("duplicates");
                let expected = if round == 0 {
                    (recorded, 0)
                } else {
                    (recorded, recorded)
                };
                ((handled, duplicates) == expected && queue.drained(store).await).then_some(())
            },
        )
        .await;
    }

    let mut expected: Vec<(String, String, i64)> = senders
        .iter()
        .map(|s| (s.name.to_owned(), s.id.clone(), 1))
        .collect();
    expected.sort();
    assert_eq!(ledger(&pool).await, expected, "every event handled once");

    let client = reqwest::Client::new();
    let admin = bin.admin_addr.expect("the console's address");
    for sender in &senders {
        let listed: Vec<(String, String, String)> =
            cli_json_lines(&env, &["events", "list", "--source", sender.name, "--json"])
                .iter()
                .map(|line| {
                    let text = |key: &str| line[key].as_str().unwrap_or_default().to_owned();
                    (text("source"), text("event_id"), text("outcome"))
                })
                .collect();
        let mut want = vec![
            (
                sender.name.to_owned(),
                sender.id.clone(),
                "duplicate".to_owned(),
            ),
            (
                sender.name.to_owned(),
                sender.id.clone(),
                "handled".to_owned(),
            ),
        ];
        want.sort();
        let mut got = listed.clone();
        got.sort();
        assert_eq!(got, want, "events list --source {}", sender.name);

        let page = client
            .get(format!("http://{admin}/events?source={}", sender.name))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("the console answers");
        assert_eq!(page.status(), 200, "/events?source={}", sender.name);
        let html = page.text().await.expect("the page");
        assert!(
            html.contains(&format!(">{}<", sender.id)),
            "/events?source={} lists {}: {html}",
            sender.name,
            sender.id
        );
        for other in senders.iter().filter(|o| o.name != sender.name) {
            assert!(
                !html.contains(&format!(">{}<", other.id)),
                "/events?source={} does not list {}'s {}",
                sender.name,
                other.name,
                other.id
            );
        }
    }
    drop(bin);
    queue.cleanup().await;
}
