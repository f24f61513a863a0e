//! RabbitMQ give-backs with a database that keeps failing (issue 36, item 7). A quorum queue
//! counts every requeue, and every delivery a closed channel hands back, in `x-delivery-count`;
//! the consumer gives its batch back on each failed step and closes its channel while the store
//! does not answer. Those give-backs must not count towards `transport.delivery_limit`: events
//! no handler saw would be dead-lettered unhandled once the database is back.
//!
//! The real consumer loop on the real broker, with a queue of its own (delivery limit 1), and
//! PostgreSQL behind a fault proxy: first slow (every step times out before its handler could
//! run, while the store still answers pings, so the loop keeps receiving and giving back) until
//! every event was received three times, then refused (the loop pauses, and gives back what the
//! broker had pushed to it), then healthy. Every event is then handled once, none dead-lettered.
//!
//! A give-back that gets no answer (the broker seconds away, found by a fault soak) must not
//! leave its deliveries with the consumer: on a live channel they have no lease, and would
//! hold the prefetch window for good. With a window of one delivery, one such give-back was
//! enough to stop the consumer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dedup_worker_core::config::EnvelopeKind;
use dedup_worker_core::consumer::{
    Consumer, ConsumerOptions, Handler, HandlerError, OutboxMessage,
};
use dedup_worker_core::event::Event;
use dedup_worker_core::queue::rabbitmq::RabbitOptions;
use dedup_worker_core::queue::{
    Delivery, DeliveryTag, OutgoingMessage, RabbitMqQueue, Transport, TransportError,
};
use dedup_worker_core::store::{DbTx, Store, Wakeups};
use tokio_util::sync::CancellationToken;

use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::{amqp_url, poll_until, wait_for, Backend, TestDb, TestQueue};

const EVENTS: usize = 3;
const DELIVERY_LIMIT: u32 = 1;

/// The RabbitMQ transport, counting what the consumer received of each event and its pauses.
struct Counting {
    inner: RabbitMqQueue,
    received: Mutex<HashMap<String, u32>>,
    pauses: AtomicUsize,
    /// Give-backs of unhandled deliveries dropped before they finished (the consumer's timeout).
    abandoned: Arc<AtomicUsize>,
    /// Run once, when a receive first returns deliveries (before the step runs).
    on_first_batch: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Counting {
    fn new(inner: RabbitMqQueue) -> Self {
        Counting {
            inner,
            received: Mutex::default(),
            pauses: AtomicUsize::new(0),
            abandoned: Arc::default(),
            on_first_batch: Mutex::default(),
        }
    }
}

/// Counts a give-back as abandoned unless it finished.
struct Unfinished(Option<Arc<AtomicUsize>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(abandoned) = self.0.take() {
            abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl Transport for Counting {
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError> {
        self.inner.publish(message).await
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        let deliveries = self.inner.receive(max, wait).await?;
        if !deliveries.is_empty() {
            if let Some(first) = self.on_first_batch.lock().unwrap().take() {
                first();
            }
        }
        let mut received = self.received.lock().unwrap();
        for d in &deliveries {
            *received
                .entry(d.message_id.clone().unwrap_or_default())
                .or_default() += 1;
        }
        Ok(deliveries)
    }
    async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        self.inner.ack(tags).await
    }
    async fn release(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        self.inner.release(tags).await
    }
    async fn give_back_unhandled(&self, deliveries: &[&Delivery]) -> Result<(), TransportError> {
        let mut unfinished = Unfinished(Some(self.abandoned.clone()));
        let given_back = self.inner.give_back_unhandled(deliveries).await;
        unfinished.0 = None;
        given_back
    }
    async fn give_back_failed(&self, tags: &[DeliveryTag]) {
        self.inner.give_back_failed(tags).await
    }
    async fn extend_leases(
        &self,
        tags: &[DeliveryTag],
        lease: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        self.inner.extend_leases(tags, lease).await
    }
    async fn retry_later(
        &self,
        delivery: &Delivery,
        delay: Duration,
    ) -> Result<(), TransportError> {
        self.inner.retry_later(delivery, delay).await
    }
    async fn pause_receiving(&self) {
        self.inner.pause_receiving().await;
        self.pauses.fetch_add(1, Ordering::SeqCst);
    }
    async fn ready(&self) -> Result<(), TransportError> {
        self.inner.ready().await
    }
    fn queue_name(&self) -> &str {
        self.inner.queue_name()
    }
}

/// Counts its runs per event.
#[derive(Default)]
struct Counted(Mutex<HashMap<String, u32>>);

#[async_trait]
impl Handler for Counted {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        *self.0.lock().unwrap().entry(event.id.clone()).or_default() += 1;
        Ok(Vec::new())
    }
}

/// A store connected through a fault proxy in front of `db`'s server.
async fn store_behind_a_proxy(db: &TestDb) -> (FaultProxy, Store) {
    let upstream = db
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(authority, _)| authority.to_owned())
        .expect("a postgres:// URL with a host");
    let proxy = FaultProxy::start(&upstream).await;
    let proxied = Store::connect_url(
        &proxy.rewrite(&db.url, &upstream),
        4,
        Duration::from_secs(10),
    )
    .await
    .expect("connect through the proxy");
    (proxy, proxied)
}

/// Publishes one `invoice.paid` event per id.
async fn publish(transport: &RabbitMqQueue, ids: &[String]) {
    for id in ids {
        let payload = serde_json::json!({"id": id, "type": "invoice.paid"}).to_string();
        transport
            .publish(OutgoingMessage {
                source: Some("stripe".into()),
                message_id: Some(id.clone()),
                message_type: Some("invoice.paid".into()),
                payload: Bytes::from(payload),
                traceparent: None,
                stripe_signature: None,
                sender_headers: dedup_worker_core::event::SenderHeaders::default(),
            })
            .await
            .expect("publish");
    }
}

/// The consumer's options: a step may take 250 ms (a database 150 ms away times every step
/// out before its BEGIN is answered, while a ping still answers).
fn options(batch_size: usize) -> ConsumerOptions {
    ConsumerOptions {
        source: "stripe".into(),
        dedup_key_pointer: "/id".into(),
        batch_size,
        poll_interval: Duration::from_millis(50),
        max_attempts: 5,
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        max_message_bytes: 1 << 20,
        lease: Duration::from_secs(60),
        step_timeout: Duration::from_millis(250),
        envelope: EnvelopeKind::None,
        outbox_plan: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_backs_of_events_no_handler_saw_never_dead_letter_them() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let (proxy, proxied) = store_behind_a_proxy(&db).await;
    let queue = TestQueue::new(crate::helpers::Transport::Rabbitmq)
        .await
        .with_delivery_limit(DELIVERY_LIMIT);
    let transport = Arc::new(Counting::new(RabbitMqQueue::new(
        amqp_url(),
        queue.name.clone(),
        RabbitOptions {
            // Room for more than a batch: the pause has pushed deliveries to give back.
            prefetch: 4,
            delivery_limit: DELIVERY_LIMIT,
            retry_max: Duration::from_secs(60),
        },
    )));
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt_give_back_{i}")).collect();
    publish(&transport.inner, &ids).await;

    // Slow: a round trip takes 300 ms, longer than a whole step may (250 ms), so every step
    // times out before its BEGIN is answered, let alone its handler run; a ping still answers.
    proxy.set_latency(Duration::from_millis(150));
    let handler = Arc::new(Counted::default());
    let consumer = Consumer::new(
        proxied.clone(),
        transport.clone(),
        handler.clone(),
        Arc::new(Wakeups::default()),
        options(2),
    );
    let (shutdown, abandon) = (CancellationToken::new(), CancellationToken::new());
    let running = tokio::spawn(consumer.run(shutdown.clone(), abandon.clone()));

    // Three deliveries of each event, each given back by a failed step: over the limit of 1 if
    // the give-backs counted.
    wait_for(
        "every event received three times",
        Duration::from_secs(120),
        || async {
            let received = transport.received.lock().unwrap().clone();
            ids.iter()
                .all(|id| received.get(id).copied().unwrap_or(0) >= 3)
                .then_some(())
        },
    )
    .await;
    assert!(
        handler.0.lock().unwrap().is_empty(),
        "a step ran a handler while the database was slow"
    );
    // Down: the loop pauses, giving back what it holds and what the broker pushed to it.
    proxy.set(Mode::Refuse).await;
    wait_for("the consumer paused", Duration::from_secs(60), || async {
        (transport.pauses.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    // Back: everything is handled, or dead-lettered.
    proxy.set_latency(Duration::ZERO);
    proxy.set(Mode::Pass).await;
    let settled = poll_until(Duration::from_secs(90), || async {
        let dead = store.dead_letters().list(100).await.ok()?;
        let handled = handler.0.lock().unwrap().len();
        (handled + dead.len() >= EVENTS).then_some(dead)
    })
    .await;
    shutdown.cancel();
    running.await.expect("the consumer stopped");
    transport.inner.close().await;
    let received = transport.received.lock().unwrap().clone();
    let handled = handler.0.lock().unwrap().clone();
    queue.cleanup().await;
    proxied.close().await;
    store.close().await;
    db.remove().await;

    let dead = settled.unwrap_or_else(|| {
        panic!("not every event settled: handled {handled:?}, received {received:?}")
    });
    let dead: Vec<(String, String)> = dead.into_iter().map(|d| (d.event_id, d.error)).collect();
    assert!(
        dead.is_empty(),
        "events no handler saw were dead-lettered: {dead:?} (received {received:?})"
    );
    for id in &ids {
        assert_eq!(handled.get(id), Some(&1), "{id}: handled {handled:?}");
    }
}

/// The broker three seconds away when a failed step gives its delivery back: the copy's confirm
/// cannot come within the consumer's five seconds, and the give-back is dropped with the
/// delivery still unacked on a live channel. With a prefetch of one, nothing more could be
/// received on that channel; the consumer must close it, so the delivery comes back and is
/// handled once both dependencies are healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_without_an_answer_does_not_strand_its_deliveries() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let (db_proxy, proxied) = store_behind_a_proxy(&db).await;
    let queue = TestQueue::new(crate::helpers::Transport::Rabbitmq)
        .await
        .with_delivery_limit(20);
    let broker = amqp_url();
    let upstream = broker
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(authority, _)| authority.to_owned())
        .expect("an amqp:// URL with a host");
    let broker_proxy = Arc::new(FaultProxy::start(&upstream).await);
    let rabbit_options = RabbitOptions {
        // One delivery in flight: one delivery stranded on the channel stops it.
        prefetch: 1,
        delivery_limit: 20,
        retry_max: Duration::from_secs(60),
    };
    let direct = RabbitMqQueue::new(broker.clone(), queue.name.clone(), rabbit_options.clone());
    let id = "evt_give_back_unanswered".to_owned();
    publish(&direct, std::slice::from_ref(&id)).await;
    direct.close().await;

    let transport = Arc::new(Counting::new(RabbitMqQueue::new(
        broker_proxy.rewrite(&broker, &upstream),
        queue.name.clone(),
        rabbit_options,
    )));
    let slowed = broker_proxy.clone();
    *transport.on_first_batch.lock().unwrap() =
        Some(Box::new(move || slowed.set_latency(Duration::from_secs(3))));
    db_proxy.set_latency(Duration::from_millis(150));
    let handler = Arc::new(Counted::default());
    let consumer = Consumer::new(
        proxied.clone(),
        transport.clone(),
        handler.clone(),
        Arc::new(Wakeups::default()),
        options(1),
    );
    let (shutdown, abandon) = (CancellationToken::new(), CancellationToken::new());
    let running = tokio::spawn(consumer.run(shutdown.clone(), abandon.clone()));

    wait_for(
        "a give-back dropped unfinished",
        Duration::from_secs(60),
        || async { (transport.abandoned.load(Ordering::SeqCst) > 0).then_some(()) },
    )
    .await;
    broker_proxy.set_latency(Duration::ZERO);
    db_proxy.set_latency(Duration::ZERO);
    let handled = poll_until(Duration::from_secs(60), || async {
        let handled = handler.0.lock().unwrap().clone();
        (!handled.is_empty()).then_some(handled)
    })
    .await;
    shutdown.cancel();
    running.await.expect("the consumer stopped");
    transport.inner.close().await;
    let received = transport.received.lock().unwrap().clone();
    let dead = store.dead_letters().list(10).await.expect("dead letters");
    queue.cleanup().await;
    proxied.close().await;
    store.close().await;
    db.remove().await;

    let handled = handled.unwrap_or_else(|| {
        panic!("the event stayed with the consumer after a give-back got no answer (received {received:?})")
    });
    assert_eq!(handled.get(&id), Some(&1), "handled {handled:?}");
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
}
