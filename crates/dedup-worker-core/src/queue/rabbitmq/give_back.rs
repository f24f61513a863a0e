//! Giving back deliveries no handler saw, without counting them as deliveries.
//!
//! A quorum queue counts, in `x-delivery-count`, every delivery of a message that ended
//! unsettled: a requeue (`basic.nack`), and on RabbitMQ 3.x a delivery a closed channel hands
//! back too. The consumer gives back its whole batch when a step fails, and pauses (closes its
//! channel) while the store does not answer; with the prefetch at `batch_size × workers`, a
//! database that keeps failing would push up to a thousand valid events, never handled, over
//! `transport.delivery_limit` and into the dead letters. The limit exists for messages that
//! keep killing their consumer, which a message no handler saw cannot be.
//!
//! So a delivery given back unhandled is republished as a copy (confirmed) and then acked: the
//! copy carries the attempts so far (`x-dedup-attempts`, one fewer: this delivery was no
//! attempt) and the count of its original's unsettled deliveries (`x-dedup-returned`), which
//! the consumer adds to the copy's own `x-delivery-count`. A crash loop is still counted to its
//! end; a give-back is not. A crash between the copy's confirm and the ack delivers the event
//! twice, which the dedup record absorbs; the other order could lose it. If the copy cannot be
//! published (the broker is failing too), the delivery is requeued as before.

use futures::FutureExt;
use futures::StreamExt;
use lapin::options::BasicCancelOptions;

use super::{incoming, ConsumerSide, RabbitMqQueue, BROKER_ANSWER_TIMEOUT};
use crate::queue::{Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};

impl RabbitMqQueue {
    /// Republishes each of `deliveries` still unsettled on the current channel, then acks it
    /// (see the module docs); requeues the rest: deliveries the transport gave up on (they are
    /// dead letters to be, not events to handle), and any whose copy was not confirmed. Tags of
    /// an older channel are void: the broker took those back when it closed.
    pub(super) async fn give_back_copies(
        &self,
        deliveries: &[&Delivery],
    ) -> Result<(), TransportError> {
        let Some(side) = self.consumer.lock().await.clone() else {
            return Ok(());
        };
        let mut copies = Vec::new();
        let mut requeue = Vec::new();
        for delivery in deliveries {
            match unsettled_returned(&side, &delivery.tag) {
                None => {}
                Some(_) if delivery.give_up.is_some() => requeue.push(delivery.tag.clone()),
                Some(returned) => copies.push((*delivery, returned)),
            }
        }
        let published = futures::future::join_all(copies.iter().map(|(d, returned)| {
            let copy = OutgoingMessage {
                source: d.source.clone(),
                message_id: d.message_id.clone(),
                message_type: d.message_type.clone(),
                payload: d.payload.clone(),
                traceparent: d.traceparent.clone(),
                stripe_signature: d.stripe_signature.clone(),
                sender_headers: d.sender_headers.clone(),
            };
            let counts = (d.attempts.saturating_sub(1), *returned);
            async move {
                self.publish_to(&self.queue, &copy, counts, d.enqueued_at)
                    .await
            }
        }))
        .await;
        let mut copied = Vec::new();
        for ((delivery, _), result) in copies.iter().zip(published) {
            match result {
                Ok(()) => copied.push(delivery.tag.clone()),
                Err(_) => requeue.push(delivery.tag.clone()),
            }
        }
        let acked = self.ack(&copied).await;
        let requeued = self.release(&requeue).await;
        acked.and(requeued)
    }

    /// A give-back of `tags` did not go through: if any of them is still unsettled on the
    /// current channel, that channel is taken out of use at once (the next receive opens
    /// another) and closed in the background, where the broker hands back everything it held
    /// (counted once in `x-delivery-count`). Not waited for: the broker has just failed to
    /// answer. The close waits [`BROKER_ANSWER_TIMEOUT`] at most for each answer; unanswered,
    /// the side is dropped, and lapin closes it (a broker that hears nothing of it at all drops
    /// the connection when its heartbeats stop).
    pub(super) async fn close_side_holding(&self, tags: &[DeliveryTag]) {
        let side = {
            let mut slot = self.consumer.lock().await;
            let holds = slot.as_ref().is_some_and(|side| {
                tags.iter()
                    .any(|tag| unsettled_returned(side, tag).is_some())
            });
            if !holds {
                return;
            }
            slot.take()
        };
        if let Some(side) = side {
            tracing::warn!(
                generation = side.generation,
                "closing the consuming channel: deliveries it holds could not be given back"
            );
            tokio::spawn(async move { close_side(&side).await });
        }
    }

    /// Pauses receiving: cancels the consuming side's consumers and gives back what they had
    /// buffered, then closes that side (the next receive opens another). Closed is the side
    /// cancelled, even if another worker's receive dropped it from the slot meanwhile (its
    /// stream ends with the cancel).
    pub(super) async fn pause(&self) {
        let Some(side) = self.consumer.lock().await.clone() else {
            return;
        };
        self.give_back_buffered(&side).await;
        {
            let mut slot = self.consumer.lock().await;
            if slot.as_ref().map(|s| s.generation) == Some(side.generation) {
                *slot = None;
            }
        }
        close_side(&side).await;
    }

    /// Cancels both consumers of `side`, so the broker pushes nothing more, and gives back
    /// what they had buffered as unhandled (nobody received it).
    async fn give_back_buffered(&self, side: &ConsumerSide) {
        for tag in &side.consumer_tags {
            let cancel = side
                .channel
                .basic_cancel(tag.clone(), BasicCancelOptions::default());
            if !matches!(
                tokio::time::timeout(BROKER_ANSWER_TIMEOUT, cancel).await,
                Ok(Ok(()))
            ) {
                return; // the close gives everything back, counted
            }
        }
        // Every delivery sent before the cancel-ok is buffered by now; a receive in progress
        // holds the stream, and keeps what it takes.
        let mut buffered = Vec::new();
        {
            let mut stream = side.stream.lock().await;
            while let Some(Some(Ok(item))) = stream.next().now_or_never() {
                buffered.push(incoming::convert(side, self.options.delivery_limit, item));
            }
        }
        let buffered: Vec<&Delivery> = buffered.iter().collect();
        if let Err(error) = self.give_back_copies(&buffered).await {
            tracing::debug!(%error, "giving back buffered deliveries; the channel's close returns them");
        }
    }
}

/// Whether `tag` is a delivery of `side`'s channel not settled yet, and how many deliveries of
/// its message ended unsettled before it.
fn unsettled_returned(side: &ConsumerSide, tag: &DeliveryTag) -> Option<u32> {
    match tag {
        DeliveryTag::Amqp { generation, tag } if *generation == side.generation => {
            side.tags.lock().ok()?.unsettled_returned(*tag)
        }
        _ => None,
    }
}

/// Closes `side`'s channel, then its connection: what it delivered and nobody acked goes back
/// to the queue.
pub(super) async fn close_side(side: &ConsumerSide) {
    // The channel first: its CloseOk comes after the broker handled every frame sent before it
    // on the channel, so acks just issued take effect (a connection close may overtake frames
    // still buffered, and those deliveries would come back).
    let _ = tokio::time::timeout(
        BROKER_ANSWER_TIMEOUT,
        side.channel.close(200, "closing".into()),
    )
    .await;
    let _ = tokio::time::timeout(
        BROKER_ANSWER_TIMEOUT,
        side.connection.close(200, "closing".into()),
    )
    .await;
}
