//! Dead letters by filter: counted, listed, and redriven through [`crate::dlq`]'s
//! publish-then-delete.

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
