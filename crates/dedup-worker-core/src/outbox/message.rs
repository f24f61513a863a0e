//! [`OutboxMessage`]: what a handler asks to have delivered after its transaction commits. The
//! consumer writes one outbox row per message in the batch transaction; the relay delivers it.

use bytes::Bytes;

use crate::event::Event;

/// Something to deliver after commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// A configured sink's name (`[outbox.sinks.NAME]`) or a sink spec (`file:…`,
    /// `http://…`, an ad-hoc lane); `None`: where `[[outbox.routes]]` send it, else the default
    /// sink.
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

    /// `value` as JSON, to the default sink: `OutboxMessage::json("invoice.recorded",
    /// format!("recorded-{}", invoice.id), &record)?`. The key is passed on as the
    /// `Idempotency-Key`, so make it name this effect (a redelivered event builds the same one).
    pub fn json<T: serde::Serialize + ?Sized>(
        event_type: impl Into<String>,
        idempotency_key: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(OutboxMessage {
            destination: None,
            idempotency_key: idempotency_key.into(),
            event_type: event_type.into(),
            payload: Bytes::from(serde_json::to_vec(value)?),
        })
    }

    /// The same message to `destination` instead of where the routes (or the default sink)
    /// would send it: a configured sink's name (`"billing"`, `[outbox.sinks.billing]`, its own
    /// lane with its own rate and circuit breaker), or a sink spec (`file:…`, `http://…`,
    /// `amqp://…`, `sqs:…`), delivered in an ad-hoc lane of its own.
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_messages_carry_their_value_and_key() {
        #[derive(serde::Serialize)]
        struct Recorded<'a> {
            invoice: &'a str,
            amount: i64,
        }
        let message = OutboxMessage::json(
            "invoice.recorded",
            "recorded-in_1",
            &Recorded {
                invoice: "in_1",
                amount: 500,
            },
        )
        .unwrap()
        .to("file:/tmp/x.jsonl");
        assert_eq!(message.event_type, "invoice.recorded");
        assert_eq!(message.idempotency_key, "recorded-in_1");
        assert_eq!(message.destination.as_deref(), Some("file:/tmp/x.jsonl"));
        let back: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(back, serde_json::json!({"invoice": "in_1", "amount": 500}));
    }
}
