//! The RabbitMQ transport (lapin).
//!
//! Topology, ensured on every (re)connect so a fresh broker needs no set-up, and declared
//! passively first so a queue that exists is used as it is (`rabbitmq/topology.rs`: a changed
//! setting never makes a declare fail and take ingress and the consumer down):
//! * `<queue>`: a durable quorum queue. Created with an `x-delivery-limit` and a dead-letter
//!   route to `<queue>.dead` as a backstop; the limit that applies is
//!   `transport.delivery_limit`, enforced by the consumer from `x-delivery-count`, so changing
//!   the setting takes effect without recreating the queue (`rabbitmq/incoming.rs`);
//! * `<queue>.dead`: where the broker parks what went over the backstop limit. The consumer
//!   reads it too and moves each message into the store's dead letters (inserted there, then
//!   acked: a crash in between moves it again, and the store keeps one dead letter per event),
//!   so `dlq list` shows it and `dlq redrive` replays it;
//! * `<queue>.retry.<ms>`: delay buckets for retryable handler failures. RabbitMQ has no
//!   delayed redelivery, so a retry republishes a copy into the bucket whose TTL is the delay
//!   (rounded up to a power of two, so a long delay never holds up a short one) and whose
//!   dead-letter route leads back to `<queue>`; the original is then acked.
//!
//! Guarantees: `publish` returns only after the broker's publisher confirm (mandatory publish,
//! so an unroutable message is an error, not a silent drop); many confirms are in flight at
//! once on one channel. Unacked deliveries return to the queue when the channel closes (a
//! crashed consumer). Acks of a contiguous run of delivery tags are one `multiple` ack (see
//! `settle` for when not).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Mutex;

use super::{Backlog, Cause, Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};

mod give_back;
mod headers;
mod incoming;
mod publisher;
mod tags;
mod topology;

use give_back::close_side;
pub use publisher::{ConfirmPublisher, Declare};
use publisher::{Side, BROKER_ANSWER_TIMEOUT};

use headers::now_ms;
pub use incoming::BROKER_DEAD_LETTERED;
use incoming::{Incoming, Origin};
use tags::ChannelTags;

/// A receive's batch ends at a pause this long in the deliveries (see `receive`).
const BATCH_GAP: Duration = Duration::from_millis(1);

/// The longest a receive waits for more deliveries after its first.
const BATCH_LINGER: Duration = Duration::from_millis(10);

/// RabbitMQ options (see `[transport]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct RabbitOptions {
    /// Unacked messages the broker may push to this consumer (bounds memory).
    pub prefetch: u16,
    /// Deliveries that may end unsettled before a message is dead-lettered: enforced on
    /// receive (`rabbitmq/incoming.rs`), and the `x-delivery-limit` of a queue this creates.
    pub delivery_limit: u32,
    /// The longest retry bucket.
    pub retry_max: Duration,
}

/// The consuming side: one channel, its consumer stream, and the tags it has not acked.
struct ConsumerSide {
    /// Keeps the connection open while the side lives.
    connection: Connection,
    channel: Channel,
    /// Deliveries of `<queue>` and `<queue>.dead`, merged; polled by one receiver at a time.
    stream: Mutex<BoxStream<'static, Incoming>>,
    /// Tags are per channel: a tag from an older generation must never be acked on this one.
    generation: u64,
    /// Both queues' consumers (to cancel: `give_back.rs`).
    consumer_tags: Vec<lapin::types::ShortString>,
    /// Which tags are unsettled, and how far one `multiple` frame may reach (see `tags.rs`).
    tags: std::sync::Mutex<ChannelTags>,
}

/// What [`RabbitMqQueue::settle`] does with deliveries.
#[derive(Debug, Clone, Copy)]
enum Settle {
    /// Done: the broker forgets them.
    Ack,
    /// Not done: back to the queue at once, for any consumer.
    Requeue,
}

pub struct RabbitMqQueue {
    url: String,
    queue: String,
    options: RabbitOptions,
    /// Publishes (ingress, retries, redrives) with confirms; also declares the retry buckets.
    publisher: ConfirmPublisher,
    consumer: Mutex<Option<Arc<ConsumerSide>>>,
    generation: AtomicU64,
    /// Retry buckets declared so far (by TTL in ms).
    buckets: std::sync::Mutex<HashSet<u64>>,
}

/// The broker client failed: unavailable, with lapin's error as the cause.
fn unavailable(e: lapin::Error) -> TransportError {
    TransportError::Unavailable(Cause::new(format!("rabbitmq: {e}"), e))
}

/// The broker did not do what was asked (no answer in time, a nack, a stream that ended).
fn broker_failed(what: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(Cause::from(format!("rabbitmq: {what}")))
}

/// What the transport's connections declare: its queues.
fn declare_queues(queue: &str, options: &RabbitOptions) -> Declare {
    Declare::Queues {
        queue: queue.to_owned(),
        delivery_limit: options.delivery_limit,
    }
}

impl RabbitMqQueue {
    /// Creates the transport; connections are made on first use (and again after a failure),
    /// so a broker that is down at start-up makes `/readyz` and ingress answer 503 rather than
    /// stopping the process.
    pub fn new(url: String, queue: String, options: RabbitOptions) -> Self {
        RabbitMqQueue {
            publisher: ConfirmPublisher::new(url.clone(), declare_queues(&queue, &options)),
            url,
            queue,
            options,
            consumer: Mutex::new(None),
            generation: AtomicU64::new(0),
            buckets: std::sync::Mutex::new(HashSet::new()),
        }
    }

    async fn consumer(&self) -> Result<Arc<ConsumerSide>, TransportError> {
        let mut slot = self.consumer.lock().await;
        if let Some(side) = slot.as_ref().filter(|s| s.channel.status().connected()) {
            return Ok(side.clone());
        }
        let Side {
            connection,
            channel,
        } = publisher::connect(&self.url, &declare_queues(&self.queue, &self.options)).await?;
        channel
            .basic_qos(self.options.prefetch, BasicQosOptions::default())
            .await
            .map_err(unavailable)?;
        // Both queues on one channel: delivery tags are per channel, so acks and requeues
        // work the same for either, and a closed channel gives back what either delivered.
        let (main_tag, main) = incoming::consume(&channel, &self.queue, Origin::Main).await?;
        let dead = topology::dead_queue(&self.queue);
        let (dead_tag, parked) = incoming::consume(&channel, &dead, Origin::Parked).await?;
        let stream = futures::stream::select(main, parked).boxed();
        let side = Arc::new(ConsumerSide {
            connection,
            channel,
            stream: Mutex::new(stream),
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            consumer_tags: vec![main_tag, dead_tag],
            tags: std::sync::Mutex::new(ChannelTags::default()),
        });
        *slot = Some(side.clone());
        Ok(side)
    }

    /// Forgets a side after an error so the next call reconnects.
    async fn reset_consumer(&self) {
        *self.consumer.lock().await = None;
    }

    /// Publishes to the default exchange with routing key `routing_key` and waits for the
    /// broker's confirm. A copy carries its original's `counts` (`headers::written`) and
    /// `enqueued_at` (`None` for a copy of a message that did not say).
    async fn publish_to(
        &self,
        routing_key: &str,
        message: &OutgoingMessage,
        counts: (u32, u32),
        enqueued_at: Option<i64>,
    ) -> Result<(), TransportError> {
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_headers(headers::written(message, counts, enqueued_at));
        if let Some(id) = &message.message_id {
            properties = properties.with_message_id(id.as_str().into());
        }
        if let Some(kind) = &message.message_type {
            properties = properties.with_type(kind.as_str().into());
        }
        self.publisher
            .publish("", routing_key, &message.payload, properties)
            .await
    }

    /// The retry bucket for `delay`: a power of two milliseconds, at least 100 ms.
    async fn retry_bucket(&self, delay: Duration) -> Result<String, TransportError> {
        let wanted = delay.min(self.options.retry_max).as_millis().max(100) as u64;
        let ttl = wanted.next_power_of_two();
        let name = format!("{}.retry.{ttl}", self.queue);
        let known = self
            .buckets
            .lock()
            .map(|b| b.contains(&ttl))
            .unwrap_or(false);
        if !known {
            let side = self.publisher.side().await?;
            topology::declare_bucket(&side.connection, &self.queue, &name, ttl).await?;
            if let Ok(mut buckets) = self.buckets.lock() {
                buckets.insert(ttl);
            }
        }
        Ok(name)
    }

    /// Closes both connections (unacked deliveries go back, as when the process dies).
    pub async fn close(&self) {
        self.close_consumer().await;
        self.publisher.close().await;
    }

    /// Closes the consuming side: what it delivered and nobody acked, received or still
    /// buffered, goes back to the queue; the next receive opens a new one.
    async fn close_consumer(&self) {
        if let Some(side) = self.consumer.lock().await.take() {
            close_side(&side).await;
        }
    }

    /// Messages ready or unacked in the queue (a passive declare), for tests and operators.
    pub async fn depth(&self) -> Result<u32, TransportError> {
        let side = self.publisher.side().await?;
        let queue = side
            .channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?;
        Ok(queue.message_count())
    }

    /// Deletes the queue, `<queue>.dead` and the retry buckets this instance declared (tests).
    pub async fn delete_queues(&self) -> Result<(), TransportError> {
        let side = self.publisher.side().await?;
        let buckets: Vec<u64> = self
            .buckets
            .lock()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default();
        let mut names = vec![self.queue.clone(), format!("{}.dead", self.queue)];
        names.extend(
            buckets
                .iter()
                .map(|ttl| format!("{}.retry.{ttl}", self.queue)),
        );
        for name in names {
            side.channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// Acks or requeues deliveries of the current channel that are still unsettled; tags of an
    /// older channel are void (the broker requeued those when it closed), and settling a tag
    /// twice would close the channel. On error the channel is reset, which requeues everything
    /// it held. (A failed step's give-back may name tags acked already: only unsettled ones
    /// are sent.)
    async fn settle(&self, tags: &[DeliveryTag], how: Settle) -> Result<(), TransportError> {
        let Some(side) = self.consumer.lock().await.clone() else {
            return Ok(());
        };
        let (mine, multiple) = {
            let Ok(channel_tags) = side.tags.lock() else {
                return Ok(());
            };
            let mine = channel_tags.unsettled_of(tags.iter().filter_map(|t| match t {
                DeliveryTag::Amqp { generation, tag } if *generation == side.generation => {
                    Some(*tag)
                }
                _ => None,
            }));
            if mine.is_empty() {
                return Ok(());
            }
            // One `multiple` frame when it settles exactly these tags (tags are removed only
            // after their frames were sent, so a worker settling at the same time sees these as
            // unsettled and sends single frames).
            let multiple = channel_tags.one_frame_settles_exactly(&mine);
            (mine, multiple)
        };
        let last = mine[mine.len() - 1];
        let frames: Vec<u64> = if multiple { vec![last] } else { mine.clone() };
        let mut result = Ok(());
        for tag in frames {
            result = match how {
                Settle::Ack => {
                    side.channel
                        .basic_ack(tag, BasicAckOptions { multiple })
                        .await
                }
                Settle::Requeue => {
                    side.channel
                        .basic_nack(
                            tag,
                            BasicNackOptions {
                                multiple,
                                requeue: true,
                            },
                        )
                        .await
                }
            };
            if result.is_err() {
                break;
            }
        }
        if let Ok(mut channel_tags) = side.tags.lock() {
            channel_tags.settled(&mine);
        }
        if let Err(e) = result {
            self.reset_consumer().await;
            return Err(unavailable(e));
        }
        Ok(())
    }
}

#[async_trait]
impl Transport for RabbitMqQueue {
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError> {
        self.publish_to(&self.queue, &message, (0, 0), Some(now_ms()))
            .await
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        let side = self.consumer().await?;
        let mut stream = side.stream.lock().await;
        let first = match tokio::time::timeout(wait, stream.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(Some(Ok(delivery))) => delivery,
            Ok(Some(Err(e))) => {
                drop(stream);
                self.reset_consumer().await;
                return Err(e);
            }
            Ok(None) => {
                drop(stream);
                self.reset_consumer().await;
                return Err(broker_failed("consumer stream ended"));
            }
        };
        let mut out = vec![incoming::convert(&side, self.options.delivery_limit, first)];
        // Take what is already buffered (up to the prefetch), then what keeps arriving without
        // a pause: under a backlog the broker streams the next batch in as the previous one is
        // acked (the prefetch is full until then), so taking only what was buffered at the
        // first delivery made batches of about half `max` (124 of 256 on average at the
        // default settings), and twice the transactions per event. A pause of
        // `BATCH_GAP` (the broker has nothing more to push), or `BATCH_LINGER` in all, ends
        // the batch: a lone event waits at most one gap.
        let lingering = tokio::time::Instant::now() + BATCH_LINGER;
        while out.len() < max {
            let next = match stream.next().now_or_never() {
                Some(next) => next,
                None => {
                    let until = lingering.min(tokio::time::Instant::now() + BATCH_GAP);
                    match tokio::time::timeout_at(until, stream.next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
            };
            match next {
                Some(Ok(delivery)) => out.push(incoming::convert(
                    &side,
                    self.options.delivery_limit,
                    delivery,
                )),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        self.settle(tags, Settle::Ack).await
    }

    /// The broker pushes up to the prefetch to a live consumer whether it receives or not, and
    /// a process cut off from its database would hold it all for the outage. So the consumers
    /// are cancelled, what they buffered is given back uncounted (`give_back.rs`), and the side
    /// is closed. Another worker's batch in progress on it loses its acks: its events come back
    /// (counted once) and are recognised as duplicates.
    async fn pause_receiving(&self) {
        self.pause().await;
    }

    async fn give_back_unhandled(&self, deliveries: &[&Delivery]) -> Result<(), TransportError> {
        self.give_back_copies(deliveries).await
    }

    async fn release(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        self.settle(tags, Settle::Requeue).await
    }

    async fn give_back_failed(&self, tags: &[DeliveryTag]) {
        self.close_side_holding(tags).await;
    }

    /// Nothing to extend: an unacked delivery stays with its channel for as long as the channel
    /// lives, and comes back at once when it closes (the process died).
    async fn extend_leases(
        &self,
        _tags: &[DeliveryTag],
        _lease: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        Ok(Vec::new())
    }

    async fn retry_later(
        &self,
        delivery: &Delivery,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let bucket = self.retry_bucket(delay).await?;
        let copy = OutgoingMessage {
            source: delivery.source.clone(),
            message_id: delivery.message_id.clone(),
            message_type: delivery.message_type.clone(),
            payload: delivery.payload.clone(),
            traceparent: delivery.traceparent.clone(),
            stripe_signature: delivery.stripe_signature.clone(),
            sender_headers: delivery.sender_headers.clone(),
        };
        // The copy is confirmed before the original is acked: a crash in between delivers
        // the event twice, which the dedup record absorbs; the other order could lose it.
        let counts = (delivery.attempts, 0);
        self.publish_to(&bucket, &copy, counts, delivery.enqueued_at)
            .await?;
        self.ack(std::slice::from_ref(&delivery.tag)).await
    }

    /// Mandatory, like every publish: a queue that does not exist is an error, not a drop.
    async fn publish_to_queue(
        &self,
        queue: &str,
        message: OutgoingMessage,
    ) -> Result<(), TransportError> {
        self.publish_to(queue, &message, (0, 0), Some(now_ms()))
            .await
    }

    fn can_address(&self, queue: &str) -> bool {
        !queue.is_empty() && !queue.contains("://")
    }

    async fn ready(&self) -> Result<(), TransportError> {
        self.publisher.side().await.map(|_| ())
    }

    /// Ready messages, by a passive declare; AMQP says nothing of their age.
    async fn backlog(&self) -> Result<Backlog, TransportError> {
        let side = self.publisher.side().await?;
        let ready = topology::ready_messages(&side.connection, &self.queue).await?;
        Ok(Backlog {
            depth: Some(u64::from(ready)),
            oldest_age: None,
        })
    }

    fn queue_name(&self) -> &str {
        &self.queue
    }
}
