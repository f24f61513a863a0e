//! The dead letter rows the consumer writes: what is kept of a delivery it gives up on (stage 5
//! of the pipeline decides which), and the deliveries the database refused on their own.

use super::decode::decode_delivery;
use super::settle::Settlement;
use super::{ConsumerError, ConsumerOptions, StepOutcome};
use crate::event::{check_event_field, printable, Event, EventField};
use crate::queue::Delivery;
use crate::store::{Counts, NewDeadLetter, Series, Shard, Store, StoreError};

/// Longest text kept in a dead letter's error (a handler's message may be anything).
const MAX_DEAD_LETTER_ERROR_CHARS: usize = 4096;

/// Makes the consumer's dead letter rows: each names the queue it was taken from, and an
/// undecodable message without a source of its own gets the consumer's.
pub(super) struct DeadLetters<'c> {
    queue: &'c str,
    options: &'c ConsumerOptions,
}

impl<'c> DeadLetters<'c> {
    pub(super) fn new(queue: &'c str, options: &'c ConsumerOptions) -> Self {
        DeadLetters { queue, options }
    }

    /// The dead letter of an event the consumer gives up on (its handler failed, or its
    /// transport gave up on the delivery): its fields passed [`decode_delivery`], so they are
    /// stored as they are (a redrive dedups on them); only the error, which a handler may fill
    /// with anything, is made printable.
    pub(super) fn of_event(
        &self,
        event: &Event,
        delivery: &Delivery,
        error: &str,
    ) -> NewDeadLetter {
        NewDeadLetter {
            source: event.source.clone(),
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            queue: self.queue.to_owned(),
            payload: delivery.payload.to_vec(),
            error: printable(error, MAX_DEAD_LETTER_ERROR_CHARS).into_owned(),
            attempts: i32::try_from(delivery.attempts).unwrap_or(i32::MAX),
        }
    }

    /// The dead letter of a message that is not an event: its payload kept byte for byte, its
    /// transport properties kept only where storable. A refused id is not stored (the reason
    /// describes it): stored escaped, a redrive would dedup on an id nobody sent; stored empty,
    /// a redrive decodes the payload again and meets the same reason.
    pub(super) fn of_undecodable(&self, delivery: &Delivery, reason: &str) -> NewDeadLetter {
        let storable = |field, value: &Option<String>| {
            value
                .as_deref()
                .filter(|v| check_event_field(field, v).is_ok())
                .unwrap_or_default()
                .to_owned()
        };
        NewDeadLetter {
            source: delivery
                .source
                .as_ref()
                .map(|_| storable(EventField::Source, &delivery.source))
                .unwrap_or_else(|| self.options.source.clone()),
            event_id: storable(EventField::Id, &delivery.message_id),
            event_type: storable(EventField::Type, &delivery.message_type),
            queue: self.queue.to_owned(),
            payload: delivery.payload.to_vec(),
            error: printable(reason, MAX_DEAD_LETTER_ERROR_CHARS).into_owned(),
            attempts: i32::try_from(delivery.attempts).unwrap_or(i32::MAX),
        }
    }

    /// Dead-letters deliveries whose own transaction the database refused for their data
    /// (with nothing else in it), to be acked: retrying could only fail again.
    pub(super) async fn refused<'d>(
        &self,
        store: &Store,
        deliveries: &'d [Delivery],
        error: &StoreError,
    ) -> Result<Settlement<'d>, ConsumerError> {
        let reason = format!("the database refused this event's data: {error}");
        // A decoded event's dead letter is written once per event and queue, as the batch's
        // are: the same refused event delivered again (a redelivery, a duplicate the ring could
        // not catch since it never committed) would otherwise be listed, and redriven, twice.
        // A message that is not an event has no id to tell its copies apart.
        let (mut events, mut others) = (Vec::new(), Vec::new());
        for delivery in deliveries {
            tracing::warn!(%reason, "dead-lettering a delivery the database refused");
            match decode_delivery(delivery, self.options) {
                Ok(event) => events.push(self.of_event(&event, delivery, &reason)),
                Err(_) => others.push(self.of_undecodable(delivery, &reason)),
            }
        }
        let mut tx = store.begin().await?;
        tx.insert_dead_letters_once(&events).await?;
        for row in &others {
            tx.insert_dead_letter(row).await?;
        }
        // Counted as the batch counts its dead letters (per delivery), in the same transaction;
        // a rare path, so a shard of its own rather than the worker's.
        tx.add_counts(
            &Counts::of(Series::DeadLettered, deliveries.len()),
            Shard::random(),
        )
        .await?;
        tx.commit().await?;
        Ok(Settlement {
            outcome: StepOutcome {
                received: deliveries.len(),
                dead_lettered: deliveries.len(),
                ..StepOutcome::default()
            },
            ack: deliveries.iter().map(|d| d.tag.clone()).collect(),
            ..Settlement::default()
        })
    }
}
