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
    /// Identifies this claim: [`crate::store::Store::release_message`] applies only while the
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
