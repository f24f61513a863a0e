//! Running the handler for one new event: in its own span (every line it logs carries the
//! event), its panics caught, and in the precise pass in a savepoint of its own.

use tracing::Instrument;

use super::{Consumer, Handled, HandlerError, OutboxMessage, Verdict};
use crate::event::Event;
use crate::queue::Delivery;
use crate::store::{StoreError, StoreTx};
use crate::telemetry::traces;

impl Consumer {
    /// Before any handler runs: the stale-event guard's objects of these events, locked in one
    /// order (see [`StoreTx::lock_objects`]), so two batches never wait for each other's
    /// objects in a cycle.
    pub(super) async fn lock_objects(
        &self,
        tx: &mut StoreTx,
        fresh: &[&(Event, &Delivery)],
    ) -> Result<(), StoreError> {
        let Some(guard) = &self.stale_guard else {
            return Ok(());
        };
        let objects = guard.objects(fresh.iter().map(|(event, _)| event));
        let objects: Vec<(&str, &str)> = objects.iter().map(|(s, o)| (*s, o.as_str())).collect();
        tx.lock_objects(&objects).await
    }

    /// The precise pass: each handler in its own savepoint; a failure undoes only its event,
    /// including its dedup row (never "seen" before success).
    pub(super) async fn handle_with_savepoints(
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
    pub(super) async fn run_handler(
        &self,
        event: &Event,
        delivery: &Delivery,
        tx: &mut StoreTx,
    ) -> Result<Handled, HandlerError> {
        use futures::FutureExt;
        self.handed().insert(delivery.tag.clone());
        let handled = async {
            if let Some(guard) = &self.stale_guard {
                if guard.is_stale(event, tx).await? {
                    return Ok(Vec::new()); // recorded as processed; nothing to forward
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
        };
        let span = handle_span(event);
        traces::continue_trace(&span, delivery.traceparent.as_deref());
        let traceparent = traces::traceparent_of(&span);
        let messages: Vec<OutboxMessage> = handled.instrument(span).await?;
        Ok(Handled {
            messages,
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
