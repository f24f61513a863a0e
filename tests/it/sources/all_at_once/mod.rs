//! Issue 37's must-show: one run of the real binary with every source at once (each named
//! scheme, a preset of the declarative one, Stripe and Standard Webhooks) on PostgreSQL and
//! RabbitMQ (and again on SQS and on the database queue, so each sender's retries are handled
//! once through every transport). Each sender's event is
//! signed by its own library and delivered twice (the first delivery, then the sender's retry of
//! it, after the first was handled); then each event was handled exactly once (one row of the
//! `ledger` handler), its retry was recognised as a duplicate, and both `dedup-worker events list
//! --source NAME` and the console's `/events?source=NAME` list that source's event and no other.
//!
//! Adding a source is one row: a function of `senders.rs` returning its [`Sender`], named in
//! [`senders`].

use std::time::Duration;

use super::{post, Delivery};
use crate::console::TOKEN;
use crate::helpers::{amqp_url, Transport};
use crate::helpers::{cli_json_lines, now, wait_for, Backend, RunningBinary, TestDb, TestQueue};
use senders::senders;

mod senders;

/// One sender of the run.
pub(super) struct Sender {
    /// The source's name: its route `/webhooks/{name}` and `--source NAME`.
    pub name: &'static str,
    /// Its settings, as the binary's environment.
    pub env: Vec<(&'static str, String)>,
    /// The event's first delivery, then the sender's retry of it, signed by its library.
    pub deliveries: [Delivery; 2],
    /// The id the event is deduplicated on.
    pub id: String,
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
    every_source_at_once(Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_source_at_once_on_postgres_and_sqs() {
    every_source_at_once(Transport::Sqs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_source_at_once_on_postgres_and_the_database_queue() {
    every_source_at_once(Transport::Database).await;
}

/// The run on PostgreSQL and `transport`: each sender's retries are handled once through it.
async fn every_source_at_once(transport: Transport) {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().expect("tempdir");
    let senders = senders(now());
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("DEDUP_TRANSPORT", queue.kind().to_owned()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("AMQP_URL", amqp_url()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
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
