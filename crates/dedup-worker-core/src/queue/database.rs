//! The database queue: a table in the store, the embedded default transport.
//!
//! Publishing groups concurrent requests into one commit: each `publish` call hands its message
//! to a bounded channel and waits; writer tasks take everything waiting (up to
//! `publish_batch_max`), insert it in one statement, commit once, and answer every caller. Under
//! load this turns N fsyncs into one, which is what bounds ingress throughput.
//!
//! Each commit is bounded by `commit_timeout`, and while the database cannot be reached the
//! writers' shared breaker answers "unavailable" at once instead of letting every queued
//! publish wait out a timeout of its own (`dedup_db::group_commit`, as for the idempotency
//! store's writers).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{Backlog, Cause, Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};
use crate::event::SenderHeaders;
use crate::store::{bounded, NewQueueMessage, Store, StoreError, Wakeups};
use dedup_db::group_commit::{server_answered, Committed, Committer, Names, WriteFailure};

type Reply = oneshot::Sender<Result<(), TransportError>>;

/// Group-commit options (see `[transport]` in config/default.toml).
#[derive(Debug, Clone, Copy)]
pub struct GroupCommit {
    /// Most messages written by one commit.
    pub max_batch: usize,
    /// Writer tasks committing in parallel.
    pub writers: usize,
    /// Publishers that may wait for a writer.
    pub channel_capacity: usize,
    /// The longest one group commit may take before its callers are told "unavailable" and the
    /// writer moves on: a database that stops answering must not hold the writers forever. Such
    /// a commit also opens the writers' breaker, so the publishes queued behind it are told at
    /// once rather than each after as long.
    pub commit_timeout: Duration,
    /// How long a receive holds a message before it is redelivered.
    pub lease: Duration,
    /// The longest a claim, ack, release or lease extension waits for the store.
    pub statement_timeout: Duration,
}

#[derive(Debug)]
pub struct DatabaseQueue {
    /// Where the messages live.
    store: Store,
    /// Queue name: several queues can share one table.
    queue: String,
    /// Hands messages to the group-commit writers.
    publish_tx: mpsc::Sender<(NewQueueMessage, Reply)>,
    /// Wakes receivers when something was enqueued (in-process, and from NOTIFY on PostgreSQL).
    wakeups: Arc<Wakeups>,
    lease: Duration,
    /// See [`GroupCommit::statement_timeout`].
    statement_timeout: Duration,
}

impl DatabaseQueue {
    /// Starts the writer tasks; they end when the queue is dropped and the channel drains.
    pub fn start(store: Store, queue: String, wakeups: Arc<Wakeups>, options: GroupCommit) -> Self {
        let (publish_tx, publish_rx) = mpsc::channel(options.channel_capacity);
        let publish_rx = Arc::new(Mutex::new(publish_rx));
        // One breaker for all writers: they take from one channel over one pool, so the first
        // commit through after an outage reopens ingress for every one of them.
        let committer = Committer::new(COMMIT_NAMES, options.commit_timeout, StoreError::TimedOut);
        for _ in 0..options.writers {
            tokio::spawn(write_groups(
                store.clone(),
                queue.clone(),
                publish_rx.clone(),
                wakeups.clone(),
                options.max_batch,
                committer.clone(),
            ));
        }
        DatabaseQueue {
            store,
            queue,
            publish_tx,
            wakeups,
            lease: options.lease,
            statement_timeout: options.statement_timeout,
        }
    }
}

/// The writers' log subject and metrics.
const COMMIT_NAMES: Names = Names {
    subject: "database queue",
    group_size: "dedup_queue_group_commit_size",
    refused: "dedup_queue_group_refused_total",
};

/// One writer: take whatever is waiting, commit it as one group, answer everyone.
async fn write_groups(
    store: Store,
    queue: String,
    rx: Arc<Mutex<mpsc::Receiver<(NewQueueMessage, Reply)>>>,
    wakeups: Arc<Wakeups>,
    max_batch: usize,
    committer: Committer<StoreError>,
) {
    let mut group = Vec::with_capacity(max_batch);
    loop {
        {
            let mut rx = rx.lock().await;
            if rx.recv_many(&mut group, max_batch).await == 0 {
                return;
            }
        }
        let (messages, replies): (Vec<_>, Vec<_>) = group.drain(..).unzip();
        // On timeout the commit may still land: its callers were told 503 and their senders
        // retry, which the consumer recognises as a duplicate. Never the other way round.
        let enqueued = async {
            store
                .queue()
                .enqueue(&queue, &messages)
                .await
                .map_err(write_failure)
        };
        let error = match committer.commit(messages.len(), enqueued).await {
            Committed::Written(()) => {
                wakeups.queue.notify_waiters();
                for reply in replies {
                    let _ = reply.send(Ok(()));
                }
                continue;
            }
            // One message the database cannot hold must not fail the others committed with
            // it: each is written on its own, and only the offender is refused.
            Committed::Failed(error) if messages.len() > 1 && error.refused_for_its_data() => {
                tracing::warn!(%error, count = messages.len(), "database queue group refused for a row's data; writing its messages one at a time");
                write_one_by_one(&store, &queue, messages, replies).await;
                wakeups.queue.notify_waiters();
                continue;
            }
            Committed::Failed(error) => {
                tracing::warn!(%error, count = messages.len(), "database queue commit failed");
                if error.refused_for_its_data() {
                    let cause = Cause::new(error.to_string(), error);
                    for reply in replies {
                        let _ = reply.send(Err(TransportError::Rejected(cause.clone())));
                    }
                    continue;
                }
                Arc::new(error)
            }
            Committed::Unreachable(error) => {
                tracing::warn!(%error, count = messages.len(), "database queue commit failed");
                error
            }
            // The breaker is open: told at once, with the error that opened it.
            Committed::Refused(error) => error,
        };
        let cause = Cause::new(error.to_string(), error);
        for reply in replies {
            let _ = reply.send(Err(TransportError::Unavailable(cause.clone())));
        }
    }
}

/// How the breaker reads an enqueue's failure: the database not reached (no connection in
/// time, a broken one, no answer in time) opens it; an error the server answered with does not.
/// That includes one it sent while the pool connected (the database not accepting connections,
/// authentication): such an answer comes at once, and the breaker only saves waiting.
fn write_failure(error: StoreError) -> WriteFailure<StoreError> {
    match &error {
        StoreError::Database(e) if !server_answered(e) => WriteFailure::Unreachable(error),
        StoreError::TimedOut(_) => WriteFailure::Unreachable(error),
        _ => WriteFailure::Statement(error),
    }
}

/// After a group was refused for one row's data: one commit per message, each caller told its
/// own outcome.
async fn write_one_by_one(
    store: &Store,
    queue: &str,
    messages: Vec<NewQueueMessage>,
    replies: Vec<Reply>,
) {
    for (message, reply) in messages.into_iter().zip(replies) {
        let result = store
            .queue()
            .enqueue(queue, std::slice::from_ref(&message))
            .await
            .map_err(TransportError::from);
        if let Err(error) = &result {
            tracing::warn!(%error, "database queue refused a message");
        }
        let _ = reply.send(result);
    }
}

#[async_trait]
impl Transport for DatabaseQueue {
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let message = NewQueueMessage {
            source: message.source,
            message_id: message.message_id,
            message_type: message.message_type,
            payload: message.payload.to_vec(),
            traceparent: message.traceparent,
            stripe_signature: message.stripe_signature,
            sender_headers: message.sender_headers.to_wire(),
        };
        self.publish_tx
            .send((message, reply_tx))
            .await
            .map_err(|_| TransportError::Closed)?;
        // A dropped reply means the writer died mid-commit: not known durable, so not Ok.
        reply_rx.await.map_err(|_| TransportError::Closed)?
    }

    /// The configured queue goes through the group commit; another is one insert of its own.
    async fn publish_to_queue(
        &self,
        queue: &str,
        message: OutgoingMessage,
    ) -> Result<(), TransportError> {
        if queue == self.queue {
            return self.publish(message).await;
        }
        let message = NewQueueMessage {
            source: message.source,
            message_id: message.message_id,
            message_type: message.message_type,
            payload: message.payload.to_vec(),
            traceparent: message.traceparent,
            stripe_signature: message.stripe_signature,
            sender_headers: message.sender_headers.to_wire(),
        };
        self.store.queue().enqueue(queue, &[message]).await?;
        self.wakeups.queue.notify_waiters();
        Ok(())
    }

    fn can_address(&self, queue: &str) -> bool {
        !queue.is_empty() && !queue.contains("://")
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        // Register for the wake-up before looking, so an enqueue between the look and the wait
        // is not missed.
        let notified = self.wakeups.queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let claim = || {
            bounded(
                self.statement_timeout,
                self.store.queue().claim(&self.queue, max, self.lease),
            )
        };
        let mut rows = claim().await?;
        if rows.is_empty() {
            let _ = tokio::time::timeout(wait, notified).await;
            rows = claim().await?;
        }
        Ok(rows
            .into_iter()
            .map(|row| Delivery {
                tag: DeliveryTag::Row {
                    id: row.id,
                    claim_token: row.claim_token,
                },
                source: row.source,
                message_id: row.message_id,
                message_type: row.message_type,
                payload: Bytes::from(row.payload),
                attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
                enqueued_at: Some(row.enqueued_at),
                defect: None,
                give_up: None,
                traceparent: row.traceparent,
                stripe_signature: row.stripe_signature,
                sender_headers: SenderHeaders::from_wire(row.sender_headers.as_deref()),
            })
            .collect())
    }

    /// Deletes the rows even if another consumer re-claimed them after our lease expired: the
    /// outcome we ack for is committed, so that consumer could only find the event processed
    /// (see [`crate::store::Queue::ack`]).
    async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        let ids: Vec<i64> = tags
            .iter()
            .filter_map(|tag| match tag {
                DeliveryTag::Row { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        Ok(bounded(self.statement_timeout, self.store.queue().ack(&ids)).await?)
    }

    async fn release(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        // An acked row is deleted already, and a row another consumer claimed since carries
        // its token: releasing either updates nothing.
        for tag in tags {
            if let DeliveryTag::Row { id, claim_token } = tag {
                bounded(
                    self.statement_timeout,
                    self.store
                        .queue()
                        .release(*id, *claim_token, Duration::ZERO),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn extend_leases(
        &self,
        tags: &[DeliveryTag],
        lease: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        // One receive is one claim, so a batch has one token; grouped anyway, in case a caller
        // holds the deliveries of several receives.
        let mut by_token: std::collections::HashMap<i64, Vec<i64>> = Default::default();
        for tag in tags {
            if let DeliveryTag::Row { id, claim_token } = tag {
                by_token.entry(*claim_token).or_default().push(*id);
            }
        }
        let mut lost = Vec::new();
        for (claim_token, ids) in by_token {
            let held: std::collections::HashSet<i64> = bounded(
                self.statement_timeout,
                self.store.queue().extend_leases(claim_token, &ids, lease),
            )
            .await?
            .into_iter()
            .collect();
            lost.extend(
                ids.into_iter()
                    .filter(|id| !held.contains(id))
                    .map(|id| DeliveryTag::Row { id, claim_token }),
            );
        }
        Ok(lost)
    }

    async fn retry_later(
        &self,
        delivery: &Delivery,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let DeliveryTag::Row { id, claim_token } = delivery.tag else {
            return Err(TransportError::Unavailable(
                "not a database queue delivery".into(),
            ));
        };
        let released = bounded(
            self.statement_timeout,
            self.store.queue().release(id, claim_token, delay),
        )
        .await?;
        if released == 0 {
            // Our lease expired and another consumer claimed the message (or acked it): its
            // lease and its attempt count stand. Not an error: that consumer finishes the job.
            tracing::warn!(
                queue_message_id = id,
                attempts = delivery.attempts,
                "lease lost; another consumer owns the message"
            );
            metrics::counter!("dedup_queue_lease_lost_total").increment(1);
        }
        Ok(())
    }

    async fn ready(&self) -> Result<(), TransportError> {
        Ok(bounded(self.statement_timeout, self.store.ping()).await?)
    }

    /// One statement: the rows of the queue and its oldest `enqueued_at`. An empty queue's
    /// oldest message is 0 s old, so an age alert clears once the queue drains.
    async fn backlog(&self) -> Result<Backlog, TransportError> {
        let (depth, oldest) = bounded(
            self.statement_timeout,
            self.store.queue().backlog(&self.queue),
        )
        .await?;
        Ok(Backlog {
            depth: Some(depth),
            oldest_age: Some(oldest.unwrap_or(Duration::ZERO)),
        })
    }

    fn queue_name(&self) -> &str {
        &self.queue
    }
}
