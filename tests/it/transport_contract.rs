//! One contract, every transport: the database queue on PostgreSQL and on SQLite, RabbitMQ (a
//! real broker on 127.0.0.1:5672) and SQS (the moto_server emulator that scripts/test.sh starts
//! and points `AWS_ENDPOINT_URL` at); each test has a queue of its own, deleted after.
//! * what is published (concurrently) is received with its id, type, source and bytes intact,
//!   and once acked it does not come back;
//! * what a consumer received but never acked comes back to the next consumer, counted as a
//!   further attempt;
//! * `retry_later` brings a delivery back, with its attempts counted;
//! * `extend_leases` (the consumer's heartbeat) keeps deliveries from another consumer for as
//!   long as it is called, well past the lease; then they come back, and (database queue) the
//!   first consumer's next extension reports them lost;
//! * an ack that arrives after the lease ran out and the message was received again is not an
//!   error, and the current holder's ack removes the message;
//! * (SQS) a receive long-polls for the transport's own wait, which the SDK's timeout allows.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dedup_worker_core::queue::database::GroupCommit;
use dedup_worker_core::queue::rabbitmq::RabbitOptions;
use dedup_worker_core::queue::{
    DatabaseQueue, Delivery, OutgoingMessage, RabbitMqQueue, SqsQueue, Transport,
};
use dedup_worker_core::store::Wakeups;

use crate::helpers::queue::SqsTurn;
use crate::helpers::{amqp_url, sqs_turn, wait_for, Backend, SqsLoad, TestDb, TestQueue};

#[derive(Clone, Copy)]
enum Kind {
    DatabasePostgres,
    DatabaseSqlite,
    Rabbitmq,
    Sqs,
}

/// Owns what a test's transports share (database or broker queue) and removes it after.
struct Harness {
    kind: Kind,
    queue: String,
    db: Option<TestDb>,
    /// Every RabbitMQ instance made, to close and clean up.
    rabbits: Vec<Arc<RabbitMqQueue>>,
    /// The SQS client and queue URL.
    sqs: Option<(aws_sdk_sqs::Client, String)>,
    /// How long a received message stays invisible (database and SQS): short, so that what a
    /// "crashed" consumer held comes back within the test.
    lease: Duration,
    /// SQS: the test's turn on the emulator, shared with other light tests (its leases of a
    /// second must not wait on a heavy test's backlog).
    _emulator: Option<SqsTurn>,
}

impl Harness {
    async fn new(kind: Kind) -> Self {
        let db = match kind {
            Kind::DatabasePostgres => Some(TestDb::new(Backend::Postgres).await),
            Kind::DatabaseSqlite => Some(TestDb::new(Backend::Sqlite).await),
            Kind::Rabbitmq | Kind::Sqs => None,
        };
        let queue = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
        let emulator = match kind {
            Kind::Sqs => Some(sqs_turn(SqsLoad::Light).await),
            _ => None,
        };
        let sqs = match kind {
            Kind::Sqs => {
                let q = TestQueue::new(crate::helpers::Transport::Sqs).await;
                let client = q.sqs_client().expect("sqs client").clone();
                Some((client, q.name.clone()))
            }
            _ => None,
        };
        Harness {
            kind,
            queue,
            db,
            rabbits: Vec::new(),
            sqs,
            lease: match kind {
                Kind::Sqs => Duration::from_secs(1),
                _ => Duration::from_millis(500),
            },
            _emulator: emulator,
        }
    }

    /// A new transport instance on the same queue: what a new process would open.
    async fn transport(&mut self) -> Arc<dyn Transport> {
        match self.kind {
            Kind::DatabasePostgres | Kind::DatabaseSqlite => {
                let store = self.db.as_ref().expect("db").store().await;
                Arc::new(DatabaseQueue::start(
                    store,
                    self.queue.clone(),
                    Arc::new(Wakeups::default()),
                    GroupCommit {
                        max_batch: 64,
                        writers: 2,
                        channel_capacity: 256,
                        lease: self.lease,
                        commit_timeout: Duration::from_secs(10),
                        statement_timeout: Duration::from_secs(10),
                    },
                ))
            }
            Kind::Sqs => {
                let (client, url) = self.sqs.clone().expect("sqs");
                Arc::new(SqsQueue::with_client(client, url, self.lease))
            }
            Kind::Rabbitmq => {
                let queue = Arc::new(RabbitMqQueue::new(
                    amqp_url(),
                    self.queue.clone(),
                    RabbitOptions {
                        prefetch: 200,
                        delivery_limit: 20,
                        retry_max: Duration::from_secs(10),
                    },
                ));
                self.rabbits.push(queue.clone());
                queue
            }
        }
    }

    /// Makes `transport` let go of what it received without acking (a crash).
    async fn abandon(&self, transport: Arc<dyn Transport>) {
        // The database queue's leases simply run out; RabbitMQ requeues on connection close.
        for rabbit in &self.rabbits {
            if std::ptr::addr_eq(Arc::as_ptr(rabbit), Arc::as_ptr(&transport)) {
                rabbit.close().await;
            }
        }
    }

    /// Messages in the queue, received or not (RabbitMQ: ready ones; abandon first).
    async fn depth(&self) -> i64 {
        match self.kind {
            Kind::DatabasePostgres | Kind::DatabaseSqlite => {
                let store = self.db.as_ref().expect("db").store().await;
                store.queue().depth(&self.queue).await.expect("queue depth")
            }
            Kind::Sqs => {
                use aws_sdk_sqs::types::QueueAttributeName as A;
                let (client, url) = self.sqs.as_ref().expect("sqs");
                let out = client
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(A::ApproximateNumberOfMessages)
                    .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                    .send()
                    .await
                    .expect("queue attributes");
                out.attributes()
                    .map(|a| a.values().map(|v| v.parse::<i64>().unwrap_or(0)).sum())
                    .unwrap_or(0)
            }
            Kind::Rabbitmq => {
                let rabbit = self.rabbits.first().expect("a rabbit transport");
                i64::from(rabbit.depth().await.expect("depth"))
            }
        }
    }

    async fn cleanup(self) {
        if let Some((client, url)) = &self.sqs {
            client
                .delete_queue()
                .queue_url(url)
                .send()
                .await
                .expect("delete SQS queue");
        }
        if let Some(first) = self.rabbits.first() {
            first.delete_queues().await.expect("delete test queues");
        }
        for rabbit in &self.rabbits {
            rabbit.close().await;
        }
    }
}

fn message(i: usize) -> OutgoingMessage {
    OutgoingMessage {
        source: Some("stripe".into()),
        message_id: Some(format!("evt_{i}")),
        message_type: Some("invoice.paid".into()),
        payload: Bytes::from(format!("{{\"id\":\"evt_{i}\",\"n\":{i}}}")),
        traceparent: None,
        stripe_signature: None,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    }
}

/// Receives until `n` deliveries arrived (or panics at the deadline).
async fn receive_n(transport: &Arc<dyn Transport>, n: usize) -> Vec<Delivery> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "received {} of {n}",
            got.len()
        );
        got.extend(
            transport
                .receive(n - got.len(), Duration::from_millis(200))
                .await
                .expect("receive"),
        );
    }
    got
}

/// Receives until one delivery arrives (or panics after 30 s naming `what`).
async fn next_delivery(transport: &Arc<dyn Transport>, what: &str) -> Delivery {
    wait_for(what, Duration::from_secs(30), || {
        let transport = transport.clone();
        async move {
            let got = transport
                .receive(1, Duration::from_millis(200))
                .await
                .expect("receive");
            got.into_iter().next()
        }
    })
    .await
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod database_postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Kind::DatabasePostgres).await } )*
        }
        mod database_sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Kind::DatabaseSqlite).await } )*
        }
        mod rabbitmq {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Kind::Rabbitmq).await } )*
        }
        mod sqs {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Kind::Sqs).await } )*
        }
    };
}

contract!(
    published_messages_arrive_intact_and_acked_ones_stay_gone,
    unacked_messages_come_back_to_the_next_consumer,
    retry_later_brings_a_delivery_back,
    extended_leases_hold_deliveries_until_they_lapse,
);

async fn extended_leases_hold_deliveries_until_they_lapse(kind: Kind) {
    let mut h = Harness::new(kind).await;
    let first = h.transport().await;
    let second = h.transport().await;
    for i in 0..3 {
        first.publish(message(i)).await.expect("publish");
    }
    let held = receive_n(&first, 3).await;
    let tags: Vec<_> = held.iter().map(|d| d.tag.clone()).collect();
    // Three leases long, extended every third of one: nothing lapses, nothing is lost.
    let until = std::time::Instant::now() + h.lease * 3;
    while std::time::Instant::now() < until {
        let lost = first.extend_leases(&tags, h.lease).await.expect("extend");
        assert!(lost.is_empty(), "leases lost while extended: {lost:?}");
        let stolen = second
            .receive(3, Duration::from_millis(0))
            .await
            .expect("receive");
        assert!(
            stolen.is_empty(),
            "a held delivery went to another consumer"
        );
        tokio::time::sleep(h.lease / 3).await;
    }
    // The heartbeat stops (the consumer died): they come back to the other consumer.
    h.abandon(first.clone()).await;
    let again = receive_n(&second, 3).await;
    assert!(
        again.iter().all(|d| d.attempts >= 2),
        "counted as redeliveries"
    );
    if matches!(kind, Kind::DatabasePostgres | Kind::DatabaseSqlite) {
        let lost = first.extend_leases(&tags, h.lease).await.expect("extend");
        assert_eq!(
            lost.len(),
            3,
            "the first consumer's leases are reported lost"
        );
    }
    let again_tags: Vec<_> = again.iter().map(|d| d.tag.clone()).collect();
    second.ack(&again_tags).await.expect("ack");
    h.cleanup().await;
}

/// Transports whose deliveries come back when a lease runs out while the first receiver still
/// holds its tag. (RabbitMQ redelivers only once the receiving channel is closed, when its tags
/// can no longer be used at all.)
mod late_ack_after_the_lease {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn database_postgres() {
        super::a_late_ack_with_a_replaced_tag_is_harmless(super::Kind::DatabasePostgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn database_sqlite() {
        super::a_late_ack_with_a_replaced_tag_is_harmless(super::Kind::DatabaseSqlite).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqs() {
        super::a_late_ack_with_a_replaced_tag_is_harmless(super::Kind::Sqs).await
    }
}

/// SQS long-polls: a receive of an empty queue waits the transport's own long poll although
/// its caller asked for no wait, and the SDK's attempt timeout (the wait plus a margin) lets the
/// poll run to its end rather than failing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_receive_long_polls_and_its_timeout_allows_the_wait() {
    let h = Harness::new(Kind::Sqs).await;
    let (client, url) = h.sqs.clone().expect("sqs");
    let long_poll = Duration::from_secs(2);
    let transport = SqsQueue::with_client(client, url, h.lease).with_long_poll(long_poll);
    let started = std::time::Instant::now();
    let got = transport
        .receive(10, Duration::ZERO)
        .await
        .expect("an idle long poll ends empty, not in a timeout");
    let waited = started.elapsed();
    assert!(got.is_empty(), "{got:?}");
    assert!(
        waited >= long_poll - Duration::from_millis(500),
        "answered after {waited:?}: a short poll"
    );
    h.cleanup().await;
}

/// A consumer slower than its lease acks after the message was received again: that ack is not
/// an error (the work is committed; the new holder acks its copy), and once the new holder
/// acked, the message is gone.
async fn a_late_ack_with_a_replaced_tag_is_harmless(kind: Kind) {
    let mut h = Harness::new(kind).await;
    let transport = h.transport().await;
    transport.publish(message(3)).await.expect("publish");
    let first = receive_n(&transport, 1).await.remove(0);
    let second = next_delivery(&transport, "the redelivery after the lease").await;
    assert_eq!(second.message_id, first.message_id);
    transport
        .ack(std::slice::from_ref(&first.tag))
        .await
        .expect("a late ack with the replaced tag is not an error");
    transport
        .ack(std::slice::from_ref(&second.tag))
        .await
        .expect("the current holder's ack");
    // Longer than the lease (0.5 s database, 1 s SQS): an undeleted message would be back.
    let mut again = Vec::new();
    for _ in 0..8 {
        again.extend(
            transport
                .receive(10, Duration::from_millis(250))
                .await
                .expect("receive"),
        );
    }
    assert!(again.is_empty(), "acked message came back: {again:?}");
    h.cleanup().await;
}

async fn published_messages_arrive_intact_and_acked_ones_stay_gone(kind: Kind) {
    let mut h = Harness::new(kind).await;
    // Long enough that no message comes back while the hundred are being received (moto can
    // take seconds for that): "each message once" is about the transport, not the lease.
    h.lease = Duration::from_secs(30);
    let transport = h.transport().await;
    let publishes: Vec<_> = (0..100).map(|i| transport.publish(message(i))).collect();
    for result in futures::future::join_all(publishes).await {
        result.expect("publish is confirmed");
    }
    let got = receive_n(&transport, 100).await;
    let by_id: HashMap<String, &Delivery> = got
        .iter()
        .map(|d| (d.message_id.clone().unwrap(), d))
        .collect();
    assert_eq!(by_id.len(), 100, "each message once");
    let d = by_id["evt_42"];
    assert_eq!(d.payload, Bytes::from("{\"id\":\"evt_42\",\"n\":42}"));
    assert_eq!(d.message_type.as_deref(), Some("invoice.paid"));
    assert_eq!(d.source.as_deref(), Some("stripe"));
    assert_eq!(d.attempts, 1);
    let tags: Vec<_> = got.iter().map(|d| d.tag.clone()).collect();
    transport.ack(&tags).await.expect("ack");
    // Acked: gone from the queue (not merely invisible), and a fresh consumer finds nothing.
    h.abandon(transport).await;
    wait_for(
        "the acked messages to leave the queue",
        Duration::from_secs(30),
        || async { (h.depth().await == 0).then_some(()) },
    )
    .await;
    let next = h.transport().await;
    let mut again = Vec::new();
    for _ in 0..4 {
        again.extend(
            next.receive(10, Duration::from_millis(250))
                .await
                .expect("receive"),
        );
    }
    assert!(again.is_empty(), "acked messages came back: {again:?}");
    h.cleanup().await;
}

async fn unacked_messages_come_back_to_the_next_consumer(kind: Kind) {
    let mut h = Harness::new(kind).await;
    let first = h.transport().await;
    for i in 0..3 {
        first.publish(message(i)).await.expect("publish");
    }
    let got = receive_n(&first, 3).await;
    // One is acked, two are abandoned by a "crash".
    let acked = got[0].message_id.clone().unwrap();
    first
        .ack(std::slice::from_ref(&got[0].tag))
        .await
        .expect("ack");
    h.abandon(first).await;
    let second = h.transport().await;
    let back = receive_n(&second, 2).await;
    let ids: HashSet<String> = back.iter().map(|d| d.message_id.clone().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(!ids.contains(&acked));
    assert!(
        back.iter().all(|d| d.attempts >= 2),
        "redeliveries count: {back:?}"
    );
    second
        .ack(&back.iter().map(|d| d.tag.clone()).collect::<Vec<_>>())
        .await
        .expect("ack");
    h.cleanup().await;
}

async fn retry_later_brings_a_delivery_back(kind: Kind) {
    let mut h = Harness::new(kind).await;
    let transport = h.transport().await;
    transport.publish(message(7)).await.expect("publish");
    let first = receive_n(&transport, 1).await.remove(0);
    transport
        .retry_later(&first, Duration::from_millis(150))
        .await
        .expect("retry later");
    let again = next_delivery(&transport, "the retried delivery").await;
    assert_eq!(again.message_id.as_deref(), Some("evt_7"));
    assert_eq!(again.payload, first.payload);
    assert_eq!(again.source.as_deref(), Some("stripe"));
    assert_eq!(again.attempts, 2);
    transport
        .ack(std::slice::from_ref(&again.tag))
        .await
        .expect("ack");
    h.cleanup().await;
}
