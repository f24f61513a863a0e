//! Named sources (`[sources.NAME]`, `POST /webhooks/NAME`), one module per scheme: deliveries
//! signed by the sender's own library are accepted and enqueued under the source's name with
//! the sender's id and type; the usual forgeries (another secret, the body changed by one byte,
//! a missing header, a stale or future timestamp) are 400 problems naming the check, with
//! nothing enqueued; a sender's retries of one event are handled once. `start` runs the real
//! binary configured from the environment: comma-separated secrets, an empty secret refused at
//! start naming its key, the `source` label of the metrics.
//!
//! Each test has a database of its own: the embedded SQLite default and the database queue (the
//! GitHub redelivery test on PostgreSQL too).

use std::time::Duration;

use crate::helpers::{pipeline_drained, test_settings, wait_for, Backend, TestApp, TestDb};
use dedup_worker::Service;
use dedup_worker_core::store::{QueuedMessage, Store};
use serde_json::{json, Value};

mod adyen;
mod all_at_once;
mod github;
mod headers;
mod hmac;
mod hmac_presets;
mod id_field;
mod linear;
mod paddle;
mod paypal;
mod shopify;
mod slack;
mod square;
mod start;
mod twilio;
mod zoom;

/// A delivery: its headers and raw body.
pub(super) struct Delivery {
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Delivery {
    pub fn new(headers: &[(&'static str, &str)], body: &str) -> Self {
        Delivery {
            headers: headers
                .iter()
                .map(|(name, value)| (*name, (*value).to_owned()))
                .collect(),
            body: body.to_owned(),
        }
    }

    /// The same delivery without `name`.
    pub fn without(&self, name: &str) -> Self {
        Delivery {
            headers: self
                .headers
                .iter()
                .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
                .cloned()
                .collect(),
            body: self.body.clone(),
        }
    }

    /// The same headers over a body changed by one byte (its last character but one, which
    /// keeps a JSON body's closing brace).
    pub fn with_one_byte_changed(&self) -> Self {
        let mut bytes = self.body.clone().into_bytes();
        let at = bytes.len() - 2;
        bytes[at] = if bytes[at] == b'x' { b'y' } else { b'x' };
        Delivery {
            headers: self.headers.clone(),
            body: String::from_utf8(bytes).expect("ASCII"),
        }
    }
}

/// `[sources.NAME]` tables as the test's settings take them: `(name, scheme, secrets)`.
pub(super) fn sources(list: &[(&str, &str, &[&str])]) -> Value {
    let mut tables = serde_json::Map::new();
    for (name, scheme, secrets) in list {
        tables.insert(
            (*name).to_owned(),
            json!({ "scheme": scheme, "secrets": secrets }),
        );
    }
    Value::Object(tables)
}

/// The ingress alone (no consumer, no relay) with `sources`, on SQLite: what it enqueues stays
/// in the queue for the test to read.
pub(super) async fn ingress_only(db: &TestDb, sources: Value) -> TestApp {
    TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("sources", sources),
                ("roles.consumer", json!(false)),
                ("roles.relay", json!(false)),
            ],
        ),
        Service::new(),
    )
    .await
}

/// Posts `delivery` to `/webhooks/{name}`; the status and the JSON answer (problem or receipt).
pub(super) async fn post(base: &str, name: &str, delivery: &Delivery) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/webhooks/{name}"))
        .body(delivery.body.clone());
    for (header, value) in &delivery.headers {
        request = request.header(*header, value);
    }
    let response = request.send().await.expect("the ingress answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Posts each forgery of `cases` (what it is, the delivery, the check it must fail) and
/// asserts a 400 problem+json naming that check.
pub(super) async fn assert_refused(app: &TestApp, name: &str, cases: &[(&str, Delivery, &str)]) {
    for (what, delivery, check) in cases {
        let (status, problem) = post(&app.url(""), name, delivery).await;
        assert_eq!(status, 400, "{what}: {problem}");
        assert_eq!(problem["check"], *check, "{what}: {problem}");
    }
}

/// Every message waiting in the test's queue (claimed, so read once).
pub(super) async fn queued(store: &Store) -> Vec<QueuedMessage> {
    store
        .queue()
        .claim("dedup.events", 100, Duration::from_secs(60))
        .await
        .expect("claim")
}

/// The whole pipeline with the `ledger` handler (one `event_ledger` row per handler run) on
/// `backend`, `sources` configured: posts each delivery to `/webhooks/{name}`, each must be
/// answered 200; waits until the queue and the outbox are drained; the ledger's rows as
/// (source, event id, handler runs), sorted.
pub(super) async fn handler_runs_after(
    backend: Backend,
    sources: Value,
    name: &str,
    deliveries: &[Delivery],
) -> Vec<(String, String, i64)> {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().expect("tempdir");
    let sink = work.path().join("out.jsonl");
    let app = TestApp::spawn(
        test_settings(
            &db.url,
            &[
                ("sources", sources),
                ("outbox.sink", json!(format!("file:{}", sink.display()))),
                ("consumer.handler", json!("ledger")),
                ("consumer.poll_interval", json!("50ms")),
                ("outbox.poll_interval", json!("50ms")),
            ],
        ),
        Service::new(),
    )
    .await;
    for delivery in deliveries {
        let (status, answer) = post(&app.url(""), name, delivery).await;
        assert_eq!(status, 200, "{answer}");
    }
    let store = app.store.clone();
    wait_for("the deliveries handled", Duration::from_secs(30), || {
        let store = store.clone();
        async move { pipeline_drained(&store, "dedup.events").await.then_some(()) }
    })
    .await;
    let sql = "SELECT source, event_id, count(*) FROM event_ledger GROUP BY source, event_id \
               ORDER BY source, event_id";
    let rows: Vec<(String, String, i64)> = match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("the ledger");
    app.stop().await;
    rows
}

/// `(source, id, 1)` for each id: each event handled once.
pub(super) fn once_each(source: &str, ids: &[&str]) -> Vec<(String, String, i64)> {
    ids.iter()
        .map(|id| (source.to_owned(), (*id).to_owned(), 1))
        .collect()
}
