//! [`LaneRate`]: a sink's `rate_per_sec` and `burst`, held for every relay process together.
//! Each process takes a few tokens at a time from the lane's shared bucket in the store
//! ([`Sinks::take_tokens`](crate::store::Sinks::take_tokens)) and spends them on its own sends;
//! so the receiver sees the configured rate however many relays run, not that rate per relay.
//! A token not spent soon after it was granted is dropped (spent late, it would add to a later
//! burst). While the store does not answer, nothing is sent: the lane's claims and marks fail
//! too, and sending unpaced would break the rate the receiver asked for.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::retry::backoff_delay;
use crate::store::{bounded, Store, Tokens};

/// The longest one wait for the shared bucket sleeps before asking again.
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// A lane's shared rate (see the module's doc).
pub struct LaneRate {
    store: Store,
    /// The lane's name in the store.
    sink: String,
    /// The time one token takes to accrue (1 / rate).
    interval: Duration,
    /// Tokens a full bucket grants at once.
    burst: u32,
    /// Tokens asked of the store at once: about 50 ms of the rate, at least 1, at most the
    /// burst; fewer store calls at high rates, few tokens kept from the other relays.
    chunk: u32,
    /// The longest one store call may take (`database.statement_timeout`).
    statement_timeout: Duration,
    /// Tokens granted to this process and not spent yet, and until when they may be spent.
    held: Mutex<(u32, Instant)>,
    /// One store call at a time: concurrent senders of the lane wait for its answer rather
    /// than each ask.
    refill: tokio::sync::Mutex<()>,
}

impl LaneRate {
    /// # Panics
    /// When `rate_per_sec` is not a positive finite number (the configuration refuses those).
    pub fn new(
        store: Store,
        sink: String,
        rate_per_sec: f64,
        burst: u32,
        statement_timeout: Duration,
    ) -> Self {
        assert!(
            rate_per_sec.is_finite() && rate_per_sec > 0.0,
            "a lane's rate must be positive, not {rate_per_sec}"
        );
        let burst = burst.max(1);
        LaneRate {
            store,
            sink,
            interval: Duration::from_secs_f64(1.0 / rate_per_sec),
            burst,
            chunk: ((rate_per_sec / 20.0).ceil() as u32).clamp(1, burst),
            statement_timeout,
            held: Mutex::new((0, Instant::now())),
            refill: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits until this process may send one delivery. Cancel-safe: a waiter dropped while
    /// waiting has spent nothing (a grant it was about to take is lost, which only slows the
    /// lane).
    pub async fn until_ready(&self) {
        let mut failures = 0u32;
        loop {
            if self.spend_held() {
                return;
            }
            let _one_call = self.refill.lock().await;
            if self.spend_held() {
                return;
            }
            let take =
                self.store
                    .sinks()
                    .take_tokens(&self.sink, self.chunk, self.interval, self.burst);
            let wait = match bounded(self.statement_timeout, take).await {
                Ok(Tokens { granted: 0, wait }) => wait,
                Ok(Tokens { granted, .. }) => {
                    let fresh_until = Instant::now() + self.interval.saturating_mul(granted);
                    *self.lock_held() = (granted - 1, fresh_until);
                    return;
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(sink = %self.sink, %error, "the shared rate's bucket cannot be read; not sending meanwhile");
                    backoff_delay(Duration::from_millis(50), LONGEST_WAIT, failures)
                }
            };
            // Still the one asking: the others wait for this answer, not for their own.
            tokio::time::sleep(wait.min(LONGEST_WAIT)).await;
        }
    }

    /// Spends a held token if one is left and still fresh.
    fn spend_held(&self) -> bool {
        let mut held = self.lock_held();
        let (count, fresh_until) = *held;
        if count == 0 || Instant::now() > fresh_until {
            return false;
        }
        held.0 = count - 1;
        true
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, (u32, Instant)> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
