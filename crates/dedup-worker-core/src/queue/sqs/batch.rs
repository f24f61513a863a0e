//! The batch calls, `DeleteMessageBatch` (acks) and `ChangeMessageVisibilityBatch` (give-backs
//! and heartbeats): ten receipt handles a call, [`CALLS_AT_ONCE`] calls in flight at once, so
//! settling a batch of 256 costs seven round trips rather than 26 (at 400 ms a call, 10 s: the
//! whole lease). Each call keeps the client's timeout. Every chunk is tried even when another
//! call fails; then the first such failure is the result (what was not deleted comes back after
//! its lease and is a duplicate then; what was not extended is extended by the next heartbeat).

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{self, StreamExt};

use super::fill::{CALLS_AT_ONCE, PAGE};
use super::{invalid, unavailable, SqsQueue};
use crate::queue::TransportError;
use std::time::Duration;

/// One entry of a batch call that SQS refused on its own.
pub(super) struct Refused {
    /// Its receipt handle.
    pub(super) handle: String,
    /// SQS's error code (`ReceiptHandleIsInvalid`, …).
    pub(super) code: String,
    pub(super) message: String,
}

/// Runs `calls` (one per chunk), at most [`CALLS_AT_ONCE`] at once: the entries refused, or
/// the first call's failure once every chunk was tried.
async fn side_by_side(
    calls: Vec<BoxFuture<'_, Result<Vec<Refused>, TransportError>>>,
) -> Result<Vec<Refused>, TransportError> {
    // Boxed: the calls' futures are then one named type, which keeps the trait's futures `Send`
    // (the compiler cannot prove it through the closures and combinators otherwise).
    let results: Vec<_> = stream::iter(calls)
        .buffer_unordered(CALLS_AT_ONCE)
        .collect()
        .await;
    let mut refused = Vec::new();
    let mut failure = None;
    for result in results {
        match result {
            Ok(entries) => refused.extend(entries),
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(refused),
    }
}

/// The refused entry `id` (its index in `chunk`), with the handle it names.
fn refused(chunk: &[&str], id: &str, code: &str, message: Option<&str>) -> Option<Refused> {
    let handle = id.parse::<usize>().ok().and_then(|i| chunk.get(i))?;
    Some(Refused {
        handle: (*handle).to_owned(),
        code: code.to_owned(),
        message: message.unwrap_or_default().to_owned(),
    })
}

impl SqsQueue {
    /// Sets the visibility timeout of the messages `handles` to `visibility` from now. Returns
    /// the handles whose entry failed.
    pub(super) async fn change_visibility(
        &self,
        handles: &[&str],
        visibility: Duration,
    ) -> Result<Vec<String>, TransportError> {
        let calls = handles
            .chunks(PAGE)
            .map(|chunk| self.change_visibility_chunk(chunk, visibility).boxed());
        let refused = side_by_side(calls.collect()).await?;
        for entry in &refused {
            tracing::debug!(
                code = entry.code,
                message = entry.message,
                "sqs visibility change refused for one message"
            );
        }
        Ok(refused.into_iter().map(|entry| entry.handle).collect())
    }

    /// One `ChangeMessageVisibilityBatch` of at most ten: the entries refused.
    async fn change_visibility_chunk(
        &self,
        chunk: &[&str],
        visibility: Duration,
    ) -> Result<Vec<Refused>, TransportError> {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, handle)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*handle)
                    .visibility_timeout(Self::secs(visibility))
                    .build()
                    .map_err(unavailable)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output
            .failed()
            .iter()
            .filter_map(|e| refused(chunk, e.id(), e.code(), e.message()))
            .collect())
    }

    /// Deletes the messages `handles`; the entries SQS refused.
    pub(super) async fn delete(&self, handles: &[&str]) -> Result<Vec<Refused>, TransportError> {
        let calls = handles
            .chunks(PAGE)
            .map(|chunk| self.delete_chunk(chunk).boxed());
        side_by_side(calls.collect()).await
    }

    /// One `DeleteMessageBatch` of at most ten: the entries refused.
    async fn delete_chunk(&self, chunk: &[&str]) -> Result<Vec<Refused>, TransportError> {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, handle)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*handle)
                    .build()
                    .map_err(invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output
            .failed()
            .iter()
            .filter_map(|e| refused(chunk, e.id(), e.code(), e.message()))
            .collect())
    }
}
