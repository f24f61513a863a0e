//! The sender's headers a scheme keeps travel with the message to the handler's `Event`, on
//! every transport: a GitHub delivery signed by `@octokit/webhooks-methods` reaches a handler
//! that reads `event.header("x-github-delivery")` and the rest, through the database queue
//! (SQLite and PostgreSQL), RabbitMQ and SQS; the event's `source` is the source's name (not
//! its scheme), and its id the hook and the delivery GUID.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::DbTx;
use serde_json::{json, Value};

use super::{post, sources, Delivery};
use crate::helpers::senders::github_sign;
use crate::helpers::{
    amqp_url, sqs_turn, test_settings, wait_for, Backend, SqsLoad, TestApp, TestDb, TestQueue,
    Transport,
};

const SECRET: &str = "gh-headers-secret";

/// Records every event it is given; no effect of its own.
#[derive(Default)]
struct Recorder {
    /// The events handled, in order.
    seen: Mutex<Vec<Event>>,
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        self.seen.lock().expect("not poisoned").push(event.clone());
        Ok(Vec::new())
    }
}

/// The settings that put the pipeline on `queue`'s transport.
fn transport_settings(queue: &TestQueue) -> Vec<(&'static str, Value)> {
    let mut values = vec![
        ("transport.kind", json!(queue.kind())),
        ("transport.queue", json!(queue.name)),
    ];
    if queue.transport == Transport::Rabbitmq {
        values.push(("transport.amqp_url", json!(amqp_url())));
    }
    values
}

/// Posts one GitHub delivery to a source named `repo-hooks` on `backend` and `transport`, and
/// checks what the handler was given.
async fn github_headers_reach_the_handler(backend: Backend, transport: Transport) {
    let _turn = match transport {
        Transport::Sqs => Some(sqs_turn(SqsLoad::Light).await),
        _ => None,
    };
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(transport).await;
    let recorder = Arc::new(Recorder::default());
    let mut values = vec![
        ("sources", sources(&[("repo-hooks", "github", &[SECRET])])),
        ("consumer.poll_interval", json!("50ms")),
    ];
    values.extend(transport_settings(&queue));
    let app = TestApp::spawn(
        test_settings(&db.url, &values),
        Service::new().handler(recorder.clone()),
    )
    .await;
    let body = r#"{"ref":"refs/heads/main","after":"6dcb09b5b57875f334f61aebed695e2e4193db5e"}"#;
    let signature = github_sign(SECRET, &[body]).remove(0);
    let delivery = Delivery::new(
        &[
            ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            ("X-GitHub-Event", "push"),
            ("X-GitHub-Hook-ID", "292430182"),
            ("X-GitHub-Hook-Installation-Target-Type", "repository"),
            ("X-GitHub-Hook-Installation-Target-ID", "79929171"),
            ("X-Hub-Signature-256", &signature),
            ("User-Agent", "GitHub-Hookshot/044aadd"),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    let (status, answer) = post(&app.url(""), "repo-hooks", &delivery).await;
    assert_eq!(status, 200, "{answer}");
    let event = wait_for("the delivery handled", Duration::from_secs(30), || async {
        recorder.seen.lock().expect("not poisoned").first().cloned()
    })
    .await;
    let what = format!("{backend:?} {transport:?}");
    assert_eq!(event.source, "repo-hooks", "{what}: the source's name");
    assert_eq!(
        event.id, "292430182:72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "{what}: the hook and the GUID"
    );
    assert_eq!(event.event_type, "push", "{what}");
    // Any case reads them; the ones the scheme does not keep are not carried.
    assert_eq!(
        event.header("X-GitHub-Delivery"),
        Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        "{what}"
    );
    assert_eq!(event.header("x-github-event"), Some("push"), "{what}");
    assert_eq!(
        event.header("x-github-hook-id"),
        Some("292430182"),
        "{what}"
    );
    assert_eq!(
        event.header("x-github-hook-installation-target-type"),
        Some("repository"),
        "{what}"
    );
    assert_eq!(
        event.header("x-github-hook-installation-target-id"),
        Some("79929171"),
        "{what}"
    );
    assert_eq!(event.header("user-agent"), None, "{what}: not kept");
    assert_eq!(
        event.header("x-hub-signature-256"),
        None,
        "{what}: not kept"
    );
    app.stop().await;
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_headers_reach_the_handler_through_the_database_queue_on_sqlite() {
    github_headers_reach_the_handler(Backend::Sqlite, Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_headers_reach_the_handler_through_the_database_queue_on_postgres() {
    github_headers_reach_the_handler(Backend::Postgres, Transport::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_headers_reach_the_handler_through_rabbitmq() {
    github_headers_reach_the_handler(Backend::Sqlite, Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_headers_reach_the_handler_through_sqs() {
    github_headers_reach_the_handler(Backend::Sqlite, Transport::Sqs).await;
}
