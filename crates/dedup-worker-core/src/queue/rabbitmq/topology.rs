//! Declaring the RabbitMQ topology so that a changed setting never takes the service down.
//!
//! RabbitMQ refuses a `queue.declare` whose arguments differ from the existing queue's
//! (`PRECONDITION_FAILED`, 406) and closes the channel. Declaring `<queue>` with
//! `x-delivery-limit = transport.delivery_limit` every time would therefore stop ingress and the
//! consumer as soon as someone changes the setting, until the queue is deleted by hand (and its
//! messages with it). So every queue is declared passively first: a passive declare only asks
//! whether the queue exists and compares no arguments. Only a queue that does not exist yet is
//! declared with arguments; a queue declared earlier keeps the arguments it was created with.
//!
//! What that means for the delivery limit: the consumer enforces `transport.delivery_limit`
//! itself, from the `x-delivery-count` the quorum queue puts on each delivery (see
//! [`super::RabbitMqQueue`]), so the current setting always applies; the broker's own
//! `x-delivery-limit`, set only when this creates the queue, is a backstop for a crash that
//! keeps happening before the consumer can dead-letter, and an older queue keeps the limit it
//! was declared with as its backstop.
//!
//! The same holds for the retry buckets `<queue>.retry.<ms>`: their arguments (TTL, route back
//! to `<queue>`) follow from their name, but one declared by an older version with other
//! arguments is used as it is rather than failing every retry.

use lapin::options::QueueDeclareOptions;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ErrorKind};

use super::headers::long;
use super::unavailable;
use crate::queue::{Cause, TransportError};

/// The queue where the broker parks what went over its `x-delivery-limit`.
pub(super) fn dead_queue(queue: &str) -> String {
    format!("{queue}.dead")
}

/// Declares `<queue>.dead` and `<queue>` (see the module docs) and returns an open channel on
/// `connection`: a declare that fails closes the channel it was sent on.
pub(super) async fn declare_queues(
    connection: &Connection,
    queue: &str,
    delivery_limit: u32,
) -> Result<Channel, TransportError> {
    let dead = dead_queue(queue);
    let mut quorum = FieldTable::default();
    quorum.insert("x-queue-type".into(), long("quorum"));
    let channel = connection.create_channel().await.map_err(unavailable)?;
    let channel = ensure_queue(connection, channel, &dead, quorum.clone()).await?;
    let mut main = quorum;
    main.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongInt(i32::try_from(delivery_limit).unwrap_or(i32::MAX)),
    );
    main.insert("x-dead-letter-exchange".into(), long(""));
    main.insert("x-dead-letter-routing-key".into(), long(&dead));
    ensure_queue(connection, channel, queue, main).await
}

/// Declares the retry bucket `name` (messages wait `ttl_ms`, then go back to `queue`) on a
/// channel of its own, so a refused declare never closes the publisher's channel.
pub(super) async fn declare_bucket(
    connection: &Connection,
    queue: &str,
    name: &str,
    ttl_ms: u64,
) -> Result<(), TransportError> {
    let mut args = FieldTable::default();
    args.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    );
    args.insert("x-dead-letter-exchange".into(), long(""));
    args.insert("x-dead-letter-routing-key".into(), long(queue));
    let channel = connection.create_channel().await.map_err(unavailable)?;
    let channel = ensure_queue(connection, channel, name, args).await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// Ready messages of queue `name` (delivered, unacked ones are not counted), by a passive
/// declare on a channel of its own, closed after: a declare that fails (the queue deleted by
/// hand) closes that channel only, never the publisher's.
pub(super) async fn ready_messages(
    connection: &Connection,
    name: &str,
) -> Result<u32, TransportError> {
    let channel = connection.create_channel().await.map_err(unavailable)?;
    let passive = QueueDeclareOptions {
        passive: true,
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let declared = channel
        .queue_declare(name.into(), passive, FieldTable::default())
        .await;
    let _ = channel.close(200, "counted".into()).await;
    Ok(declared
        .map_err(|e| declare_failed(name, e))?
        .message_count())
}

/// Makes sure queue `name` exists: a passive declare; if the queue is missing, a declare with
/// `arguments`; if that is refused because another process created it meanwhile with other
/// arguments, a passive declare again. Returns the channel that is still open.
async fn ensure_queue(
    connection: &Connection,
    channel: Channel,
    name: &str,
    arguments: FieldTable,
) -> Result<Channel, TransportError> {
    let passive = QueueDeclareOptions {
        passive: true,
        durable: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
    {
        Ok(_) => return Ok(channel),
        Err(e) if soft_error(&e) == Some(AMQPSoftError::NOTFOUND) => {}
        Err(e) => return Err(declare_failed(name, e)),
    }
    let channel = connection.create_channel().await.map_err(unavailable)?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    match channel.queue_declare(name.into(), durable, arguments).await {
        Ok(_) => Ok(channel),
        Err(e) if soft_error(&e) == Some(AMQPSoftError::PRECONDITIONFAILED) => {
            let channel = connection.create_channel().await.map_err(unavailable)?;
            channel
                .queue_declare(name.into(), passive, FieldTable::default())
                .await
                .map_err(|e| declare_failed(name, e))?;
            Ok(channel)
        }
        Err(e) => Err(declare_failed(name, e)),
    }
}

fn soft_error(e: &lapin::Error) -> Option<AMQPSoftError> {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

fn declare_failed(name: &str, e: lapin::Error) -> TransportError {
    TransportError::Unavailable(Cause::new(
        format!("rabbitmq: declaring queue {name}: {e}"),
        e,
    ))
}
