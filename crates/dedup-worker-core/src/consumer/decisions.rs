//! Stages 5 and 6 of the pipeline: what becomes of each of the batch's deliveries, and the rows
//! the batch writes for it.
//!
//! Every delivery ends one of four ways, and [`Decisions`] is where each is recorded as it is
//! decided: a **duplicate** (another delivery of an event this batch or an earlier one has:
//! acked without running the handler, and recorded with the batch for `events show`),
//! **handled** (acked, its outbox rows written with the batch), a **retry** (given back to the
//! transport after a backoff) or a **dead letter** (listed in the store, then acked). What the
//! transaction writes besides the handlers' own rows, and what the settlement then tells the
//! transport, follow from it.

use std::time::Duration;

use super::claim::Received;
use super::dead_letter::DeadLetters;
use super::decode::DecodeError;
use super::full_event::Unfetched;
use super::handling::{Handled, Verdict};
use super::settle::Settlement;
use super::{ConsumerOptions, HandlerError, StepOutcome};
use crate::event::search_keys::SearchPointers;
use crate::event::Event;
use crate::outbox::OutboxPlan;
use crate::queue::{Delivery, DeliveryTag};
use crate::retry::backoff_delay;
use crate::store::bodies::NewEventBody;
use crate::store::{Counts, NewDeadLetter, NewOutboxRow, Series, Shard, StoreError, StoreTx};

/// A new event that failed (its handler, or fetching its full event), with why.
pub(super) type Failed<'e, 'd> = (&'e Event, &'d Delivery, HandlerError);

/// What a batch's deliveries came to, gathered while its transaction runs.
pub(super) struct Decisions<'d> {
    /// The counts the step reports and the metrics add up.
    outcome: StepOutcome,
    /// Deliveries to ack once the transaction commits.
    ack: Vec<DeliveryTag>,
    /// Deliveries to give back, each after its backoff, once the transaction commits.
    retries: Vec<(&'d Delivery, Duration)>,
    /// The key of each delivery acked as a duplicate, written with the batch.
    /// Each duplicate's source, id and type (the type lets the console list duplicates by
    /// type without looking up their events).
    duplicates: Vec<(String, String, String)>,
    /// What the handlers returned, written with the batch.
    outbox_rows: Vec<NewOutboxRow>,
    /// The events given up on, each listed once, written with the batch (all their locks in
    /// one order: see [`StoreTx::insert_dead_letters_once`]).
    dead_letters: Vec<NewDeadLetter>,
    /// The messages that are not events, each listed as it came, written with the batch.
    undecodable: Vec<NewDeadLetter>,
    /// How many of the handled events the stale-event guard held back (counted apart).
    stale: usize,
    /// Where the kept bodies' search keys are; `None`: bodies are not kept.
    keep_bodies: Option<SearchPointers>,
    /// The bodies of the fresh events handled or held back as stale (never of duplicates, so
    /// each event's once), compressed here, before the closing write.
    bodies: Vec<NewEventBody>,
}

impl<'d> Decisions<'d> {
    pub(super) fn new(received: usize, keep_bodies: Option<SearchPointers>) -> Self {
        Decisions {
            outcome: StepOutcome {
                received,
                ..StepOutcome::default()
            },
            ack: Vec::with_capacity(received),
            retries: Vec::new(),
            duplicates: Vec::new(),
            outbox_rows: Vec::new(),
            dead_letters: Vec::new(),
            undecodable: Vec::new(),
            stale: 0,
            keep_bodies,
            bodies: Vec::new(),
        }
    }

    /// Other deliveries of events already in this batch or recorded before: acked, their
    /// handler not run.
    pub(super) fn duplicates<'e>(
        &mut self,
        found: impl IntoIterator<Item = &'e (Event, &'e Delivery)>,
    ) {
        for (event, delivery) in found {
            self.outcome.duplicates += 1;
            self.ack.push(delivery.tag.clone());
            self.duplicates.push((
                event.source.clone(),
                event.id.clone(),
                event.event_type.clone(),
            ));
        }
    }

    /// The new events whose handler succeeded: acked, their messages written to the outbox
    /// with the `traceparent` of the span each ran in. Returns those whose handler failed.
    pub(super) fn handled<'e>(
        &mut self,
        verdicts: Vec<(Received<'e, 'd>, Verdict)>,
        plan: &OutboxPlan,
    ) -> Vec<Failed<'e, 'd>> {
        let mut failed = Vec::new();
        for ((event, delivery), verdict) in verdicts {
            let handled = match verdict {
                Verdict::Handled(handled) => handled,
                Verdict::Failed(error) => {
                    failed.push((event, *delivery, error));
                    continue;
                }
            };
            self.outcome.handled += 1;
            self.ack.push(delivery.tag.clone());
            if let Some(pointers) = &self.keep_bodies {
                let body = NewEventBody::of(event, delivery.enqueued_at, pointers);
                self.bodies.push(body);
            }
            let Handled {
                messages,
                traceparent,
                stale,
            } = handled;
            self.stale += usize::from(stale);
            plan.rows(
                event,
                messages,
                traceparent.as_deref(),
                &mut self.outbox_rows,
            );
        }
        failed
    }

    /// The new events that failed (their handler, or fetching their full event), each
    /// dead-lettered when the failure is fatal or its attempts are spent, else retried after a
    /// backoff.
    pub(super) fn failed(
        &mut self,
        failed: &[Failed<'_, 'd>],
        unfetched: &[Unfetched<'d>],
        options: &ConsumerOptions,
        rows: &DeadLetters,
    ) {
        let failed = failed.iter().map(|(e, d, error)| (*e, *d, error));
        let unfetched = unfetched.iter().map(|(e, d, error)| (e, *d, error));
        for (event, delivery, error) in failed.chain(unfetched) {
            let exhausted = delivery.attempts >= options.max_attempts;
            if matches!(error, HandlerError::Fatal(_)) || exhausted {
                tracing::warn!(source = %event.source, event_id = %event.id, event_type = %event.event_type, attempts = delivery.attempts, %error, "dead-lettering event");
                let row = rows.of_event(event, delivery, &error.to_string());
                self.dead_lettered_once(delivery, row);
            } else {
                let delay = match error {
                    HandlerError::RetryAfter { after, .. } => (*after).min(options.retry_max),
                    _ => backoff_delay(options.retry_base, options.retry_max, delivery.attempts),
                };
                tracing::info!(source = %event.source, event_id = %event.id, event_type = %event.event_type, attempts = delivery.attempts, %error, ?delay, "event failed; will retry");
                self.outcome.retried += 1;
                self.retries.push((delivery, delay));
            }
        }
    }

    /// The new events whose transport gave up on their delivery (their claims given back at
    /// stage 3): dead-lettered without running their handler.
    pub(super) fn given_up(&mut self, given_up: &[Received<'_, 'd>], rows: &DeadLetters) {
        for (event, delivery) in given_up {
            let reason = delivery.give_up.as_deref().unwrap_or_default();
            tracing::warn!(source = %event.source, event_id = %event.id, event_type = %event.event_type, %reason, "dead-lettering event");
            self.dead_lettered_once(delivery, rows.of_event(event, delivery, reason));
        }
    }

    /// The messages that are not events: dead-lettered with the reason, and acked.
    pub(super) fn undecodable(
        &mut self,
        undecodable: &[(&'d Delivery, DecodeError)],
        rows: &DeadLetters,
    ) {
        for (delivery, reason) in undecodable {
            let reason = reason.to_string();
            tracing::warn!(%reason, "dead-lettering undecodable message");
            self.undecodable
                .push(rows.of_undecodable(delivery, &reason));
            self.dead_lettered(delivery);
        }
    }

    /// Listed in the dead letters by this transaction: acked.
    fn dead_lettered(&mut self, delivery: &Delivery) {
        self.outcome.dead_lettered += 1;
        self.ack.push(delivery.tag.clone());
    }

    /// An event given up on: listed once (unless a dead letter of it is there already) when
    /// the batch is written, and acked.
    fn dead_lettered_once(&mut self, delivery: &Delivery, row: NewDeadLetter) {
        self.dead_letters.push(row);
        self.dead_lettered(delivery);
    }

    /// Stage 6: the batch's own rows, in the transaction: the dead letters, the record of its
    /// duplicates, the outbox rows, and last the minute's counts under the worker's `shard`.
    pub(super) async fn write(&self, tx: &mut StoreTx, shard: Shard) -> Result<(), StoreError> {
        // Once per event: moving the same message again (a crash before its ack, SQS handing
        // it to two receivers) adds nothing to list or redrive.
        tx.insert_dead_letters_once(&self.dead_letters).await?;
        for row in &self.undecodable {
            tx.insert_dead_letter(row).await?;
        }
        // Append-only (no key of its own): it never waits for another batch.
        let duplicates: Vec<(&str, &str, &str)> = self
            .duplicates
            .iter()
            .map(|(source, id, event_type)| (source.as_str(), id.as_str(), event_type.as_str()))
            .collect();
        tx.record_duplicates(&duplicates).await?;
        tx.insert_event_bodies(&self.bodies).await?;
        tx.insert_outbox(&self.outbox_rows).await?;
        // Last: its counter rows stay locked for the commit only.
        tx.add_counts(&self.counts(), shard).await
    }

    /// What the batch adds to its minute's counts (`activity_minutes`): committed with the
    /// batch or not at all, so a redelivered batch counts once. Dead letters count as the
    /// `dead_lettered` of the step's outcome does: each delivery moved.
    fn counts(&self) -> Counts {
        let outcome = &self.outcome;
        let mut counts = Counts::default();
        counts
            .add(Series::Handled, outcome.handled.saturating_sub(self.stale))
            .add(Series::Stale, self.stale)
            .add(Series::Duplicates, outcome.duplicates)
            .add(Series::DeadLettered, outcome.dead_lettered)
            .add(Series::OutboxWritten, self.outbox_rows.len());
        counts
    }

    /// Whether the batch wrote outbox rows (the relay is woken once it commits).
    pub(super) fn wrote_outbox_rows(&self) -> bool {
        !self.outbox_rows.is_empty()
    }

    /// What is left to tell the transport once the transaction committed.
    pub(super) fn into_settlement(self) -> Settlement<'d> {
        Settlement {
            outcome: self.outcome,
            ack: self.ack,
            retries: self.retries,
            failure: None,
        }
    }
}
