//! Replaying dead letters (`dedup-worker dlq redrive`) through the configured transport.
//!
//! A dead letter goes back the way its event came: published through the transport the
//! consumers read (RabbitMQ with its publisher confirm, SQS `SendMessage`, or the database
//! queue), to the queue it was recorded on, with its source, event id, type and raw payload as
//! they were. Writing it into the database queue table instead would strand it where no
//! RabbitMQ or SQS consumer looks.
//!
//! Order: publish, then delete the dead letter (recording the redrive in the same
//! transaction, for `events show`). A crash in between leaves the dead letter
//! listed although its event is back on the queue; redriving it again publishes a duplicate,
//! which the consumer's dedup record absorbs. The other order could lose the event.
//!
//! A dead letter recorded on a queue this transport cannot address (an SQS URL while the
//! configured transport is RabbitMQ, after a change of transport) is not guessed at: the
//! redrive stops with an error naming it, and `--queue` sends dead letters to a queue chosen
//! by the operator.
//!
//! What is redriven: dead letters by id, or every one a [`RowFilter`] selects (type prefix,
//! time range), in id order, page by page, up to the newest that existed when the redrive
//! began: one dead-lettered again while it runs waits for the next redrive rather than being
//! published in a loop. [`crate::operator::redrive_dead_letters`] records the redrive.

use crate::queue::{OutgoingMessage, Transport, TransportError};
use crate::store::{BulkRows, DeadLetter, RowFilter, Store, StoreError};

/// Dead letters read per page.
const PAGE: i64 = 100;

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error("reading or deleting dead letters ({redriven} redriven before)")]
    Store {
        redriven: u64,
        #[source]
        source: StoreError,
    },
    #[error(
        "dead letter {id}: publishing to {queue} failed ({redriven} redriven before); it is kept"
    )]
    Publish {
        id: i64,
        queue: String,
        redriven: u64,
        #[source]
        source: TransportError,
    },
    #[error(
        "dead letter {id} was recorded on {queue}, which is not a queue of the configured \
         transport ({redriven} redriven before); it is kept: pass --queue to choose one"
    )]
    Unaddressable {
        id: i64,
        queue: String,
        redriven: u64,
    },
    /// The redrive itself finished; its record in `admin_actions` could not be written.
    #[error("{redriven} dead letters redriven, but recording the redrive failed")]
    Record {
        redriven: u64,
        #[source]
        source: StoreError,
    },
}

impl RedriveError {
    /// How many dead letters were redriven before the failure.
    pub fn redriven(&self) -> u64 {
        match self {
            RedriveError::Store { redriven, .. }
            | RedriveError::Publish { redriven, .. }
            | RedriveError::Unaddressable { redriven, .. }
            | RedriveError::Record { redriven, .. } => *redriven,
        }
    }
}

/// Publishes the dead letters `ids` (all when empty) through `transport`, each to its recorded
/// queue or to `to_queue`, deleting each after its publish succeeded. Stops at the first
/// failure (what follows would most likely fail the same way); returns how many were redriven.
pub async fn redrive(
    store: &Store,
    transport: &dyn Transport,
    ids: &[i64],
    to_queue: Option<&str>,
) -> Result<u64, RedriveError> {
    let filter = RowFilter {
        ids: ids.to_vec(),
        ..RowFilter::default()
    };
    redrive_where(store, transport, &filter, to_queue).await
}

/// [`redrive`] of the dead letters `filter` selects (every one when it is empty), up to the
/// newest that existed when it began.
pub async fn redrive_where(
    store: &Store,
    transport: &dyn Transport,
    filter: &RowFilter,
    to_queue: Option<&str>,
) -> Result<u64, RedriveError> {
    let mut redriven = 0;
    let store_error = |redriven| move |source| RedriveError::Store { redriven, source };
    let through = store
        .bulk()
        .newest_id(BulkRows::DeadLetters)
        .await
        .map_err(store_error(0))?;
    let mut after = 0;
    loop {
        let page = store
            .bulk()
            .dead_letters_where(filter, after, through, PAGE)
            .await
            .map_err(store_error(redriven))?;
        let Some(last) = page.last() else {
            return Ok(redriven);
        };
        after = last.id;
        for dead in page {
            // 0: another redrive deleted it meanwhile (its publish and ours are one event, which
            // the consumer's dedup record absorbs); counted once, by the one that deleted it.
            redriven += redrive_one(store, transport, dead, to_queue, redriven).await?;
        }
    }
}

/// Publishes one dead letter, then deletes it with a record of the redrive (which `events
/// show` lists); returns the rows deleted (1, or 0 when it was gone). `redriven` is only for
/// the error.
async fn redrive_one(
    store: &Store,
    transport: &dyn Transport,
    dead: DeadLetter,
    to_queue: Option<&str>,
    redriven: u64,
) -> Result<u64, RedriveError> {
    let queue = to_queue.unwrap_or(&dead.queue).to_owned();
    let id = dead.id;
    if !transport.can_address(&queue) {
        return Err(RedriveError::Unaddressable {
            id,
            queue,
            redriven,
        });
    }
    transport
        .publish_to_queue(&queue, message(dead))
        .await
        .map_err(|source| RedriveError::Publish {
            id,
            queue: queue.clone(),
            redriven,
            source,
        })?;
    store
        .dead_letters()
        .redrive(id, &queue)
        .await
        .map_err(|source| RedriveError::Store { redriven, source })
}

/// The message a dead letter was: an empty id or type was not known (the consumer derives
/// them from the payload again), so it is left out rather than sent empty.
fn message(dead: DeadLetter) -> OutgoingMessage {
    let known = |s: String| (!s.is_empty()).then_some(s);
    OutgoingMessage {
        source: Some(dead.source),
        message_id: known(dead.event_id),
        message_type: known(dead.event_type),
        payload: dead.payload.into(),
        traceparent: None,
        // The dead letter kept no signature: the redriven event is looked up everywhere.
        stripe_signature: None,
        sender_headers: crate::event::SenderHeaders::default(),
    }
}
