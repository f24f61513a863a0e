//! [`Gate`]: what a lane asks before each send of a batch and tells after each answer. It
//! paces the sends (`rate_per_sec`, `burst`), feeds each outcome to the lane's circuit breaker
//! as it arrives, and stops the rest of the batch the moment the receiver asks for time
//! (`Retry-After`) or the breaker trips, so a dead receiver is not sent the batch's other rows
//! one timeout after another, and the rows not sent spend no attempt. It also sends nothing
//! once the batch's lease has run out without the heartbeat extending it (the process was
//! stopped, or the store did not answer): another relay may own those rows by then, and a row
//! sent late could reach an ordered sink after a later row of its key.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::breaker::{Breaker, TripReason};
use super::rate::LaneRate;
use crate::outbox::sink::{Receipt, SinkError};

/// Why a lane stopped sending a batch.
#[derive(Debug, Clone)]
pub enum Stop {
    /// The receiver answered 429 or 503 with this `Retry-After` (not yet bounded).
    Throttled(Duration),
    /// The circuit breaker tripped on this failure.
    Tripped { reason: TripReason, error: String },
}

/// One batch's admission (see the module's doc).
pub struct Gate {
    /// The lane's rate (shared by its batches and every relay process); `None`: no rate.
    rate: Option<Arc<LaneRate>>,
    /// The lane's breaker, fed every answer; `None` while probing (a probe's outcome opens or
    /// closes the circuit itself).
    breaker: Option<Arc<Mutex<Breaker>>>,
    /// Set once: the first reason to send nothing more.
    stop: Mutex<Option<Stop>>,
    /// Until when the batch's lease is surely this relay's: the claim's time plus the lease,
    /// moved on by each extension the heartbeat got through.
    lease_until: Mutex<Instant>,
}

impl Gate {
    pub fn new(
        rate: Option<Arc<LaneRate>>,
        breaker: Option<Arc<Mutex<Breaker>>>,
        lease_until: Instant,
    ) -> Self {
        Gate {
            rate,
            breaker,
            stop: Mutex::new(None),
            lease_until: Mutex::new(lease_until),
        }
    }

    /// The heartbeat extended the batch's leases (asked before `until` minus the lease).
    pub fn lease_extended(&self, until: Instant) {
        let mut lease_until = self
            .lease_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *lease_until = (*lease_until).max(until);
    }

    fn lease_held(&self) -> bool {
        Instant::now()
            < *self
                .lease_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the rate's next token; false if the batch stopped (before or meanwhile) or
    /// its lease ran out.
    pub async fn admit(&self) -> bool {
        if self.stopped().is_some() || !self.lease_held() {
            return false;
        }
        if let Some(rate) = &self.rate {
            rate.until_ready().await;
        }
        self.stopped().is_none() && self.lease_held()
    }

    /// Takes one answer into account: a `Retry-After` stops the batch, a failure counts
    /// towards the breaker (and stops the batch if it trips), a delivery counts as a success.
    /// An unusable destination counts as neither.
    pub fn settle(&self, result: &Result<Receipt, SinkError>) {
        let stop = match result {
            // Not the receiver's doing: a row's destination that cannot be built says nothing
            // of the sink's health (and an open circuit would keep such rows pending for ever
            // instead of failing them after their attempts).
            Err(SinkError::NotSent | SinkError::Destination(_)) => None,
            Err(SinkError::Throttled { retry_after, .. }) => Some(Stop::Throttled(*retry_after)),
            Err(error) => self.record(true).map(|reason| Stop::Tripped {
                reason,
                error: error.to_string(),
            }),
            Ok(_) => {
                self.record(false);
                None
            }
        };
        if let Some(stop) = stop {
            self.lock_stop().get_or_insert(stop);
        }
    }

    /// What stopped the batch, if anything did.
    pub fn stopped(&self) -> Option<Stop> {
        self.lock_stop().clone()
    }

    fn record(&self, failed: bool) -> Option<TripReason> {
        let breaker = self.breaker.as_ref()?;
        breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(failed)
    }

    fn lock_stop(&self) -> std::sync::MutexGuard<'_, Option<Stop>> {
        self.stop.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Gate;

    #[tokio::test]
    async fn nothing_is_admitted_once_the_lease_ran_out_unless_it_was_extended() {
        let gate = Gate::new(None, None, Instant::now() + Duration::from_secs(60));
        assert!(gate.admit().await);
        let lapsed = Gate::new(None, None, Instant::now() - Duration::from_millis(1));
        assert!(
            !lapsed.admit().await,
            "a stopped process woke past its lease"
        );
        lapsed.lease_extended(Instant::now() + Duration::from_secs(60));
        assert!(lapsed.admit().await);
        // An older extension arriving late does not shorten the lease.
        lapsed.lease_extended(Instant::now() - Duration::from_secs(1));
        assert!(lapsed.admit().await);
    }
}
