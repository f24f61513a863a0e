//! Outbox rows by filter: failed deliveries counted, listed and retried; dispatched ones
//! counted and re-sent. Both put rows back to `pending` for the relay, which delivers them
//! under their original `idempotency_key`.

use super::{record, Action, Actor, DeliveryListing, Recorded, RowFilter};
use crate::store::{BulkRows, Store, StoreError};

/// How many failed deliveries (status `failed`, time `created_at`) `filter` selects.
pub async fn count_failed_deliveries(store: &Store, filter: &RowFilter) -> Result<u64, StoreError> {
    store
        .bulk()
        .count_where(BulkRows::FailedDeliveries, filter)
        .await
}

/// Failed -> pending, attempts 0, due now (`last_error` kept until the next attempt); recorded.
/// Returns how many were retried.
pub async fn retry_failed_deliveries(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let done = retry_failed_deliveries_recorded(store, filter, actor).await?;
    Ok(done.count)
}

/// [`retry_failed_deliveries`], with the id the action is recorded under.
pub async fn retry_failed_deliveries_recorded(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<Recorded, StoreError> {
    requeue(
        store,
        BulkRows::FailedDeliveries,
        Action::OutboxRetry,
        filter,
        actor,
    )
    .await
}

/// How many dispatched deliveries (status `dispatched`, time `dispatched_at`) `filter` selects.
pub async fn count_dispatched_deliveries(
    store: &Store,
    filter: &RowFilter,
) -> Result<u64, StoreError> {
    store
        .bulk()
        .count_where(BulkRows::DispatchedDeliveries, filter)
        .await
}

/// Dispatched -> pending, attempts 0, `dispatched_at` NULL, due now: the relay delivers them
/// again under their original `idempotency_key`; recorded. Returns how many were re-sent.
pub async fn resend_dispatched_deliveries(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let done = resend_dispatched_deliveries_recorded(store, filter, actor).await?;
    Ok(done.count)
}

/// [`resend_dispatched_deliveries`], with the id the action is recorded under.
pub async fn resend_dispatched_deliveries_recorded(
    store: &Store,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<Recorded, StoreError> {
    requeue(
        store,
        BulkRows::DispatchedDeliveries,
        Action::OutboxResend,
        filter,
        actor,
    )
    .await
}

/// Up to `limit` failed deliveries the filter selects, newest first, below `before_id`.
pub async fn list_failed_deliveries(
    store: &Store,
    filter: &RowFilter,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<DeliveryListing>, StoreError> {
    store
        .bulk()
        .list_deliveries_where(BulkRows::FailedDeliveries, filter, before_id, limit)
        .await
}

/// Puts the rows of `rows` the filter selects back to `pending`, chunk by chunk (each chunk
/// its own short statement, waking the relays), up to the newest row that existed when it
/// began; records `action` with the count moved, also when a chunk fails.
async fn requeue(
    store: &Store,
    rows: BulkRows,
    action: Action,
    filter: &RowFilter,
    actor: &Actor,
) -> Result<Recorded, StoreError> {
    let through = store.bulk().newest_id(rows).await?;
    let mut moved = 0;
    let mut after = 0;
    let result = loop {
        match store
            .bulk()
            .requeue_chunk(rows, filter, after, through, &actor.0)
            .await
        {
            Ok(chunk) => {
                moved += chunk.moved;
                match chunk.last_id {
                    Some(last) => after = last,
                    None => break Ok(moved),
                }
            }
            Err(error) => break Err(error),
        }
    };
    let recorded = record(store, actor, action, filter, moved).await;
    match result {
        Ok(count) => recorded.map(|action_id| Recorded { count, action_id }),
        Err(error) => {
            tracing::warn!(action = action.name(), moved, %error, "bulk action stopped part-way");
            if let Err(record_error) = recorded {
                tracing::warn!(error = %record_error, "recording the stopped action failed");
            }
            Err(error)
        }
    }
}
