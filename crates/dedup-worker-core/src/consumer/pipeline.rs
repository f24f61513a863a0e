//! What a batch does, in order: the consumer's pipeline.
//!
//! [`Consumer::try_step`] (and the run loop, `run.rs`) receives a batch from the transport
//! ([`Transport::receive`](crate::queue::Transport::receive)) and hands it to [`process`]. Its
//! stages are the calls of [`process`] and [`transact`] below, each detailed in a file of its
//! own, met once, in this order:
//!
//! 1. **decode** (`decode.rs`): each delivery becomes an event keyed `(source, event id)`, or the
//!    reason it cannot; a second delivery of a key already in the batch is a duplicate;
//! 2. **fetch full events** (`full_event.rs`, with `stripe.fetch_thin_events`): a new thin event
//!    is replaced by its full event, before the transaction opens;
//! 3. **claim ids** (`claim.rs`): in ONE database transaction, every key recorded with
//!    `INSERT … ON CONFLICT DO NOTHING`; a key already there is a duplicate;
//! 4. **run handlers** (`handling.rs`): the [`Handler`](super::Handler) for each new event, in
//!    the transaction;
//! 5. **decide** (`decisions.rs`): each delivery a duplicate, handled, retried or dead-lettered
//!    (the dead letter rows: `dead_letter.rs`);
//! 6. **write** (`decisions.rs`): the dead letters, the record of the duplicates, the
//!    handlers' outbox rows and, last, the minute's counts (`activity_minutes`), in the
//!    transaction;
//! 7. **commit**;
//! 8. **settle** (`settle.rs`): only after the commit, the acks and the delayed redeliveries.
//!    From the first stage to the commit a heartbeat extends the deliveries' leases
//!    (`settle.rs` too); the whole step is bounded by `consumer.step_timeout`.
//!
//! So:
//! * an event is marked processed only together with its handler's effects: a crash before
//!   commit leaves nothing, and the redelivery runs the handler;
//! * a duplicate (in the same batch, a later batch or another worker's) finds the row and is
//!   acked without running the handler;
//! * a failing event never blocks its batch: it is rolled back to its savepoint, its dedup row
//!   removed, and it is retried with backoff or dead-lettered;
//! * a delivery its transport gave up on ([`Delivery::give_up`]: over `transport.delivery_limit`,
//!   or parked by the broker) is dead-lettered without running its handler, once per event,
//!   unless its event was handled already;
//! * a message that cannot become an event (not JSON, no id, an id the store cannot hold: see
//!   [`decode`](super::decode)) is dead-lettered with the reason and acked, never retried;
//! * with `stripe.fetch_thin_events`, a new thin event is replaced by its full event before the
//!   transaction opens (`full_event.rs`); a fetch that fails is that event's failure, retried
//!   with backoff like a handler's, never the batch's;
//! * no shared fate: if the database refuses the batch's transaction for one row's data (a
//!   handler's outbox message with a NUL, say), the batch is processed again one delivery at a
//!   time, and the delivery that is refused on its own is dead-lettered with the database's
//!   reason ([`commit`]). Any other failure (connection lost, deadlock) leaves the whole batch
//!   unacked, to come back.
//!
//! The loop ([`Consumer::run`], in `run.rs`) repeats the step until shutdown, and heals what a
//! failed step leaves: it gives the batch back to the transport at once, backs off, and waits
//! for the store to answer before it receives again.

use std::time::Instant;

use super::claim::{claim_ids, Claimed};
use super::dead_letter::DeadLetters;
use super::decisions::Decisions;
use super::decode::{decode_batch, Decoded};
use super::full_event::{fetch_full_events, Fetched};
use super::handling::{Handling, Ran};
use super::settle::{hold_leases, settle, Settlement};
use super::{Consumer, ConsumerError, StepOutcome};
use crate::queue::Delivery;

/// Processes one received batch: commits its outcome while a heartbeat keeps its leases, then
/// acks and schedules its retries. The heartbeat stops before the acks and retries: an
/// extension landing after a retry would overwrite the retry's backoff.
pub(super) async fn process(
    consumer: &Consumer,
    deliveries: &[Delivery],
) -> Result<StepOutcome, ConsumerError> {
    if deliveries.is_empty() {
        return Ok(StepOutcome::default());
    }
    consumer.handed.clear();
    let limit = consumer.options.step_timeout;
    let step = async {
        let committed = commit(consumer, deliveries);
        let lease = consumer.options.lease;
        let settlement = hold_leases(&consumer.transport, lease, deliveries, committed).await?;
        settle(consumer.transport.as_ref(), settlement).await
    };
    tokio::time::timeout(limit, step)
        .await
        .unwrap_or(Err(ConsumerError::TimedOut(limit)))
}

/// Commits a batch's outcome ([`transact`]); if the database refuses it for one row's data,
/// commits it again one delivery at a time, dead-lettering the delivery that is refused alone.
async fn commit<'d>(
    consumer: &Consumer,
    deliveries: &'d [Delivery],
) -> Result<Settlement<'d>, ConsumerError> {
    match transact(consumer, deliveries).await {
        Err(ConsumerError::Store(error))
            if deliveries.len() > 1 && error.refused_for_its_data() =>
        {
            tracing::warn!(%error, count = deliveries.len(), "the database refused a batch for one row's data; processing it one delivery at a time");
            commit_one_by_one(consumer, deliveries).await
        }
        Err(ConsumerError::Store(error)) if error.refused_for_its_data() => {
            let store = &consumer.store;
            dead_letters(consumer)
                .refused(store, deliveries, &error)
                .await
        }
        result => result,
    }
}

/// The batch again, each delivery in a transaction of its own. Stops at the first failure
/// that is not about a row's data: what committed before it is settled, the rest given back.
async fn commit_one_by_one<'d>(
    consumer: &Consumer,
    deliveries: &'d [Delivery],
) -> Result<Settlement<'d>, ConsumerError> {
    let mut settlement = Settlement::default();
    for delivery in deliveries {
        let alone = std::slice::from_ref(delivery);
        let committed = match transact(consumer, alone).await {
            Err(ConsumerError::Store(error)) if error.refused_for_its_data() => {
                let store = &consumer.store;
                dead_letters(consumer).refused(store, alone, &error).await
            }
            result => result,
        };
        match committed {
            Ok(committed) => settlement += committed,
            Err(error) if settlement.outcome.received == 0 => return Err(error),
            Err(error) => {
                settlement.failure = Some(error);
                break;
            }
        }
    }
    Ok(settlement)
}

/// Stages 1 to 7: the deliveries in one transaction, from decoding to the commit. Acks and
/// retries are left to [`settle`].
async fn transact<'d>(
    consumer: &Consumer,
    deliveries: &'d [Delivery],
) -> Result<Settlement<'d>, ConsumerError> {
    if deliveries.is_empty() {
        return Ok(Settlement::default());
    }
    let Consumer { store, options, .. } = consumer;
    let started = Instant::now();
    let mut batch = Decisions::new(deliveries.len(), consumer.kept_bodies.clone());

    // 1. Decode.
    let Decoded {
        events,
        repeated,
        undecodable,
    } = decode_batch(deliveries, options);
    batch.duplicates(&repeated);

    // 2. Thin events' full events, before the transaction opens (no lock held while Stripe
    // answers); an event whose fetch failed is not recorded, and fails as a handler would.
    let full_events = consumer.full_events.as_ref();
    let Fetched { events, unfetched } =
        fetch_full_events(full_events, store, options.step_timeout, events).await?;

    // 3. Claim ids.
    let mut tx = store.begin().await?;
    let Claimed {
        fresh,
        seen,
        given_up,
    } = claim_ids(&mut tx, events.iter().collect()).await?;
    batch.duplicates(seen);

    // 4. Run handlers (in a new transaction if one failed: see `handling.rs`).
    let handling = Handling {
        handler: consumer.handler.as_ref(),
        stale_guard: consumer.stale_guard.as_ref(),
        handed: &consumer.handed,
    };
    let Ran {
        mut tx,
        taken,
        verdicts,
    } = handling.run_handlers(store, tx, fresh).await?;
    batch.duplicates(taken);

    // 5. Decide what becomes of the rest (the duplicates were decided as they were found).
    let dead_letters = dead_letters(consumer);
    let failed = batch.handled(verdicts, &options.outbox_plan);
    batch.failed(&failed, &unfetched, options, &dead_letters);
    batch.given_up(&given_up, &dead_letters);
    batch.undecodable(&undecodable, &dead_letters);

    // 6. Write the dead letters, the duplicates' record, the outbox rows and the counts.
    batch.write(&mut tx, consumer.shard).await?;

    // 7. Commit.
    tx.commit().await?;
    if batch.wrote_outbox_rows() {
        consumer.wakeups.outbox.notify_waiters();
    }
    metrics::histogram!("dedup_consumer_batch_seconds").record(started.elapsed().as_secs_f64());
    Ok(batch.into_settlement())
}

/// What the consumer's dead letters are made with: its queue's name and its options.
fn dead_letters(consumer: &Consumer) -> DeadLetters<'_> {
    DeadLetters::new(consumer.transport.queue_name(), &consumer.options)
}
