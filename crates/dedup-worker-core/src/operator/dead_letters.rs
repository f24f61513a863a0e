//! Dead letters by filter: counted, listed, redriven through [`crate::dlq`]'s
//! publish-then-delete, or discarded (deleted for good, with a record).

use super::{record, Action, Actor, DeadLetterListing, Recorded, RowFilter};
use crate::dlq::{self, RedriveError};
use crate::queue::Transport;
use crate::store::{BulkRows, Store, StoreError};

/// How many dead letters `filter` selects: what [`redrive_dead_letters`] would publish now.
pub async fn count_dead_letters(store: &Store, filter: &RowFilter) -> Result<u64, StoreError> {
    store
        .bulk()
        .count_where(BulkRows::DeadLetters, filter)
        .await
}

/// Redrives what the filter selects (through [`crate::dlq`]'s publish-then-delete, in id order,
/// paging), each to its recorded queue or to `to_queue`; records one admin action with the
/// filter and the count redriven, also when it stops part-way; returns the count.
pub async fn redrive_dead_letters(
    store: &Store,
    transport: &dyn Transport,
    filter: &RowFilter,
    to_queue: Option<&str>,
    actor: &Actor,
) -> Result<u64, RedriveError> {
    let done = redrive_dead_letters_recorded(store, transport, filter, to_queue, actor).await?;
    Ok(done.count)
}

/// [`redrive_dead_letters`], with the id the action is recorded under.
pub async fn redrive_dead_letters_recorded(
    store: &Store,
    transport: &dyn Transport,
    filter: &RowFilter,
    to_queue: Option<&str>,
    actor: &Actor,
) -> Result<Recorded, RedriveError> {
    let result = dlq::redrive_where(store, transport, filter, to_queue).await;
    let redriven = match &result {
        Ok(n) => *n,
        Err(error) => error.redriven(),
    };
    let recorded = record(store, actor, Action::DlqRedrive, filter, redriven).await;
    match (result, recorded) {
        (Ok(count), Ok(action_id)) => Ok(Recorded { count, action_id }),
        (Ok(_), Err(source)) => Err(RedriveError::Record { redriven, source }),
        // The redrive's own failure is the one to report; the record's is only logged.
        (Err(error), Err(record_error)) => {
            tracing::warn!(error = %record_error, redriven, "recording a failed redrive failed");
            Err(error)
        }
        (Err(error), Ok(_)) => Err(error),
    }
}

/// Up to `limit` dead letters the filter selects, newest first, below `before_id`.
pub async fn list_dead_letters(
    store: &Store,
    filter: &RowFilter,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetterListing>, StoreError> {
    store
        .bulk()
        .list_dead_letters_where(filter, before_id, limit)
        .await
}

/// The dead letters a discard reads at a time.
const DISCARD_PAGE: i64 = 500;

/// A discard stopped part-way: what it discarded before the store failed is recorded.
#[derive(Debug, thiserror::Error)]
#[error("discarding dead letters failed after {discarded} were discarded")]
pub struct DiscardError {
    /// Discarded (and recorded) before the failure.
    pub discarded: u64,
    #[source]
    pub source: StoreError,
}

/// Discards what the filter selects: each dead letter deleted for good with a record of what it
/// was and who discarded it (`dead_letter_redrives`, outcome `discarded`), counted in the
/// minute's `discarded`; in id order, paging, nothing newer than the newest when it began.
/// Records one admin action (`dlq_discard`) with the filter and the count, also when it stops
/// part-way. Nothing is published: the dry run is [`count_dead_letters`].
pub async fn discard_dead_letters(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<Recorded, DiscardError> {
    let result = discard_where(store, filter, actor).await;
    let discarded = match &result {
        Ok(n) => *n,
        Err(error) => error.discarded,
    };
    let recorded = record(store, actor, Action::DlqDiscard, filter, discarded).await;
    match (result, recorded) {
        (Ok(count), Ok(action_id)) => Ok(Recorded { count, action_id }),
        (Ok(_), Err(source)) => Err(DiscardError { discarded, source }),
        // The discard's own failure is the one to report; the record's is only logged.
        (Err(error), Err(record_error)) => {
            tracing::warn!(error = %record_error, discarded, "recording a failed discard failed");
            Err(error)
        }
        (Err(error), Ok(_)) => Err(error),
    }
}

async fn discard_where(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<u64, DiscardError> {
    let mut discarded = 0;
    let failed = |discarded| move |source| DiscardError { discarded, source };
    let through = store
        .bulk()
        .newest_id(BulkRows::DeadLetters)
        .await
        .map_err(failed(0))?;
    let mut after = 0;
    loop {
        let page = store
            .bulk()
            .dead_letters_where(filter, after, through, DISCARD_PAGE)
            .await
            .map_err(failed(discarded))?;
        let Some(last) = page.last() else {
            return Ok(discarded);
        };
        after = last.id;
        for dead in page {
            // 0: another operator's discard or redrive took it meanwhile; counted by that one.
            discarded += store
                .dead_letters()
                .discard(dead.id, &actor.0)
                .await
                .map_err(failed(discarded))?;
        }
    }
}
