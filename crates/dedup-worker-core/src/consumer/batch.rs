//! One batch in its transaction, and what becomes of each of its deliveries.
//!
//! Every delivery ends one of four ways, and [`Decisions`] is where each is recorded as it is
//! decided: a **duplicate** (another delivery of an event this batch or an earlier one has:
//! acked without running the handler, and recorded with the batch for `events show`),
//! **handled** (acked, its outbox rows written with the batch), a **retry** (given back to the
//! transport after a backoff) or a **dead letter** (listed in the store, then acked). What the
//! transaction writes besides the handlers' own rows, and what the settlement then tells the
//! transport, follow from it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::decode::{decode_delivery, DecodeError};
use super::record::{record_new, Received};
use super::settle::Settlement;
use super::{Consumer, ConsumerError, Handled, HandlerError, StepOutcome, Verdict};
use crate::event::Event;
use crate::queue::{Delivery, DeliveryTag};
use crate::retry::backoff_delay;
use crate::store::{NewDeadLetter, NewOutboxRow, StoreError, StoreTx};

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
}

impl<'d> Decisions<'d> {
    fn new(received: usize) -> Self {
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
        }
    }

    /// Another delivery of an event already in this batch or recorded before: acked, its
    /// handler not run.
    fn duplicate(&mut self, event: &Event, delivery: &Delivery) {
        self.outcome.duplicates += 1;
        self.ack.push(delivery.tag.clone());
        self.duplicates.push((
            event.source.clone(),
            event.id.clone(),
            event.event_type.clone(),
        ));
    }

    /// A new event whose handler succeeded: acked, its messages written to the outbox with the
    /// `traceparent` of the span it ran in.
    fn handled(&mut self, event: &Event, delivery: &Delivery, handled: Handled) {
        self.outcome.handled += 1;
        self.ack.push(delivery.tag.clone());
        let Handled {
            messages,
            traceparent,
        } = handled;
        self.outbox_rows
            .extend(messages.into_iter().map(|m| NewOutboxRow {
                source: event.source.clone(),
                event_id: event.id.clone(),
                destination: m.destination,
                idempotency_key: m.idempotency_key,
                event_type: m.event_type,
                payload: m.payload.to_vec(),
                traceparent: traceparent.clone(),
            }));
    }

    /// A failure that may pass: the delivery comes back after `delay`.
    fn retry(&mut self, delivery: &'d Delivery, delay: Duration) {
        self.outcome.retried += 1;
        self.retries.push((delivery, delay));
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

    /// The batch's own rows: the record of its duplicates, and the outbox rows.
    async fn write(&self, tx: &mut StoreTx) -> Result<(), StoreError> {
        // Append-only (no key of its own): it never waits for another batch.
        let duplicates: Vec<(&str, &str, &str)> = self
            .duplicates
            .iter()
            .map(|(source, id, event_type)| (source.as_str(), id.as_str(), event_type.as_str()))
            .collect();
        tx.record_duplicates(&duplicates).await?;
        tx.insert_outbox(&self.outbox_rows).await
    }

    /// What is left to tell the transport once the transaction committed.
    fn into_settlement(self) -> Settlement<'d> {
        Settlement {
            outcome: self.outcome,
            ack: self.ack,
            retries: self.retries,
            failure: None,
        }
    }
}

impl Consumer {
    /// Commits one received batch: dedup, handlers, outbox, dead letters. Acks and retries are
    /// left to [`Self::settle`].
    pub(super) async fn commit_batch<'d>(
        &self,
        deliveries: &'d [Delivery],
    ) -> Result<Settlement<'d>, ConsumerError> {
        if deliveries.is_empty() {
            return Ok(Settlement::default());
        }
        let started = Instant::now();
        let mut batch = Decisions::new(deliveries.len());
        let (events, undecodable) = self.decode_batch(deliveries, &mut batch);
        // Thin events' full events, before the transaction opens (no lock held while Stripe
        // answers); an event whose fetch failed is not recorded, and fails as a handler would.
        let mut unfetched = Vec::new();
        let events: Vec<(Event, &'d Delivery)> = self
            .fetch_full_events(events)
            .await?
            .into_iter()
            .filter_map(|(event, delivery, fetched)| match fetched {
                Ok(()) => Some((event, delivery)),
                Err(error) => {
                    unfetched.push((event, delivery, error));
                    None
                }
            })
            .collect();

        let mut tx = self.store.begin().await?;
        let (fresh, seen) = record_new(&mut tx, events.iter().collect()).await?;
        for (event, delivery) in seen {
            batch.duplicate(event, delivery);
        }
        // New events the transport gave up on (over the delivery limit) are dead-lettered
        // without running their handler: a message that keeps killing its consumer must stop
        // somewhere. They are not processed, so their dedup rows go again; handled ones were
        // acked above as duplicates, with nothing left to do.
        let (given_up, fresh): (Vec<_>, Vec<_>) =
            fresh.into_iter().partition(|(_, d)| d.give_up.is_some());
        for (event, _) in &given_up {
            tx.delete_processed(&event.source, &event.id).await?;
        }

        let (mut tx, handled) = self.run_handlers(tx, fresh, &mut batch).await?;
        let mut failed = Vec::new();
        for ((event, delivery), verdict) in handled {
            match verdict {
                Verdict::Handled(handled) => batch.handled(event, delivery, handled),
                Verdict::Failed(error) => failed.push((event, *delivery, error)),
            }
        }
        let failed = failed.iter().map(|(e, d, error)| (*e, *d, error));
        let unfetched = unfetched.iter().map(|(e, d, error)| (e, *d, error));
        for (event, delivery, error) in failed.chain(unfetched) {
            self.failed(&mut batch, event, delivery, error);
        }
        for (event, delivery) in &given_up {
            let reason = delivery.give_up.as_deref().unwrap_or_default();
            tracing::warn!(source = %event.source, event_id = %event.id, event_type = %event.event_type, %reason, "dead-lettering event");
            batch.dead_lettered_once(delivery, self.dead_letter(event, delivery, reason));
        }
        // Once per event: moving the same message again (a crash before its ack, SQS handing
        // it to two receivers) adds nothing to list or redrive.
        tx.insert_dead_letters_once(&batch.dead_letters).await?;
        for (delivery, reason) in &undecodable {
            let reason = reason.to_string();
            tracing::warn!(%reason, "dead-lettering undecodable message");
            tx.insert_dead_letter(&self.undecodable_dead_letter(delivery, &reason))
                .await?;
            batch.dead_lettered(delivery);
        }
        batch.write(&mut tx).await?;
        tx.commit().await?;
        if !batch.outbox_rows.is_empty() {
            self.wakeups.outbox.notify_waiters();
        }
        metrics::histogram!("dedup_consumer_batch_seconds").record(started.elapsed().as_secs_f64());
        Ok(batch.into_settlement())
    }

    /// The batch's events, one per dedup key (another delivery of a key already taken is a
    /// duplicate), and the deliveries that are not events, with the reason.
    #[allow(clippy::type_complexity)]
    fn decode_batch<'d>(
        &self,
        deliveries: &'d [Delivery],
        batch: &mut Decisions<'d>,
    ) -> (Vec<(Event, &'d Delivery)>, Vec<(&'d Delivery, DecodeError)>) {
        let mut events = Vec::new();
        let mut undecodable = Vec::new();
        let mut keys_in_batch: HashSet<(String, String)> = HashSet::new();
        for delivery in deliveries {
            match decode_delivery(delivery, &self.options) {
                Ok(event) => {
                    if keys_in_batch.insert((event.source.clone(), event.id.clone())) {
                        events.push((event, delivery));
                    } else {
                        batch.duplicate(&event, delivery);
                    }
                }
                Err(reason) => undecodable.push((delivery, reason)),
            }
        }
        (events, undecodable)
    }

    /// Runs the handlers of the new events, each paired with its verdict.
    ///
    /// Optimistic pass: all handlers in the transaction with no savepoints (no extra round
    /// trips). If any fails, start over with a savepoint per event so only that one is undone.
    /// A handler can therefore run more than once for one delivery; only its writes through
    /// `tx` and the messages it returns take effect, and those commit exactly once (the same
    /// holds when a commit fails and the batch is redelivered). Starting over takes a new
    /// transaction, returned with the verdicts.
    async fn run_handlers<'e, 'd>(
        &self,
        mut tx: StoreTx,
        fresh: Vec<Received<'e, 'd>>,
        batch: &mut Decisions<'d>,
    ) -> Result<(StoreTx, Vec<(Received<'e, 'd>, Verdict)>), ConsumerError> {
        self.lock_objects(&mut tx, &fresh).await?;
        let mut verdicts = Vec::with_capacity(fresh.len());
        for (event, delivery) in &fresh {
            match self.run_handler(event, delivery, &mut tx).await {
                Ok(handled) => verdicts.push(Verdict::Handled(handled)),
                Err(_) => break,
            }
        }
        if verdicts.len() == fresh.len() {
            return Ok((tx, fresh.into_iter().zip(verdicts).collect()));
        }
        tx.rollback().await?;
        let mut tx = self.store.begin().await?;
        // Another worker may have committed some of these meanwhile: ask again.
        let (still_new, taken) = record_new(&mut tx, fresh).await?;
        for (event, delivery) in taken {
            batch.duplicate(event, delivery);
        }
        self.lock_objects(&mut tx, &still_new).await?;
        let verdicts = self.handle_with_savepoints(&mut tx, &still_new).await?;
        Ok((tx, still_new.into_iter().zip(verdicts).collect()))
    }

    /// A new event that failed (its handler, or fetching its full event): dead-lettered when
    /// the failure is fatal or its attempts are spent, else retried after a backoff.
    fn failed<'d>(
        &self,
        batch: &mut Decisions<'d>,
        event: &Event,
        delivery: &'d Delivery,
        error: &HandlerError,
    ) {
        let exhausted = delivery.attempts >= self.options.max_attempts;
        if matches!(error, HandlerError::Fatal(_)) || exhausted {
            tracing::warn!(source = %event.source, event_id = %event.id, event_type = %event.event_type, attempts = delivery.attempts, %error, "dead-lettering event");
            let row = self.dead_letter(event, delivery, &error.to_string());
            batch.dead_lettered_once(delivery, row);
        } else {
            let delay = match error {
                HandlerError::RetryAfter { after, .. } => (*after).min(self.options.retry_max),
                _ => backoff_delay(
                    self.options.retry_base,
                    self.options.retry_max,
                    delivery.attempts,
                ),
            };
            tracing::info!(source = %event.source, event_id = %event.id, event_type = %event.event_type, attempts = delivery.attempts, %error, ?delay, "event failed; will retry");
            batch.retry(delivery, delay);
        }
    }
}
