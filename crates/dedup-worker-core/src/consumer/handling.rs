//! Stage 4 of the pipeline, running the handlers of the batch's new events: each in its own span
//! (every line it logs carries the event), its panics caught, and in the precise pass in a
//! savepoint of its own.
//!
//! Optimistic pass first: all handlers in the transaction with no savepoints (no extra round
//! trips). If any fails, start over with a savepoint per event so only that one is undone.
//! A handler can therefore run more than once for one delivery; only its writes through `tx`
//! and the messages it returns take effect, and those commit exactly once (the same holds when
//! a commit fails and the batch is redelivered). Starting over takes a new transaction.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tracing::Instrument;

use super::claim::{record_new, Received};
use super::{ConsumerError, Handler, HandlerError, OutboxMessage, StaleGuard};
use crate::event::Event;
use crate::queue::{Delivery, DeliveryTag};
use crate::store::{Store, StoreError, StoreTx};
use crate::telemetry::traces;

/// The deliveries of the current step handed to a handler: if the step fails, only these may
/// count towards the transport's delivery limit when the loop gives them back (`run.rs`).
#[derive(Default)]
pub(super) struct Handed(Mutex<HashSet<DeliveryTag>>);

impl Handed {
    /// A new step: nothing handed yet.
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    /// What the step handed, leaving nothing.
    pub(super) fn take(&self) -> HashSet<DeliveryTag> {
        std::mem::take(&mut *self.lock())
    }

    fn insert(&self, tag: DeliveryTag) {
        self.lock().insert(tag);
    }

    /// The set, whatever a panicking holder left (a set of tags stays valid).
    fn lock(&self) -> MutexGuard<'_, HashSet<DeliveryTag>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What happened to one new event in the transaction.
pub(super) enum Verdict {
    Handled(Handled),
    Failed(HandlerError),
}

/// What a handler that succeeded produced: its messages, and the `traceparent` of the span it
/// ran in, which its outbox rows carry so the relay's delivery continues the event's trace.
pub(super) struct Handled {
    pub(super) messages: Vec<OutboxMessage>,
    pub(super) traceparent: Option<String>,
    /// Held back by the stale-event guard: recorded as processed, its handler not run.
    pub(super) stale: bool,
}

/// What the handlers run with: the consumer's handler and stale-event guard, and where the
/// step notes the deliveries it handed over.
pub(super) struct Handling<'c> {
    pub(super) handler: &'c dyn Handler,
    pub(super) stale_guard: Option<&'c StaleGuard>,
    pub(super) handed: &'c Handed,
}

/// The handlers' outcome: the transaction to go on with (a new one if the precise pass ran),
/// and each event's verdict.
pub(super) struct Ran<'e, 'd> {
    pub(super) tx: StoreTx,
    /// New events another worker committed before the precise pass claimed them again:
    /// duplicates.
    pub(super) taken: Vec<Received<'e, 'd>>,
    pub(super) verdicts: Vec<(Received<'e, 'd>, Verdict)>,
}

impl Handling<'_> {
    /// Runs the handlers of the new events, each paired with its verdict (see the module docs
    /// for the two passes).
    pub(super) async fn run_handlers<'e, 'd>(
        &self,
        store: &Store,
        mut tx: StoreTx,
        fresh: Vec<Received<'e, 'd>>,
    ) -> Result<Ran<'e, 'd>, ConsumerError> {
        self.lock_objects(&mut tx, &fresh).await?;
        let mut verdicts = Vec::with_capacity(fresh.len());
        for (event, delivery) in &fresh {
            match self.run_handler(event, delivery, &mut tx).await {
                Ok(handled) => verdicts.push(Verdict::Handled(handled)),
                Err(_) => break,
            }
        }
        if verdicts.len() == fresh.len() {
            let verdicts = fresh.into_iter().zip(verdicts).collect();
            return Ok(Ran {
                tx,
                taken: Vec::new(),
                verdicts,
            });
        }
        tx.rollback().await?;
        let mut tx = store.begin().await?;
        // Another worker may have committed some of these meanwhile: ask again.
        let (still_new, taken) = record_new(&mut tx, fresh).await?;
        self.lock_objects(&mut tx, &still_new).await?;
        let verdicts = self.handle_with_savepoints(&mut tx, &still_new).await?;
        let verdicts = still_new.into_iter().zip(verdicts).collect();
        Ok(Ran {
            tx,
            taken,
            verdicts,
        })
    }

    /// Before any handler runs: the stale-event guard's objects of these events, locked in one
    /// order (see [`StoreTx::lock_objects`]), so two batches never wait for each other's
    /// objects in a cycle.
    async fn lock_objects(
        &self,
        tx: &mut StoreTx,
        fresh: &[&(Event, &Delivery)],
    ) -> Result<(), StoreError> {
        let Some(guard) = self.stale_guard else {
            return Ok(());
        };
        let objects = guard.objects(fresh.iter().map(|(event, _)| event));
        let objects: Vec<(&str, &str)> = objects.iter().map(|(s, o)| (*s, o.as_str())).collect();
        tx.lock_objects(&objects).await
    }

    /// The precise pass: each handler in its own savepoint; a failure undoes only its event,
    /// including its dedup row (never "seen" before success).
    async fn handle_with_savepoints(
        &self,
        tx: &mut StoreTx,
        fresh: &[&(Event, &Delivery)],
    ) -> Result<Vec<Verdict>, StoreError> {
        let mut verdicts = Vec::with_capacity(fresh.len());
        for (event, delivery) in fresh {
            tx.savepoint().await?;
            match self.run_handler(event, delivery, tx).await {
                Ok(handled) => {
                    tx.release_savepoint().await?;
                    verdicts.push(Verdict::Handled(handled));
                }
                Err(error) => {
                    tx.rollback_to_savepoint().await?;
                    tx.release_savepoint().await?;
                    tx.delete_processed(&event.source, &event.id).await?;
                    verdicts.push(Verdict::Failed(error));
                }
            }
        }
        Ok(verdicts)
    }

    /// Runs the handler in the event's span, a child of the publisher's trace when the
    /// delivery carries one; a panic becomes a fatal error for this event only, so one poison
    /// event can neither kill the worker nor block its batch.
    async fn run_handler(
        &self,
        event: &Event,
        delivery: &Delivery,
        tx: &mut StoreTx,
    ) -> Result<Handled, HandlerError> {
        use futures::FutureExt;
        self.handed.insert(delivery.tag.clone());
        let handled = async {
            if let Some(guard) = self.stale_guard {
                if guard.is_stale(event, tx).await? {
                    return Ok(None); // recorded as processed; nothing to forward
                }
            }
            let mut conn = tx.conn();
            std::panic::AssertUnwindSafe(self.handler.handle(event, &mut conn))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    Err(HandlerError::Fatal(
                        format!("handler panicked: {reason}").into(),
                    ))
                })
                .map(Some)
        };
        let span = handle_span(event);
        traces::continue_trace(&span, delivery.traceparent.as_deref());
        let traceparent = traces::traceparent_of(&span);
        let messages: Option<Vec<OutboxMessage>> = handled.instrument(span).await?;
        Ok(Handled {
            stale: messages.is_none(),
            messages: messages.unwrap_or_default(),
            traceparent,
        })
    }
}

/// The span a handler (and the stale guard) runs in: every line it, or a user's handler, logs
/// carries the event's key and type (so such lines must not repeat them as fields).
fn handle_span(event: &Event) -> tracing::Span {
    tracing::info_span!(
        "handle",
        otel.kind = "consumer",
        source = %event.source,
        event_id = %event.id,
        event_type = %event.event_type,
    )
}
