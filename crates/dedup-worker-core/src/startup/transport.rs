//! The configured transport, built from [`Settings`].

use std::sync::Arc;

use crate::config::{Settings, TransportKind};
use crate::queue::database::GroupCommit;
use crate::queue::rabbitmq::RabbitOptions;
use crate::queue::{DatabaseQueue, RabbitMqQueue, SqsQueue, Transport};
use crate::store::{Store, Wakeups};

/// The configured transport, as `serve` and `dlq redrive` use it: connections are made on first
/// use, so building it needs no broker.
pub async fn build_transport(
    settings: &Settings,
    store: &Store,
    wakeups: Arc<Wakeups>,
) -> Arc<dyn Transport> {
    match settings.transport.kind {
        TransportKind::Rabbitmq => Arc::new(RabbitMqQueue::new(
            settings.transport.amqp_url.expose().to_owned(),
            settings.transport.queue.clone(),
            RabbitOptions {
                // A full batch for every worker: with less, workers share the window and
                // each commits smaller batches (more transactions per event).
                prefetch: u16::try_from(
                    settings
                        .consumer
                        .batch_size
                        .saturating_mul(settings.consumer.workers.max(2)),
                )
                .unwrap_or(u16::MAX),
                delivery_limit: settings.transport.delivery_limit,
                retry_max: settings.consumer.retry_max,
            },
        )),
        TransportKind::Sqs => Arc::new(
            SqsQueue::from_env(
                settings.transport.queue.clone(),
                settings.consumer.lease,
                settings.transport.publish_timeout,
            )
            .await
            .with_long_poll(settings.transport.sqs_wait_time)
            .with_message_group_pointer(settings.transport.sqs_message_group_pointer.clone()),
        ),
        TransportKind::Database => {
            Arc::new(DatabaseQueue::start(
                store.clone(),
                settings.transport.queue.clone(),
                wakeups.clone(),
                GroupCommit {
                    max_batch: settings.transport.publish_batch_max,
                    // SQLite has one writer; more writer tasks would only wait on its lock.
                    writers: if store.single_writer() {
                        1
                    } else {
                        settings.transport.publish_writers
                    },
                    channel_capacity: settings.transport.publish_channel_capacity,
                    commit_timeout: settings.transport.publish_timeout,
                    lease: settings.consumer.lease,
                    statement_timeout: settings.database.statement_timeout,
                },
            ))
        }
    }
}
