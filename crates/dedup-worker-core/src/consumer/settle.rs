//! Stage 8 of the pipeline, and what surrounds stages 1 to 7: the heartbeat that keeps the
//! batch's leases while it is processed, and the settlement (acks, delayed redeliveries) that
//! follows once it is committed. The heartbeat stops before the settlement starts: an extension
//! landing after a retry's visibility change would overwrite its backoff.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{ConsumerError, StepOutcome};
use crate::lease::{heartbeat_period, report_failed, report_lost, with_lease_heartbeat};
use crate::queue::{Delivery, DeliveryTag, Transport};

/// What a committed batch leaves to tell the transport, once its leases need no heartbeat any
/// more: the acks and the delayed redeliveries.
#[derive(Default)]
pub(super) struct Settlement<'d> {
    pub(super) outcome: StepOutcome,
    pub(super) ack: Vec<DeliveryTag>,
    pub(super) retries: Vec<(&'d Delivery, Duration)>,
    /// A failure after part of the batch committed (processing one delivery at a time): what
    /// committed is settled, then the step fails and the rest is given back.
    pub(super) failure: Option<ConsumerError>,
}

impl<'d> std::ops::AddAssign for Settlement<'d> {
    fn add_assign(&mut self, other: Self) {
        self.outcome += other.outcome;
        self.ack.extend(other.ack);
        self.retries.extend(other.retries);
        self.failure = self.failure.take().or(other.failure);
    }
}

/// `commit` (stages 1 to 7) with the deliveries' leases extended every third of a `lease`
/// meanwhile.
pub(super) async fn hold_leases<'d>(
    transport: &Arc<dyn Transport>,
    lease: Duration,
    deliveries: &'d [Delivery],
    commit: impl Future<Output = Result<Settlement<'d>, ConsumerError>>,
) -> Result<Settlement<'d>, ConsumerError> {
    let held = Arc::new(Mutex::new(
        deliveries.iter().map(|d| d.tag.clone()).collect::<Vec<_>>(),
    ));
    with_lease_heartbeat("queue", heartbeat_period(lease), commit, || {
        let (transport, held) = (transport.clone(), held.clone());
        async move {
            let tags = lock(&held).clone();
            match transport.extend_leases(&tags, lease).await {
                Ok(lost) => {
                    report_lost("queue", lost.len());
                    // Not extended again: another consumer holds them now.
                    lock(&held).retain(|tag| !lost.contains(tag));
                }
                Err(error) => report_failed("queue", &error),
            }
        }
    })
    .await
}

/// After the commit, and only then: acks and delayed redeliveries. If these fail the
/// messages come back after their lease and are recognised as duplicates.
pub(super) async fn settle(
    transport: &dyn Transport,
    settlement: Settlement<'_>,
) -> Result<StepOutcome, ConsumerError> {
    transport.ack(&settlement.ack).await?;
    for (delivery, delay) in &settlement.retries {
        transport.retry_later(delivery, *delay).await?;
    }
    let outcome = settlement.outcome;
    metrics::counter!("dedup_events_received_total").increment(outcome.received as u64);
    metrics::counter!("dedup_events_handled_total").increment(outcome.handled as u64);
    metrics::counter!("dedup_events_duplicate_total").increment(outcome.duplicates as u64);
    metrics::counter!("dedup_events_retried_total").increment(outcome.retried as u64);
    metrics::counter!("dedup_dead_letters_total").increment(outcome.dead_lettered as u64);
    match settlement.failure {
        Some(error) => Err(error),
        None => Ok(outcome),
    }
}

/// The held tags, whatever a panicking holder left (a tag list stays valid).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
