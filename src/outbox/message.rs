//! [`OutboxMessage`]: what a handler asks to have delivered after its transaction commits. The
//! consumer writes one outbox row per message in the batch transaction; the relay delivers it.

use bytes::Bytes;

use crate::event::Event;

/// Something to deliver after commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// A sink spec (`file:…`, `http://…`); `None` is the configured default sink.
    pub destination: Option<String>,
    /// Passed on as `Idempotency-Key`, so the receiver can deduplicate again.
    pub idempotency_key: String,
    pub event_type: String,
    pub payload: Bytes,
}

impl OutboxMessage {
    /// The event itself, to the default sink, keyed by the event id.
    pub fn forward(event: &Event) -> Self {
        OutboxMessage {
            destination: None,
            idempotency_key: event.id.clone(),
            event_type: event.event_type.clone(),
            payload: event.payload.clone(),
        }
    }
}
