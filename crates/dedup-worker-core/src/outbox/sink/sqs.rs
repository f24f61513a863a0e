//! The SQS sink: a queue, through the SQS transport's publish.

use async_trait::async_trait;

use super::{timed, Receipt, Sink, SinkError};
use crate::store::OutboxRow;

/// Sends to an SQS queue through the SQS transport's publish (same attributes, so another
/// dedup-worker can consume the queue and deduplicate again).
pub struct SqsSink {
    /// The queue, through the transport's client (built in `super::build_sink`).
    pub(super) queue: crate::queue::SqsQueue,
    /// SendMessage calls in flight.
    pub(super) concurrency: usize,
}

#[async_trait]
impl Sink for SqsSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>> {
        use crate::queue::Transport;
        use futures::stream::{self, StreamExt};
        let sends: Vec<_> = rows
            .iter()
            .map(|row| {
                timed("sqs", row, move |traceparent| async move {
                    let message = crate::queue::OutgoingMessage {
                        source: None,
                        message_id: Some(row.idempotency_key.clone()),
                        message_type: Some(row.event_type.clone()),
                        payload: bytes::Bytes::from(row.payload.clone()),
                        traceparent,
                        stripe_signature: None,
                        sender_headers: crate::event::SenderHeaders::default(),
                    };
                    self.queue
                        .publish(message)
                        .await
                        .map(|_| Receipt::default())
                        .map_err(SinkError::Sqs)
                })
            })
            .collect();
        stream::iter(sends)
            .buffered(self.concurrency)
            .collect()
            .await
    }

    fn row_wise(&self) -> bool {
        true
    }
}
