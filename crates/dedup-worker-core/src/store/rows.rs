//! The rows the store reads and writes: queue messages, outbox rows, dead letters.

/// A message to put on the database queue.
#[derive(Debug, Clone)]
pub struct NewQueueMessage {
    /// The provider it came from (first half of the dedup key); `None`: the consumer's default.
    pub source: Option<String>,
    /// The producer's message id (the event id for ingress); the consumer's dedup key.
    pub message_id: Option<String>,
    /// Event type, kept for routing and logs.
    pub message_type: Option<String>,
    /// The raw bytes, exactly as received.
    pub payload: Vec<u8>,
    /// The publisher's W3C `traceparent`, so the consumer continues its trace.
    pub traceparent: Option<String>,
    /// The compact `Stripe-Signature` the ingress verified (see
    /// [`crate::queue::OutgoingMessage::stripe_signature`]).
    pub stripe_signature: Option<String>,
    /// The sender's delivery headers, in their wire form (see
    /// [`crate::queue::OutgoingMessage::sender_headers`]); `None` when there are none.
    pub sender_headers: Option<String>,
}

/// A message claimed from the database queue.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QueuedMessage {
    pub id: i64,
    pub source: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub payload: Vec<u8>,
    /// Deliveries so far, this one included.
    pub attempts: i32,
    /// When it was enqueued (Unix milliseconds).
    pub enqueued_at: i64,
    /// The publisher's W3C `traceparent`.
    pub traceparent: Option<String>,
    /// The compact `Stripe-Signature` the ingress verified.
    pub stripe_signature: Option<String>,
    /// The sender's delivery headers, in their wire form.
    pub sender_headers: Option<String>,
    /// Identifies this claim: [`crate::store::Queue::release`] applies only while the
    /// message still carries it, i.e. while no other consumer has claimed it since.
    pub claim_token: i64,
}

/// An outbox row to write inside a handler's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOutboxRow {
    pub source: String,
    pub event_id: String,
    /// Sink spec; `None` is the configured default sink.
    pub destination: Option<String>,
    /// Sent as `Idempotency-Key` (HTTP) or `message_id` so receivers can deduplicate again.
    pub idempotency_key: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    /// The `traceparent` of the handler's span, so the relay's delivery continues the trace.
    pub traceparent: Option<String>,
    /// On an ordered sink's lane: the key whose rows are delivered one at a time in commit
    /// order (see `outbox/plan.rs`); `None` holds nothing and waits for nothing.
    pub ordering_key: Option<String>,
}

impl NewOutboxRow {
    /// The lane the row is delivered in (the `sink` column): its destination, a configured
    /// sink's name or an ad-hoc spec, or `default`.
    pub fn lane(&self) -> &str {
        self.destination
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_LANE)
    }
}

/// An outbox row claimed by a relay.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    /// The event's source and id: the dedup key of the event whose handler wrote the row.
    pub source: String,
    pub event_id: String,
    pub destination: Option<String>,
    pub idempotency_key: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    /// Delivery attempts so far, this one included.
    pub attempts: i32,
    /// The `traceparent` of the handler's span that wrote it.
    pub traceparent: Option<String>,
    /// Identifies the claim that returned this row (see [`OutboxClaim`]).
    pub claim_token: i64,
}

impl OutboxRow {
    /// What a mark of this row must name: the row and the claim that leased it.
    pub fn claim(&self) -> OutboxClaim {
        OutboxClaim {
            id: self.id,
            claim_token: self.claim_token,
        }
    }
}

/// One claim of one outbox row. Each claim writes a fresh token on the rows it leases; a mark
/// naming an older token changes nothing, because another relay claimed the row after this
/// one's lease expired and is delivering it now (its attempt count and its outcome are the ones
/// that count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutboxClaim {
    pub id: i64,
    pub claim_token: i64,
}

/// An event the stale-event guard held back: recorded as processed with outcome `stale`, not
/// handled, because `newer_event_id` had a strictly newer version of the same object.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StaleEvent {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub object_id: String,
    pub version: i64,
    pub newer_event_id: String,
    pub newer_version: i64,
}

/// A dead letter, for the CLI.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeadLetter {
    pub id: i64,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub queue: String,
    pub payload: Vec<u8>,
    pub error: String,
    pub attempts: i32,
}

/// A dead letter to write.
#[derive(Debug, Clone)]
pub struct NewDeadLetter {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub queue: String,
    pub payload: Vec<u8>,
    pub error: String,
    pub attempts: i32,
}

/// Outbox counts by status, for tests, readiness and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    pub pending: i64,
    pub dispatched: i64,
    pub failed: i64,
}

// --- what `events show` reads of one event (all times Unix milliseconds) ---------------------

/// The dedup record of one processed event.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ProcessedRecord {
    pub event_type: String,
    /// The batch transaction's start (handlers ran, and the outbox rows were written, in it).
    pub processed_at: i64,
    /// When the transport took the event in; `None` where it does not say, and for ids
    /// recorded before this was recorded.
    pub received_at: Option<i64>,
    /// Which delivery of the event was handled (1 on the first).
    pub delivery_attempt: Option<i32>,
}

/// The later deliveries of one event recognised as duplicates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct DuplicateDeliveries {
    /// How many, counted up to the limit the caller passed.
    pub count: i64,
    pub first_at: Option<i64>,
    pub last_at: Option<i64>,
}

/// One dead letter of an event.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadLetterRecord {
    pub id: i64,
    pub event_type: String,
    pub queue: String,
    pub error: String,
    pub attempts: i32,
    pub created_at: i64,
}

/// A dead letter of an event that `dlq redrive` published again (and deleted).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RedriveRecord {
    pub dead_letter_id: i64,
    pub event_type: String,
    /// The queue it was dead-lettered from.
    pub queue: String,
    /// The queue it was published to (empty when discarded).
    pub redriven_to: String,
    pub error: String,
    pub attempts: i32,
    pub dead_lettered_at: i64,
    /// When it left the dead letters (redriven or discarded).
    pub redriven_at: i64,
    /// `redriven`, or `discarded` by an operator (then nothing was published).
    pub outcome: String,
    /// Who discarded it; `None` for a redrive.
    pub actor: Option<String>,
}

impl RedriveRecord {
    /// Whether an operator discarded it (rather than redriving it).
    pub fn discarded(&self) -> bool {
        self.outcome == "discarded"
    }
}

/// The stale-event guard's record of holding an event back.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StaleRecord {
    pub event_type: String,
    pub object_id: String,
    pub version: i64,
    pub newer_event_id: String,
    pub newer_version: i64,
    pub recorded_at: i64,
}

/// One outbox row of an event, as the relay left it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OutboxRecord {
    pub id: i64,
    /// `None`: the configured default sink.
    pub destination: Option<String>,
    pub event_type: String,
    /// `pending`, `dispatched` or `failed`.
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: i64,
    /// When a pending row is next due (or its lease ends, while a relay delivers it).
    pub next_attempt_at: i64,
    pub dispatched_at: Option<i64>,
    /// A failed row an operator skipped (its ordering key's later rows went on): not a
    /// delivery failure the event's story reports.
    pub skipped: bool,
}

/// A message of an event still in the database queue.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct QueuedRecord {
    pub id: i64,
    pub queue: String,
    /// Deliveries so far.
    pub attempts: i32,
    pub enqueued_at: i64,
    /// When it can be received next (in the future while leased or backing off).
    pub visible_at: i64,
}
