//! The RabbitMQ sink: an exchange, through the transport's confirming publisher.

use async_trait::async_trait;

use super::{timed, Receipt, Sink, SinkError};
use crate::queue::rabbitmq::{ConfirmPublisher, Declare};
use crate::store::OutboxRow;
use crate::telemetry::traces;

/// Publishes to an exchange through the RabbitMQ transport's [`ConfirmPublisher`] (mandatory,
/// with publisher confirms, every wait bounded); routing key = event type, `message_id` =
/// idempotency key. A message no queue is bound for is a failed delivery (retried, then marked
/// failed), not a silent drop.
pub struct AmqpSink {
    exchange: String,
    /// Declares the exchange on each new connection; reconnects after errors.
    publisher: ConfirmPublisher,
}

impl AmqpSink {
    pub fn new(url: String, exchange: String) -> Self {
        AmqpSink {
            publisher: ConfirmPublisher::new(url, Declare::TopicExchange(exchange.clone())),
            exchange,
        }
    }

    async fn publish(
        &self,
        row: &OutboxRow,
        traceparent: Option<String>,
    ) -> Result<Receipt, SinkError> {
        let mut properties = lapin::BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(row.idempotency_key.as_str().into())
            .with_type(row.event_type.as_str().into());
        if let Some(traceparent) = traceparent {
            let mut headers = lapin::types::FieldTable::default();
            headers.insert(
                traces::TRACEPARENT.into(),
                lapin::types::AMQPValue::LongString(traceparent.into()),
            );
            properties = properties.with_headers(headers);
        }
        self.publisher
            .publish(&self.exchange, &row.event_type, &row.payload, properties)
            .await
            .map(|()| Receipt::default())
            .map_err(SinkError::Amqp)
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn deliver_batch(&self, rows: &[OutboxRow]) -> Vec<Result<Receipt, SinkError>> {
        if let Err(error) = self.publisher.ready().await {
            return rows
                .iter()
                .map(|_| Err(SinkError::Amqp(error.clone())))
                .collect();
        }
        // All publishes go out before any confirm is awaited: the confirms are pipelined.
        let publishes = rows
            .iter()
            .map(|row| timed("amqp", row, |traceparent| self.publish(row, traceparent)));
        futures::future::join_all(publishes).await
    }
}
