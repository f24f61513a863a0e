//! The transport seam: where ingress publishes and the consumer receives.
//!
//! [`Transport`] is the one small trait every backend implements. Its contract:
//! * `publish` returns `Ok` only once the message is durable (database commit, publisher
//!   confirm, `SendMessage` success); ingress answers 2xx only after that;
//! * `receive` delivers at least once: a message not acked within its lease comes back;
//! * `ack` is called only after the consumer's transaction committed;
//! * `release` hands back at once what a failed step received, so a failure never strands
//!   deliveries until a lease, a channel close or a broker's consumer timeout;
//! * `extend_leases` keeps deliveries leased while the consumer works on them (its heartbeat),
//!   so the lease itself can be short and a dead consumer's deliveries come back quickly.

pub mod database;
pub mod rabbitmq;
pub mod sqs;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::event::SenderHeaders;

pub use database::DatabaseQueue;
pub use rabbitmq::RabbitMqQueue;
pub use sqs::SqsQueue;

/// A message to publish.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    /// The provider (`stripe`, `standard`): first half of the dedup key.
    pub source: Option<String>,
    /// The dedup key carried as a message property (`message_id`, SQS attribute, column).
    pub message_id: Option<String>,
    /// The event type, for routing and logs.
    pub message_type: Option<String>,
    /// The raw body, byte for byte.
    pub payload: Bytes,
    /// The W3C `traceparent` of the span that published it (a queue row's column, an AMQP
    /// header, an SQS attribute), so the consumer continues the trace; `None` with traces off.
    pub traceparent: Option<String>,
    /// The `Stripe-Signature` the ingress verified, reduced to `t=…,v1=<the v1 that matched>`
    /// ([`crate::signature::stripe::VerifiedSignature::compact`]): a queue row's column, an AMQP
    /// header, an SQS attribute; `None` from every other publisher. Issue 26 had the consumer
    /// verify it again before trusting the event's `created`; since issue 36 no creation time
    /// chooses where an id is looked up, so the consumer no longer reads it. It is still
    /// carried (the column, header and attribute exist on every transport); dropping it is a
    /// wire and schema change of its own.
    pub stripe_signature: Option<String>,
    /// The sender's delivery headers its scheme keeps (`X-GitHub-Delivery`, …), for the
    /// handler's [`crate::event::Event::header`]: a queue row's column, one AMQP header, one SQS
    /// attribute, each in [`SenderHeaders::to_wire`]'s form. Empty from every other publisher.
    pub sender_headers: SenderHeaders,
}

/// Identifies one delivery for `ack`/`retry_later`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeliveryTag {
    /// A database queue row, and the claim that leased it (a retry applies only under it).
    Row { id: i64, claim_token: i64 },
    /// A RabbitMQ delivery tag, valid only on the channel (generation) that delivered it.
    Amqp { generation: u64, tag: u64 },
    /// An SQS receipt handle.
    Sqs { receipt_handle: String },
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub tag: DeliveryTag,
    /// The provider, when the producer said; otherwise the consumer's configured source.
    pub source: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub payload: Bytes,
    /// Deliveries so far, this one included (1 on the first).
    pub attempts: u32,
    /// When the transport took the message in (Unix milliseconds): the ingress's publish (a
    /// retry's copy keeps its original's), a redrive's, another producer's send. `None` where
    /// the transport does not say (a RabbitMQ message another producer sent). Recorded with the
    /// event's dedup row, for `events show`.
    pub enqueued_at: Option<i64>,
    /// The publisher's `traceparent`, when it sent a valid one (see
    /// [`crate::telemetry::traces`]).
    pub traceparent: Option<String>,
    /// The compact `Stripe-Signature` the publisher carried (see [`OutgoingMessage`]); anyone
    /// who can publish to the queue can set it, so it is only a claim until verified.
    pub stripe_signature: Option<String>,
    /// The sender's delivery headers the publisher carried (see [`OutgoingMessage`]); empty
    /// when it carried none or something else.
    pub sender_headers: SenderHeaders,
    /// Why the transport could not read this message as its producer meant it (an SQS body
    /// marked base64 that is not); such a message is dead-lettered with this reason rather than
    /// left to come back forever.
    pub defect: Option<String>,
    /// Why the transport wants no more deliveries of this message (RabbitMQ: it went over
    /// `transport.delivery_limit`, or the broker parked it in `<queue>.dead`). The consumer
    /// dead-letters it with this reason without running its handler, unless its event was
    /// handled already (then it is acked as a duplicate).
    pub give_up: Option<String>,
}

pub use crate::error::Cause;

/// What a transport can tell of its queue's backlog cheaply, for the `dedup_queue_depth` and
/// `dedup_queue_oldest_message_age_seconds` gauges (sampled in the background by
/// [`crate::gauges`], never on a scrape). `None`: the transport cannot tell without another
/// service, and the gauge is not exported rather than exported as a guess.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Messages waiting, as the transport counts them: the database queue, every row not yet
    /// acked (leased ones too); RabbitMQ, the ready messages of a passive declare (delivered,
    /// unacked ones are not counted); SQS, `ApproximateNumberOfMessages` (visible ones).
    pub depth: Option<u64>,
    /// How long the oldest message not yet acked has been in the queue (the database queue's
    /// `enqueued_at`; a message waiting out a retry's backoff counts too, as it is not handled
    /// yet). RabbitMQ's declare carries no age, and SQS's `ApproximateAgeOfOldestMessage` is a
    /// CloudWatch metric, not a queue attribute: neither exports one.
    pub oldest_age: Option<Duration>,
}

/// The transport could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// Not now: the caller retries later (ingress: 503).
    #[error("transport unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// Never: the transport refused this one message for what it carries, and would refuse it
    /// again (ingress: 400). Messages published with it are unaffected.
    #[error("message refused by the transport: {0}")]
    Rejected(#[source] Cause),
    #[error("transport is shutting down")]
    Closed,
}

impl From<crate::store::StoreError> for TransportError {
    fn from(e: crate::store::StoreError) -> Self {
        let refused = e.refused_for_its_data();
        let cause = Cause::new(e.to_string(), e);
        if refused {
            TransportError::Rejected(cause)
        } else {
            TransportError::Unavailable(cause)
        }
    }
}

#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Publishes durably; `Ok` means the message survives a crash of this process.
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError>;

    /// Receives up to `max` messages, waiting up to `wait` for the first one. Empty on timeout.
    /// A transport whose every call is billed may wait longer than `wait`, up to a long poll of
    /// its own (SQS: `transport.sqs_wait_time`); it still returns as soon as a message
    /// arrives. A caller that must stop sooner drops the future, as the consumer does on
    /// shutdown: what a dropped receive had taken comes back after its lease.
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError>;

    /// Acknowledges deliveries (after the consumer's commit).
    async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), TransportError>;

    /// Gives deliveries back at once, unsettled, after a step that could not finish them (the
    /// store failed or refused the transaction, a deadlock): another worker or process can take
    /// them now instead of after their lease, and a RabbitMQ channel's prefetch window is not
    /// left full of deliveries nobody works on. Tags already acked are skipped. Best effort:
    /// what cannot be given back returns after its lease (or when its channel closes) anyway.
    async fn release(&self, tags: &[DeliveryTag]) -> Result<(), TransportError>;

    /// Gives back, like [`Transport::release`], deliveries no handler saw (the step failed
    /// before their handler ran: the store down or failing, the batch never run). Such a
    /// give-back is not the message's fault, so it must not count towards the transport's
    /// delivery limit, or a store that keeps failing would dead-letter valid events unhandled.
    /// By default a release. RabbitMQ's quorum queues count every requeue and every delivery
    /// a closed channel hands back (`x-delivery-count`), so it republishes a copy that carries
    /// the counts so far and acks the original.
    async fn give_back_unhandled(&self, deliveries: &[&Delivery]) -> Result<(), TransportError> {
        let tags: Vec<DeliveryTag> = deliveries.iter().map(|d| d.tag.clone()).collect();
        self.release(&tags).await
    }

    /// Extends the lease of deliveries still being worked on to `lease` from now (the
    /// consumer's heartbeat, every third of the lease). Returns the tags whose lease is lost: the
    /// delivery was received again by another consumer after this one's lease ran out (or is
    /// settled already); extending it again is pointless. A transport without leases (RabbitMQ:
    /// an unacked delivery stays with its live channel) returns none.
    async fn extend_leases(
        &self,
        tags: &[DeliveryTag],
        lease: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError>;

    /// Makes a delivery come back after `delay` (retryable handler failure). It gets the whole
    /// delivery because a broker without delayed redelivery republishes a copy.
    async fn retry_later(&self, delivery: &Delivery, delay: Duration)
        -> Result<(), TransportError>;

    /// Publishes to `queue` of this transport rather than the configured one (`dlq redrive`
    /// puts each dead letter back on the queue it was recorded on). Same guarantee as
    /// `publish`. By default only the configured queue is addressable.
    async fn publish_to_queue(
        &self,
        queue: &str,
        message: OutgoingMessage,
    ) -> Result<(), TransportError> {
        if self.can_address(queue) && queue == self.queue_name() {
            self.publish(message).await
        } else {
            Err(TransportError::Rejected(
                format!("this transport publishes only to {}", self.queue_name()).into(),
            ))
        }
    }

    /// Whether `queue` can name a queue of this transport (an SQS queue URL, a RabbitMQ or
    /// database queue name), so a dead letter recorded under another transport is not sent
    /// where no consumer of this one reads.
    fn can_address(&self, queue: &str) -> bool {
        queue == self.queue_name()
    }

    /// A give-back of these deliveries ([`Transport::release`],
    /// [`Transport::give_back_unhandled`]) failed or ran out of time, so they may still be held
    /// for this consumer. A delivery with a lease (the database queue, SQS) returns when its
    /// lease runs out: nothing to do, the default. A RabbitMQ delivery has no lease while its
    /// channel lives: left alone it would keep a place in the prefetch window for good, and
    /// after a few such give-backs the consumer would receive nothing more (a soak with the
    /// broker two seconds away and the database restarting found exactly that). RabbitMQ
    /// closes the channel instead, which hands back everything it held. Must not wait on the
    /// broker, which has just failed to answer.
    async fn give_back_failed(&self, _tags: &[DeliveryTag]) {}

    /// The consumer cannot work for a while (its store does not answer): hand back what the
    /// transport took on its behalf that no receive has returned yet, so that other consumers
    /// take it rather than wait for this one. The next receive resumes. By default nothing: the
    /// database queue and SQS take messages only inside a receive. RabbitMQ pushes up to its
    /// prefetch to a live consumer whether or not it receives; see its implementation.
    async fn pause_receiving(&self) {}

    /// Whether the transport can take messages now (for `/readyz`).
    async fn ready(&self) -> Result<(), TransportError>;

    /// The queue's backlog (see [`Backlog`]); by default nothing is known. Callers bound it with
    /// a timeout of their own.
    async fn backlog(&self) -> Result<Backlog, TransportError> {
        Ok(Backlog::default())
    }

    /// The queue name, recorded with dead letters.
    fn queue_name(&self) -> &str;
}
