//! The dedup record of a batch: `INSERT … ON CONFLICT DO NOTHING` of every event's key, in the
//! batch transaction, so "seen" and "handled" commit together. What the insert reports as new
//! is handled; the rest are duplicates, acked without running the handler.

use std::collections::{BTreeMap, HashSet};

use crate::event::Event;
use crate::queue::Delivery;
use crate::store::{StoreError, StoreTx};

/// Records the dedup keys of `events` in `tx`, one statement per source in the batch; splits
/// them into those recorded now (to handle) and those already there (duplicates).
pub(super) type Received<'e, 'd> = &'e (Event, &'d Delivery);

pub(super) async fn record_new<'e, 'd>(
    tx: &mut StoreTx,
    events: Vec<Received<'e, 'd>>,
) -> Result<(Vec<Received<'e, 'd>>, Vec<Received<'e, 'd>>), StoreError> {
    // Keys are inserted in one global order, (source, id), whatever order the transport
    // delivered them in: two workers whose batches share ids then wait for each other in that
    // order, and never form the cycle PostgreSQL reports as `deadlock detected`.
    let mut by_source: BTreeMap<&str, Vec<(String, String)>> = BTreeMap::new();
    for (event, _) in &events {
        by_source
            .entry(event.source.as_str())
            .or_default()
            .push((event.id.clone(), event.event_type.clone()));
    }
    for pairs in by_source.values_mut() {
        pairs.sort_unstable();
    }
    let mut new: HashSet<(String, String)> = HashSet::new();
    for (source, pairs) in by_source {
        for id in tx.insert_processed(source, &pairs).await? {
            new.insert((source.to_owned(), id));
        }
    }
    Ok(events
        .into_iter()
        .partition(|(e, _)| new.contains(&(e.source.clone(), e.id.clone()))))
}
