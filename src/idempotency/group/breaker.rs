//! A writer's circuit breaker: while PostgreSQL cannot be reached, fail groups at once.
//!
//! An unreachable server costs each attempt up to a statement timeout (a host that stopped
//! answering), and every group queued behind it would wait as long again. So after a group could
//! not reach PostgreSQL (connecting failed, the connection broke, the statement timed out), the
//! groups that queue up meanwhile are refused with that error, without a statement or a
//! connection attempt each. It stays open for a backoff that grows with each failed attempt
//! (0.5 s up to 4 s, with jitter), then the next group tries again; the first statement that goes
//! through closes it. A statement that failed with the server answering does not open it: the
//! server is there, only that statement was wrong.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::idempotency::records::StoreError;
use crate::retry::backoff_delay;

/// How long a writer's breaker stays open after the first failure to reach PostgreSQL; doubled
/// (with jitter) for each further failed attempt.
const BREAKER_FIRST_OPEN: Duration = Duration::from_millis(500);
/// The longest it stays open (before jitter): how long, at most, requests keep being refused
/// after PostgreSQL is back.
const BREAKER_MAX_OPEN: Duration = Duration::from_secs(4);

/// A writer's circuit breaker. While PostgreSQL cannot be reached, each attempt costs up to a
/// statement timeout (a host that stopped answering) and every group queued behind it would
/// wait as long again; while open, those groups are told at once.
#[derive(Default)]
pub(super) struct Breaker {
    /// Attempts in a row that could not reach PostgreSQL: sets how long it stays open.
    failures: u32,
    /// While open: until when, and the error that opened it (what each refused group is told).
    open: Option<(Instant, Arc<StoreError>)>,
}

impl Breaker {
    /// The error to fail a group with instead of trying, while open.
    pub(super) fn refusal(&self) -> Option<Arc<StoreError>> {
        match &self.open {
            Some((until, error)) if Instant::now() < *until => Some(error.clone()),
            _ => None,
        }
    }

    /// A statement went through, or failed with the server answering: PostgreSQL is reachable.
    pub(super) fn reached(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                failed_attempts = self.failures,
                "idempotency store reachable again"
            );
        }
        self.failures = 0;
        self.open = None;
    }

    /// An attempt could not reach PostgreSQL: open for the next backoff.
    pub(super) fn unreachable(&mut self, error: Arc<StoreError>) {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_delay(BREAKER_FIRST_OPEN, BREAKER_MAX_OPEN, self.failures);
        tracing::warn!(
            %error,
            failed_attempts = self.failures,
            open_for_ms = wait.as_millis() as u64,
            "idempotency store unreachable; failing grouped requests at once until the next attempt"
        );
        self.open = Some((Instant::now() + wait, error));
    }
}
