//! Dead letters on RabbitMQ and SQS, through the real binary: `dlq redrive` publishes them
//! through the transport the consumers read, and they are handled once. Messages the broker
//! parked in `<queue>.dead`, and deliveries over `transport.delivery_limit`, become dead
//! letters in the store that `dlq list` shows and `dlq redrive` replays. A RabbitMQ queue
//! declared earlier with another delivery limit keeps working after the setting changed.

use std::time::Duration;

use dedup_worker_core::queue::{OutgoingMessage, Transport as _};
use dedup_worker_core::store::Store;

use crate::helpers::app::cli_json_lines;
use crate::helpers::db::execute;
use crate::helpers::{
    file_sink_ids, ledger_counts, post_signed_until_not_503, run_cli, sqs_turn, stripe_event,
    Backend, RunningBinary, SqsLoad, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_test_secret";

/// `dlq list`, parsed.
fn dlq_list(env: &[(&str, String)]) -> Vec<serde_json::Value> {
    cli_json_lines(env, &["dlq", "list"])
}

/// Waits (up to 30 s) for a dead letter in `dlq list`; the last one listed.
async fn dead_letter(
    bin: &RunningBinary,
    cli_env: &[(&str, String)],
    what: &str,
) -> serde_json::Value {
    bin.wait_for(what, Duration::from_secs(30), || async {
        dlq_list(cli_env).pop()
    })
    .await
}

/// What the binary and the CLI share: the store and the transport.
fn base_env(db: &TestDb, queue: &TestQueue) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("DEDUP_TRANSPORT", queue.kind().into()),
        ("DEDUP_QUEUE", queue.name.clone()),
    ]
}

fn binary_env(
    db: &TestDb,
    queue: &TestQueue,
    sink: &std::path::Path,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut env = base_env(db, queue);
    env.extend([
        ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".into()),
    ]);
    env.extend(extra.iter().cloned());
    env
}

/// Waits until `id` reached the sink and the ledger, and the queue is drained; then checks
/// both hold it exactly once.
async fn handled_once(
    bin: &RunningBinary,
    store: &Store,
    queue: &TestQueue,
    sink: &std::path::Path,
    id: &str,
) {
    bin.wait_for(
        &format!("{id} to reach the sink and the queue to drain"),
        Duration::from_secs(30),
        || async {
            (file_sink_ids(sink).iter().any(|s| s == id) && queue.drained(store).await)
                .then_some(())
        },
    )
    .await;
    // A second delivery, if any, would have had the time a first one needed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let in_sink = file_sink_ids(sink).iter().filter(|s| *s == id).count();
    assert_eq!(in_sink, 1, "{id} reached the sink once");
    assert_eq!(
        ledger_counts(store).await.get(id).copied(),
        Some(1),
        "{id} was handled once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_dead_letter_redriven_goes_back_through_the_broker_and_is_handled_once() {
    dead_letter_redriven(Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_dead_letter_redriven_goes_back_through_sqs_and_is_handled_once() {
    let _emulator = sqs_turn(SqsLoad::Light).await;
    dead_letter_redriven(Transport::Sqs).await;
}

/// The ledger handler fails while its table is away (one attempt allowed): the event is
/// dead-lettered, recorded on the transport's queue. With the table back, `dlq redrive`
/// publishes it through the transport and the consumer handles it, once.
async fn dead_letter_redriven(transport: Transport) {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let env = binary_env(
        &db,
        &queue,
        &sink,
        &[("DEDUP_CONSUMER__MAX_ATTEMPTS", "1".into())],
    );
    let bin = RunningBinary::start(&env, work.path());
    let store = db.store().await;
    execute(
        &store,
        "ALTER TABLE event_ledger RENAME TO event_ledger_away",
    )
    .await;

    let id = "evt_redrive_1";
    let client = reqwest::Client::new();
    // The first publish declares the transport's queues: under a loaded CI it can outlast the
    // publish timeout, and the ingress rightly answers 503; Stripe would send it again.
    let response = post_signed_until_not_503(
        &client,
        &bin.url("/webhooks/stripe"),
        SECRET,
        stripe_event(id, "charge.refunded"),
    )
    .await;
    assert_eq!(response.status(), 200);
    let cli_env = base_env(&db, &queue);
    let dead = dead_letter(&bin, &cli_env, "the failing event to be dead-lettered").await;
    assert_eq!(dead["event_id"], id);
    assert_eq!(
        dead["queue"],
        queue.name.as_str(),
        "recorded on the transport's queue"
    );
    assert!(
        file_sink_ids(&sink).is_empty(),
        "a failed event reaches no sink"
    );

    execute(
        &store,
        "ALTER TABLE event_ledger_away RENAME TO event_ledger",
    )
    .await;
    let out = run_cli(&cli_env, &["dlq", "redrive", "--all"]);
    assert!(out.contains("redriven: 1"), "{out}");
    assert!(
        dlq_list(&cli_env).is_empty(),
        "a redriven dead letter is deleted"
    );
    handled_once(&bin, &store, &queue, &sink, id).await;
    drop(bin);
    queue.cleanup().await;
}

/// Publishes one event on `queue` with the test's own transport (declaring the queue with the
/// test queue's delivery limit, as an earlier deployment would have), then takes it and gives
/// it back `returns` times: each counts in the quorum queue's `x-delivery-count`, as a consumer
/// crashing on it would.
async fn publish_and_return(queue: &TestQueue, id: &str, returns: usize) {
    let rabbit = queue.rabbit();
    rabbit
        .publish(OutgoingMessage {
            source: Some("stripe".into()),
            message_id: Some(id.into()),
            message_type: Some("charge.refunded".into()),
            payload: stripe_event(id, "charge.refunded").into(),
            traceparent: None,
            stripe_signature: None,
            sender_headers: dedup_worker_core::event::SenderHeaders::default(),
        })
        .await
        .expect("publish");
    for round in 0..returns {
        let got = rabbit
            .receive(1, Duration::from_secs(10))
            .await
            .expect("receive");
        assert_eq!(got.len(), 1, "round {round}: the message came back");
        assert_eq!(got[0].message_id.as_deref(), Some(id));
        rabbit
            .release(&[got[0].tag.clone()])
            .await
            .expect("release");
    }
    rabbit.close().await;
}

/// A queue declared with `x-delivery-limit = 1` by an earlier deployment, holding a message the
/// broker parked in `<queue>.dead` (it came back twice). The binary, configured with another
/// limit, still accepts and consumes; the parked message becomes a dead letter in the store
/// that `dlq list` shows with the broker's reason, and `dlq redrive` gets it handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_another_delivery_limit_keeps_working_and_broker_dead_letters_are_redriven() {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq)
        .await
        .with_delivery_limit(1);
    publish_and_return(&queue, "evt_parked", 2).await;

    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let env = binary_env(
        &db,
        &queue,
        &sink,
        &[("DEDUP_TRANSPORT__DELIVERY_LIMIT", "5".into())],
    );
    let bin = RunningBinary::start(&env, work.path());
    let store = db.store().await;
    let client = reqwest::Client::new();
    let response = post_signed_until_not_503(
        &client,
        &bin.url("/webhooks/stripe"),
        SECRET,
        stripe_event("evt_fresh", "charge.refunded"),
    )
    .await;
    assert_eq!(response.status(), 200, "{}", bin.stderr());
    handled_once(&bin, &store, &queue, &sink, "evt_fresh").await;

    let cli_env = base_env(&db, &queue);
    let dead = dead_letter(&bin, &cli_env, "the parked message in dlq list").await;
    assert_eq!(dead["event_id"], "evt_parked");
    assert_eq!(
        dead["error"],
        dedup_worker_core::queue::rabbitmq::BROKER_DEAD_LETTERED
    );
    assert_eq!(dead["queue"], queue.name.as_str());
    assert_eq!(ledger_counts(&store).await.get("evt_parked"), None);

    let out = run_cli(&cli_env, &["dlq", "redrive", &dead["id"].to_string()]);
    assert!(out.contains("redriven: 1"), "{out}");
    handled_once(&bin, &store, &queue, &sink, "evt_parked").await;
    assert!(dlq_list(&cli_env).is_empty());
    drop(bin);
    queue.cleanup().await;
}

/// The broker's limit on an existing queue is 10, the setting 2: a message that came back
/// three times is dead-lettered by the consumer before its handler runs, with the setting in
/// the reason, and can be redriven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_enforces_the_configured_delivery_limit_on_an_older_queue() {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(Transport::Rabbitmq)
        .await
        .with_delivery_limit(10);
    publish_and_return(&queue, "evt_looping", 3).await;

    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let env = binary_env(
        &db,
        &queue,
        &sink,
        &[("DEDUP_TRANSPORT__DELIVERY_LIMIT", "2".into())],
    );
    let bin = RunningBinary::start(&env, work.path());
    let store = db.store().await;
    let cli_env = base_env(&db, &queue);
    let dead = dead_letter(&bin, &cli_env, "the looping message in dlq list").await;
    assert_eq!(dead["event_id"], "evt_looping");
    let error = dead["error"].as_str().unwrap();
    assert!(
        error.contains("delivery limit exceeded")
            && error.contains("transport.delivery_limit is 2"),
        "{error}"
    );
    assert_eq!(
        ledger_counts(&store).await.get("evt_looping"),
        None,
        "its handler never ran"
    );

    let out = run_cli(&cli_env, &["dlq", "redrive", "--all"]);
    assert!(out.contains("redriven: 1"), "{out}");
    handled_once(&bin, &store, &queue, &sink, "evt_looping").await;
    drop(bin);
    queue.cleanup().await;
}
