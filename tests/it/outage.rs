//! Store outage: with PostgreSQL refusing connections, ingress answers 503 (never a 2xx) and
//! `/readyz` says not ready; once it is back, everything that got a 200 before, during or after
//! the outage reaches the sink, and the retried deliveries of the refused events do too. An
//! outage between a delivery and its mark costs neither the mark nor a second delivery.

use std::collections::HashSet;
use std::time::Duration;

use crate::helpers::db::{database_name, pg_admin_url};
use crate::helpers::receiver::{assert_acknowledged_at_the_sink_once, Others};
use crate::helpers::{
    file_sink_ids, pipeline_drained, post_signed, post_signed_until_not_503, stripe_event,
    wait_for, Backend, Receiver, RunningBinary, TestDb,
};

const SECRET: &str = "whsec_outage";

async fn admin(sql: &str) {
    let pool = sqlx::PgPool::connect(&pg_admin_url()).await.expect("admin");
    sqlx::query(sql).execute(&pool).await.expect(sql);
    pool.close().await;
}

/// Cuts the test database off: no new connections, existing ones terminated.
async fn cut_off(name: &str) {
    admin(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).await;
    admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    ))
    .await;
}

async fn reconnect(name: &str) {
    admin(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).await;
}

fn content_type(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
}

async fn send(client: &reqwest::Client, url: &str, id: &str) -> reqwest::Response {
    post_signed(client, url, SECRET, stripe_event(id, "charge.refunded"))
        .await
        .expect("ingress answers even when the store is down")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_answers_503_and_acknowledges_nothing_it_did_not_store() {
    let db = TestDb::new(Backend::Postgres).await;
    let name = database_name(&db.url).to_owned();
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_DATABASE__ACQUIRE_TIMEOUT", "1000ms".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
            // A batch the consumer had claimed when the outage hit comes back when its lease
            // ends (the designed recovery); a short lease keeps the test short.
            ("DEDUP_CONSUMER__LEASE", "5s".into()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    let mut acked = HashSet::new();
    for i in 0..20 {
        let id = format!("evt_before_{i}");
        assert_eq!(send(&client, &url, &id).await.status(), 200);
        acked.insert(id);
    }

    cut_off(&name).await;

    let mut refused = Vec::new();
    for i in 0..10 {
        let id = format!("evt_during_{i}");
        let response = send(&client, &url, &id).await;
        let status = response.status().as_u16();
        assert!(status == 503 || status == 200, "{id}: {status}");
        if status == 200 {
            // Only possible if a connection survived and the commit really happened.
            acked.insert(id);
            continue;
        }
        assert_eq!(content_type(&response), Some("application/problem+json"));
        assert!(response.headers().contains_key("retry-after"));
        refused.push(id);
    }
    assert!(
        refused.len() >= 9,
        "the outage must be answered with 503, refused {}",
        refused.len()
    );
    assert_eq!(bin.readyz(&client).await, 503);

    // Back again: the provider's retries of the refused events succeed.
    reconnect(&name).await;
    let first = refused[0].clone();
    wait_for("ingress to recover", Duration::from_secs(30), || {
        let (client, url, first) = (client.clone(), url.clone(), first.clone());
        async move { (send(&client, &url, &first).await.status() == 200).then_some(()) }
    })
    .await;
    for id in &refused {
        assert_eq!(send(&client, &url, id).await.status(), 200);
        acked.insert(id.clone());
    }
    assert_eq!(bin.readyz(&client).await, 200);

    let store = db.store().await;
    assert_acknowledged_at_the_sink_once(
        &bin,
        &sink,
        &acked,
        Others::None,
        Duration::from_secs(60),
        || pipeline_drained(&store, "dedup.events"),
    )
    .await;
    drop(bin);
}

/// The store goes away after the sink accepted a delivery and before the relay marked it. The
/// relay keeps the mark and writes it once the store is back: the row is `dispatched` long
/// before its lease (10 s; no heartbeat holds it once its step failed) would have expired, and the sink saw the event exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_lost_to_an_outage_is_written_after_recovery_without_redelivery() {
    let db = TestDb::new(Backend::Postgres).await;
    let name = database_name(&db.url).to_owned();
    // Records each delivery at once, and answers 200 only when the test releases it.
    let sink = Receiver::gated().await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", sink.url()),
            ("DEDUP_DATABASE__ACQUIRE_TIMEOUT", "1000ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let response = send(&client, &bin.url("/webhooks/stripe"), "evt_unmarked").await;
    assert_eq!(response.status(), 200);

    // The relay's POST has arrived and is held; cut the store off, then let the sink say 200.
    bin.wait_for(
        "the delivery to reach the sink",
        Duration::from_secs(30),
        || {
            let seen = sink.keys();
            async move { (!seen.is_empty()).then_some(()) }
        },
    )
    .await;
    cut_off(&name).await;
    sink.release();

    // The relay learns of the outage when its mark fails, and only then is the store back.
    bin.wait_for("the relay's mark to fail", Duration::from_secs(30), || {
        let logged = bin.stderr().contains("relay step failed");
        async move { logged.then_some(()) }
    })
    .await;
    reconnect(&name).await;
    let store = db.store().await;
    bin.wait_for(
        "the delivered row to be marked dispatched",
        Duration::from_secs(45),
        || {
            let store = store.clone();
            async move {
                let counts = store.outbox().counts().await.ok()?;
                (counts.pending == 0 && counts.dispatched == 1).then_some(())
            }
        },
    )
    .await;
    assert_eq!(sink.keys(), vec!["evt_unmarked".to_owned()]);
}

/// A broker that cannot be reached: ingress answers 503 problem+json (never a 2xx),
/// `/readyz` says not ready, and the logs name the broker's address and the cause (never its
/// password), for RabbitMQ and for SQS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_brokers_answer_503() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    // Port 1 on loopback: nothing listens there, so connections are refused at once.
    let cases: [&[(&str, String)]; 2] = [
        &[
            ("DEDUP_TRANSPORT", "rabbitmq".into()),
            ("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f".into()),
        ],
        &[
            ("DEDUP_TRANSPORT", "sqs".into()),
            (
                "DEDUP_QUEUE",
                "http://127.0.0.1:1/000000000000/nowhere".into(),
            ),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_MAX_ATTEMPTS", "1".into()),
        ],
    ];
    for extra in cases {
        let mut env = vec![
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        ];
        env.extend(extra.iter().cloned());
        let bin = RunningBinary::start(&env, work.path());
        let response = send(&client, &bin.url("/webhooks/stripe"), "evt_nowhere").await;
        assert_eq!(response.status(), 503, "{extra:?}");
        assert_eq!(content_type(&response), Some("application/problem+json"));
        assert_eq!(bin.readyz(&client).await, 503, "{extra:?}");
        // What failed is named where an operator looks: the logs give the broker's address
        // (its password masked) beside the cause.
        let named = bin
            .wait_for(
                "a log line naming the unreachable broker",
                Duration::from_secs(30),
                || {
                    let log = bin.stderr();
                    async move {
                        log.lines()
                            .find(|l| l.contains("127.0.0.1:1") && l.contains("refused"))
                            .map(str::to_owned)
                    }
                },
            )
            .await;
        assert!(!bin.stderr().contains("guest:guest@"), "{named}");
    }
}

/// RabbitMQ keeps accepting while PostgreSQL, behind a proxy, refuses every connection for
/// 20 s. The consumer's steps fail; each failed batch must be given back to the broker (left
/// unacked on the live channel it would fill the prefetch window and stall the queue until the
/// broker's consumer timeout), and the consumer must wait for the store rather than cycle the
/// events towards the broker's delivery limit. After PostgreSQL is back, everything accepted
/// reaches the sink, once, with no manual step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_events_accepted_while_postgres_refuses_all_reach_the_sink_after() {
    use crate::helpers::fault_proxy::{FaultProxy, Mode};
    use crate::helpers::{TestQueue, Transport};
    use futures::StreamExt;

    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq)
        .await
        .with_delivery_limit(4);
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", proxy.rewrite(&db.url, "127.0.0.1:5432")),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_TRANSPORT", "rabbitmq".into()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_DATABASE__ACQUIRE_TIMEOUT", "1000ms".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_CONSUMER__BATCH_SIZE", "50".into()),
            // Every failed step a delivery goes through counts towards this limit; a low one
            // shows the consumer does not cycle events through failed steps while the store
            // is down (past it the broker would dead-letter valid events).
            (
                "DEDUP_TRANSPORT__DELIVERY_LIMIT",
                queue.delivery_limit().to_string(),
            ),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    let post_all = |ids: Vec<String>| {
        let (client, url) = (client.clone(), url.clone());
        futures::stream::iter(ids)
            .map(move |id| {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    let status = send(&client, &url, &id).await.status();
                    assert_eq!(status, 200, "{id}: RabbitMQ is up, so ingress accepts");
                    id
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<String>>()
    };
    let mut accepted: HashSet<String> =
        post_all((0..20).map(|i| format!("evt_before_{i}")).collect())
            .await
            .into_iter()
            .collect();

    proxy.set(Mode::Refuse).await;
    let outage = std::time::Instant::now();
    accepted.extend(post_all((0..600).map(|i| format!("evt_during_{i}")).collect()).await);
    // The outage lasts 20 s whatever the posting took: long enough for several failed steps.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(outage.elapsed())).await;
    assert!(
        proxy.accepted() > 0,
        "the binary did try PostgreSQL during the outage"
    );
    proxy.set(Mode::Pass).await;

    // Within 60 s of PostgreSQL's return.
    let store = db.store().await;
    assert_acknowledged_at_the_sink_once(
        &bin,
        &sink,
        &accepted,
        Others::None,
        Duration::from_secs(60),
        || queue.drained(&store),
    )
    .await;
    drop(bin);
    queue.cleanup().await;
}

/// PostgreSQL stops answering (connections open, nothing comes back): with default settings
/// every webhook is answered 503 with `Retry-After` within 5 s, never 2xx, and `/readyz` is 503
/// as fast. Once PostgreSQL answers again, ingress answers 200, and every event that got a 200
/// (before the outage, or retried after it) reaches the sink once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_that_stops_answering_is_503_within_5_s_and_nothing_is_lost() {
    use crate::helpers::fault_proxy::{FaultProxy, Mode};
    use futures::StreamExt;

    let db = TestDb::new(Backend::Postgres).await;
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", proxy.rewrite(&db.url, "127.0.0.1:5432")),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
        ],
        work.path(),
    );
    // The bound under test: a request not answered within 5 s is a failure.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = bin.url("/webhooks/stripe");
    let mut acked = HashSet::new();
    for i in 0..20 {
        let id = format!("evt_before_{i}");
        assert_eq!(send(&client, &url, &id).await.status(), 200);
        acked.insert(id);
    }

    proxy.set(Mode::BlackHole).await;
    let during: Vec<String> = (0..12).map(|i| format!("evt_during_{i}")).collect();
    let answers: Vec<(String, reqwest::Response)> = futures::stream::iter(during.clone())
        .map(|id| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let response = send(&client, &url, &id).await;
                (id, response)
            }
        })
        .buffer_unordered(6)
        .collect()
        .await;
    for (id, response) in &answers {
        assert_eq!(response.status(), 503, "{id}: PostgreSQL does not answer");
        assert_eq!(content_type(response), Some("application/problem+json"));
        assert!(response.headers().contains_key("retry-after"), "{id}");
    }
    assert_eq!(bin.readyz(&client).await, 503);

    // Answering again: the senders' retries go through.
    proxy.set(Mode::Pass).await;
    let first = during[0].clone();
    bin.wait_for(
        "ingress to answer 200 again",
        Duration::from_secs(30),
        || {
            let (client, url, first) = (client.clone(), url.clone(), first.clone());
            async move {
                let response = client_send(&client, &url, &first).await?;
                (response.status() == 200).then_some(())
            }
        },
    )
    .await;
    for id in &during {
        assert_eq!(send(&client, &url, id).await.status(), 200, "{id}");
        acked.insert(id.clone());
    }
    assert_eq!(bin.readyz(&client).await, 200);

    let store = db.store().await;
    assert_acknowledged_at_the_sink_once(
        &bin,
        &sink,
        &acked,
        Others::None,
        Duration::from_secs(60),
        || pipeline_drained(&store, "dedup.events"),
    )
    .await;
}

/// [`send`], but a transport error (a timeout) is `None` rather than a panic.
async fn client_send(client: &reqwest::Client, url: &str, id: &str) -> Option<reqwest::Response> {
    post_signed(client, url, SECRET, stripe_event(id, "charge.refunded"))
        .await
        .ok()
}

/// PostgreSQL stops answering one process in the middle of its batch, and stays that way (a
/// partition between that process and the database: its connections open, nothing coming
/// back), while a second process reaches PostgreSQL fine. The batch must move to the second
/// process while the first is still cut off:
/// * the first process's step is bounded (`consumer.step_timeout`): it gives the batch back
///   and, its store not answering, hands back what RabbitMQ pushed to it beyond the batch;
/// * its transaction, open on the server with the batch's dedup rows locked, is ended by the
///   server (`idle_in_transaction_session_timeout`), or the second process's inserts of the
///   same ids would wait on those locks for as long as the dead connection stays open.
///
/// The first process is caught mid-transaction deterministically: the test holds the dedup row
/// of one event of the batch in a transaction of its own, so the process's insert waits on it;
/// the proxy is black-holed while it waits, then the test lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stuck_on_a_database_that_stopped_answering_moves_to_another_process() {
    use crate::helpers::fault_proxy::{FaultProxy, Mode};
    use crate::helpers::{HeldDedupRow, TestQueue, Transport};

    const EVENTS: usize = 20;
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq).await;
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let env = |database_url: String, relay: bool| {
        vec![
            ("DATABASE_URL", database_url),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("DEDUP_TRANSPORT", "rabbitmq".to_owned()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("DEDUP_SINK", format!("file:{}", sink.display())),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".to_owned()),
            // Short, so the test is; the default is 30 s.
            ("DEDUP_CONSUMER__STEP_TIMEOUT", "6000ms".to_owned()),
            ("DEDUP_ROLES__RELAY", relay.to_string()),
        ]
    };
    let cut_off = RunningBinary::start(
        &env(proxy.rewrite(&db.url, "127.0.0.1:5432"), false),
        work.path(),
    );

    // The test's own transaction holds the dedup row of the first event.
    let held = HeldDedupRow::hold(&db.url, "stripe", "evt_held_0").await;

    let client = reqwest::Client::new();
    let url = cut_off.url("/webhooks/stripe");
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt_held_{i}")).collect();
    for id in &ids {
        // A 503 (a broker confirm late under the suite's load) is retried, as Stripe would.
        let response =
            post_signed_until_not_503(&client, &url, SECRET, stripe_event(id, "charge.refunded"))
                .await;
        assert_eq!(response.status(), 200, "{id}");
    }
    cut_off
        .wait_for(
            "the process's batch insert to wait on the held row",
            Duration::from_secs(30),
            || {
                let held = &held;
                async move { (held.waiting().await > 0).then_some(()) }
            },
        )
        .await;
    // Cut the process off mid-transaction, then let its insert finish on the server: its
    // transaction now holds every dedup row of the batch, and its answers go nowhere.
    proxy.set(Mode::BlackHole).await;
    held.release().await;

    let reaches = RunningBinary::start(&env(db.url.clone(), true), work.path());
    reaches
        .wait_for(
            "every event to reach the sink through the process that reaches PostgreSQL",
            Duration::from_secs(60),
            || {
                let delivered: HashSet<String> = file_sink_ids(&sink).into_iter().collect();
                async move { (delivered.len() >= EVENTS).then_some(()) }
            },
        )
        .await;
    // All of it while the first process is still cut off: the proxy passes again only below.
    assert!(
        cut_off.stderr().contains("consumer.step_timeout"),
        "the first process gave its batch up on its step timeout"
    );
    let delivered = file_sink_ids(&sink);
    let unique: HashSet<String> = delivered.iter().cloned().collect();
    assert_eq!(unique, ids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(delivered.len(), EVENTS, "each event reached the sink once");

    proxy.set(Mode::Pass).await;
    drop(cut_off);
    drop(reaches);
    queue.cleanup().await;
}
