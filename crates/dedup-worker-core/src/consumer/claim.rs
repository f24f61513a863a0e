//! Stage 3 of the pipeline, claiming the batch's ids: the dedup record's `INSERT … ON CONFLICT
//! DO NOTHING` of every event's key, in the batch transaction, so "seen" and "handled" commit
//! together. What the insert reports as new is handled; the rest are duplicates, acked without
//! running the handler.
//!
//! A new event whose delivery the transport gave up on (over the delivery limit) is not
//! handled but dead-lettered: a message that keeps killing its consumer must stop somewhere.
//! Its claim is given back at once; a handled one was a duplicate, with nothing left to do.
//!
//! Every generation is looked up for every event: nothing the message says of itself (a
//! signed `created` included, see `crate::store::dedup`) chooses where its id is looked up.

use std::collections::{BTreeMap, HashSet};

use crate::event::Event;
use crate::queue::Delivery;
use crate::store::{ProcessedEvent, StoreError, StoreTx};

/// A decoded event and the delivery it came in.
pub(super) type Received<'e, 'd> = &'e (Event, &'d Delivery);

/// The batch's events after the claim.
pub(super) struct Claimed<'e, 'd> {
    /// Claimed now: their handlers run.
    pub(super) fresh: Vec<Received<'e, 'd>>,
    /// Recorded before (by an earlier batch or another worker): duplicates.
    pub(super) seen: Vec<Received<'e, 'd>>,
    /// New, but their transport gave up on them: their claims given back, to be dead-lettered.
    pub(super) given_up: Vec<Received<'e, 'd>>,
}

/// Claims the ids of `events` in `tx` ([`record_new`]), then gives back the claims of the
/// deliveries the transport gave up on (see the module docs).
pub(super) async fn claim_ids<'e, 'd>(
    tx: &mut StoreTx,
    events: Vec<Received<'e, 'd>>,
) -> Result<Claimed<'e, 'd>, StoreError> {
    let (fresh, seen) = record_new(tx, events).await?;
    let (given_up, fresh): (Vec<_>, Vec<_>) =
        fresh.into_iter().partition(|(_, d)| d.give_up.is_some());
    for (event, _) in &given_up {
        tx.delete_processed(&event.source, &event.id).await?;
    }
    Ok(Claimed {
        fresh,
        seen,
        given_up,
    })
}

/// Records the dedup keys of `events` in `tx`, one statement per source in the batch; splits
/// them into those recorded now (to handle) and those already there (duplicates).
pub(super) async fn record_new<'e, 'd>(
    tx: &mut StoreTx,
    events: Vec<Received<'e, 'd>>,
) -> Result<(Vec<Received<'e, 'd>>, Vec<Received<'e, 'd>>), StoreError> {
    // Keys are inserted in one global order, (source, id), whatever order the transport
    // delivered them in: two workers whose batches share ids then wait for each other in that
    // order, and never form the cycle PostgreSQL reports as `deadlock detected`.
    let mut by_source: BTreeMap<&str, Vec<ProcessedEvent>> = BTreeMap::new();
    for (event, delivery) in &events {
        by_source
            .entry(event.source.as_str())
            .or_default()
            .push(ProcessedEvent {
                id: event.id.clone(),
                event_type: event.event_type.clone(),
                // What `events show` reports of how it arrived.
                received_at: delivery.enqueued_at,
                delivery_attempt: i32::try_from(delivery.attempts).ok(),
                alias: event.alias.clone(),
            });
    }
    for pairs in by_source.values_mut() {
        pairs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    }
    let mut new: HashSet<(String, String)> = HashSet::new();
    for (source, pairs) in by_source {
        for id in tx.insert_processed_events(source, &pairs).await? {
            new.insert((source.to_owned(), id));
        }
    }
    Ok(events
        .into_iter()
        .partition(|(e, _)| new.contains(&(e.source.clone(), e.id.clone()))))
}
