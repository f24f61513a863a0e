//! [`Gate`]: what a lane asks before each send of a batch and tells after each answer. It
//! paces the sends (`rate_per_sec`, `burst`), feeds each outcome to the lane's circuit breaker
//! as it arrives, and stops the rest of the batch the moment the receiver asks for time
//! (`Retry-After`) or the breaker trips, so a dead receiver is not sent the batch's other rows
//! one timeout after another, and the rows not sent spend no attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::breaker::{Breaker, TripReason};
use super::rate::LaneRate;
use crate::outbox::sink::SinkError;

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
}

impl Gate {
    pub fn new(rate: Option<Arc<LaneRate>>, breaker: Option<Arc<Mutex<Breaker>>>) -> Self {
        Gate {
            rate,
            breaker,
            stop: Mutex::new(None),
        }
    }

    /// Waits for the rate's next token; false if the batch stopped (before or meanwhile).
    pub async fn admit(&self) -> bool {
        if self.stopped().is_some() {
            return false;
        }
        if let Some(rate) = &self.rate {
            rate.until_ready().await;
        }
        self.stopped().is_none()
    }

    /// Takes one answer into account: a `Retry-After` stops the batch, a failure counts
    /// towards the breaker (and stops the batch if it trips), a delivery counts as a success.
    /// An unusable destination counts as neither.
    pub fn settle(&self, result: &Result<(), SinkError>) {
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
            Ok(()) => {
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
