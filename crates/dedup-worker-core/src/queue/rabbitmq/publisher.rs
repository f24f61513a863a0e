//! A confirm-mode publisher, shared by the RabbitMQ transport (publishing to its queues) and the
//! outbox's AMQP sink (publishing to an exchange): one implementation of what makes a publish
//! safe to count as delivered.
//!
//! * The channel is made on first use and again after an error, each time declaring what the
//!   publishes need ([`Declare`]) so a fresh broker needs no set-up.
//! * Every publish is mandatory and waits for the broker's confirm: `Ok` means the broker has
//!   taken responsibility for the message. A message no queue is bound for comes back as
//!   unroutable and is an error, not a silent drop.
//! * Nothing waits on the broker without a bound ([`BROKER_ANSWER_TIMEOUT`]): a broker that
//!   accepts connections and never answers, or never confirms, fails the publish (and resets
//!   the channel) instead of holding it and everyone waiting on the same channel.
//! * Many publishes may be in flight on the one channel; their confirms are pipelined.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::Mutex;

use super::{broker_failed, topology, unavailable};
use crate::config::shown_url;
use crate::queue::{Cause, TransportError};

/// The longest a connect (with its topology) or a publisher confirm may take.
pub(super) const BROKER_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a new connection declares before anything is published on it.
#[derive(Debug, Clone)]
pub enum Declare {
    /// The transport's queues: `<queue>` and `<queue>.dead` (see `topology.rs`).
    Queues { queue: String, delivery_limit: u32 },
    /// A durable topic exchange (the AMQP sink's). An existing exchange of another kind is an
    /// error that names the problem.
    TopicExchange(String),
}

/// An open connection and a channel on it.
pub(super) struct Side {
    /// Keeps the connection open while the side lives.
    pub(super) connection: Connection,
    pub(super) channel: Channel,
}

/// Connects and declares `declare`, within [`BROKER_ANSWER_TIMEOUT`]. A failure to connect
/// names the broker (its URL as a sink's is shown: password masked, no query) beside the cause, so a log line or a 503 says
/// which host and port did not answer.
pub(super) async fn connect(url: &str, declare: &Declare) -> Result<Side, TransportError> {
    tokio::time::timeout(BROKER_ANSWER_TIMEOUT, connect_unbounded(url, declare))
        .await
        .map_err(|_| {
            broker_failed(format!(
                "no answer from {} within {BROKER_ANSWER_TIMEOUT:?}",
                shown_url(url)
            ))
        })?
}

async fn connect_unbounded(url: &str, declare: &Declare) -> Result<Side, TransportError> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| {
            TransportError::Unavailable(Cause::new(
                format!("rabbitmq: connecting to {}: {e}", shown_url(url)),
                e,
            ))
        })?;
    let channel = match declare {
        Declare::Queues {
            queue,
            delivery_limit,
        } => topology::declare_queues(&connection, queue, *delivery_limit).await?,
        Declare::TopicExchange(exchange) => {
            let channel = connection.create_channel().await.map_err(unavailable)?;
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?;
            channel
        }
    };
    Ok(Side {
        connection,
        channel,
    })
}

/// Publishes with confirms on a channel made on first use and after errors.
pub struct ConfirmPublisher {
    /// The broker URL.
    url: String,
    /// What each new connection declares.
    declare: Declare,
    /// The confirm-mode side; `None` until first use and after an error, so the next publish
    /// reconnects.
    side: Mutex<Option<Arc<Side>>>,
}

impl ConfirmPublisher {
    /// No connection is made until the first publish.
    pub fn new(url: String, declare: Declare) -> Self {
        ConfirmPublisher {
            url,
            declare,
            side: Mutex::new(None),
        }
    }

    /// The open side, connecting (with confirms on) when there is none or it closed.
    pub(super) async fn side(&self) -> Result<Arc<Side>, TransportError> {
        let mut slot = self.side.lock().await;
        if let Some(side) = slot.as_ref().filter(|s| s.channel.status().connected()) {
            return Ok(side.clone());
        }
        let side = connect(&self.url, &self.declare).await?;
        side.channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        let side = Arc::new(side);
        *slot = Some(side.clone());
        Ok(side)
    }

    /// Connects now if there is no open side: a batch of publishes asks this once, so a broker
    /// that is down costs one connect attempt rather than one per message.
    pub async fn ready(&self) -> Result<(), TransportError> {
        self.side().await.map(drop)
    }

    /// Forgets the side so the next publish reconnects.
    pub(super) async fn reset(&self) {
        *self.side.lock().await = None;
    }

    /// Publishes `payload` to `exchange` (`""`: the default exchange, routing to the queue named
    /// `routing_key`), mandatory, and waits for the broker's confirm.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), TransportError> {
        let side = self.side().await?;
        let confirm = side
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload,
                properties,
            )
            .await;
        // A confirm that never comes (a broker that stopped answering) would hold this
        // publish, and whoever waits on it, forever.
        let confirmation = match confirm {
            Ok(pending) => match tokio::time::timeout(BROKER_ANSWER_TIMEOUT, pending).await {
                Ok(confirmation) => confirmation,
                Err(_) => {
                    self.reset().await;
                    return Err(broker_failed(format!(
                        "no publisher confirm within {BROKER_ANSWER_TIMEOUT:?}"
                    )));
                }
            },
            Err(e) => Err(e),
        };
        match confirmation {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(_))) => Err(broker_failed(format!(
                "returned unroutable: no queue is bound to exchange {exchange:?} for routing key \
                 {routing_key:?}"
            ))),
            Ok(Confirmation::Nack(_)) => Err(broker_failed("broker nacked the message")),
            Ok(Confirmation::NotRequested) => Err(broker_failed("publisher confirms are off")),
            Err(e) => {
                self.reset().await;
                Err(unavailable(e))
            }
        }
    }

    /// Closes the connection, if any; the next publish reconnects.
    pub async fn close(&self) {
        if let Some(side) = self.side.lock().await.take() {
            let _ = tokio::time::timeout(
                BROKER_ANSWER_TIMEOUT,
                side.connection.close(200, "closing".into()),
            )
            .await;
        }
    }
}
