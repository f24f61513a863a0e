//! Marks a lane makes outside its step's happy path: deliveries an outage left unmarked, rows
//! given back at shutdown, and the leases its heartbeat extends; and a step's marks of rows not
//! sent (deferred) and of failed deliveries.

use std::collections::HashMap;
use std::time::Duration;

use std::sync::Mutex;

use super::gate::Stop;
use super::lane::{Failure, Lane};
use super::RelayOutcome;
use crate::lease::{report_failed, report_lost};
use crate::retry::backoff_delay;
use crate::store::{
    bounded, AttemptKind, AttemptLane, AttemptMark, FailedMark, OutboxClaim, OutboxRow, Store,
    StoreError,
};

/// The longest a give-back or a last mark at shutdown may take.
pub(super) const OUTSIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes claimed rows due at once (a step abandoned at shutdown). What cannot be given back is
/// delivered after its lease.
pub(super) async fn give_back(store: &Store, label: &str, claims: &[OutboxClaim]) {
    let mut released = 0;
    for (claim_token, ids) in by_claim(claims) {
        match tokio::time::timeout(
            OUTSIDE_CALL_TIMEOUT,
            store.outbox().release_leases(claim_token, &ids),
        )
        .await
        {
            Ok(Ok(rows)) => released += rows,
            Ok(Err(error)) => {
                tracing::warn!(lane = %label, %error, "could not give claimed rows back; they are delivered after their lease")
            }
            Err(_) => tracing::warn!(
                lane = %label,
                "giving claimed rows back timed out; they are delivered after their lease"
            ),
        }
    }
    tracing::warn!(
        lane = %label,
        released,
        "shutdown grace period over mid-delivery; the rows not yet marked were given back"
    );
}

/// Marks the rows a failed step delivered but could not mark (`unmarked`); they stay remembered
/// until the store takes the mark. Returns how many had been claimed by another relay meanwhile
/// (the outage outlasted the lease): their marks change nothing, that relay decides them. A
/// mark that did commit although the step saw an error counts as marked again.
pub(super) async fn mark_unmarked(
    store: &Store,
    label: &str,
    lane: AttemptLane<'_>,
    unmarked: &Mutex<Vec<AttemptMark>>,
    limit: Duration,
) -> Result<usize, StoreError> {
    let lock = || {
        unmarked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let claims = std::mem::take(&mut *lock());
    if claims.is_empty() {
        return Ok(0);
    }
    // Recorded once: a mark that did commit left its rows dispatched under this claim, which
    // the statement skips.
    match bounded(limit, store.outbox().mark_delivered(&claims, lane)).await {
        Ok(marked) => {
            metrics::counter!("dedup_outbox_dispatched_total").increment(marked);
            tracing::info!(lane = %label, rows = marked, "marked deliveries an outage left unmarked");
            Ok(lease_lost(claims.len(), marked))
        }
        Err(error) => {
            lock().extend(claims);
            Err(error)
        }
    }
}

/// Claimed rows by claim token (one claim, one token; grouped anyway).
pub(super) fn by_claim(claims: &[OutboxClaim]) -> HashMap<i64, Vec<i64>> {
    let mut by_token: HashMap<i64, Vec<i64>> = HashMap::new();
    for claim in claims {
        by_token
            .entry(claim.claim_token)
            .or_default()
            .push(claim.id);
    }
    by_token
}

/// One heartbeat: extends the leases of the rows in `held`, and forgets those found lost
/// (another relay claimed them after this one's lease lapsed; its delivery decides them).
pub(super) async fn extend_outbox_leases(
    store: &Store,
    held: &std::sync::Mutex<Vec<OutboxClaim>>,
    lease: Duration,
) -> bool {
    let claims = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut extended = std::collections::HashSet::new();
    for (claim_token, ids) in by_claim(&claims) {
        match store.outbox().extend_leases(claim_token, &ids, lease).await {
            Ok(ids) => extended.extend(ids.into_iter().map(|id| (id, claim_token))),
            Err(error) => {
                report_failed("outbox", &error);
                return false;
            }
        }
    }
    let lost = claims.len() - extended.len();
    report_lost("outbox", lost);
    if lost > 0 {
        held.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|c| extended.contains(&(c.id, c.claim_token)));
    }
    true
}

/// Of `attempted` marks, those that changed nothing (`marked` counts the rest): logged and
/// counted, not an error, since the relay that owns the rows now finishes them.
pub(super) fn lease_lost(attempted: usize, marked: u64) -> usize {
    let lost = attempted.saturating_sub(usize::try_from(marked).unwrap_or(usize::MAX));
    if lost > 0 {
        tracing::warn!(rows = lost, "lease lost; another relay owns the row");
        metrics::counter!("dedup_outbox_lease_lost_total").increment(lost as u64);
    }
    lost
}

impl Lane {
    /// Rows claimed and not sent, or answered with `Retry-After`: due again when the lane may
    /// send, their attempt given back. A `Retry-After` holds the lane for every relay; a trip
    /// opens the circuit for every relay.
    pub(super) async fn defer_unsent(
        &self,
        stop: Option<Stop>,
        probe: Option<Duration>,
        rows: Vec<OutboxRow>,
        outcome: &mut RelayOutcome,
    ) -> Result<(), StoreError> {
        let limit = self.options.statement_timeout;
        let sinks = self.store.sinks();
        let (delay, reason, why) = match stop {
            Some(Stop::Throttled(asked)) => {
                let delay = asked.min(self.options.max_retry_after);
                if asked > delay {
                    tracing::warn!(lane = %self.label, asked = ?asked, held = ?delay, "the receiver's Retry-After is longer than outbox.max_retry_after; holding the lane for that");
                }
                tracing::info!(lane = %self.label, held = ?delay, "the receiver asked to retry later; lane held");
                bounded(limit, sinks.hold(&self.name, delay)).await?;
                let reason = format!(
                    "held: the receiver asked to retry after {}s",
                    delay.as_secs()
                );
                (delay, reason, "retry_after")
            }
            Some(Stop::Tripped { reason, error }) => {
                let probe_after = self.options.breaker.probe_after;
                let text = format!("{reason}; last: {error}");
                self.lock_breaker().reset();
                if let Some(trips) =
                    bounded(limit, sinks.trip(&self.name, probe_after, &text)).await?
                {
                    tracing::warn!(lane = %self.label, trips, %reason, %error, "circuit opened");
                    metrics::counter!("dedup_outbox_circuit_transitions_total", "lane" => self.label.clone(), "to" => "open").increment(1);
                }
                (probe_after, format!("circuit open: {text}"), "circuit")
            }
            None if rows.is_empty() => return Ok(()),
            None if probe.is_some() => {
                let state = bounded(limit, sinks.gate(&self.name)).await?;
                let delay = state.probe_in();
                let error = state.last_error.unwrap_or_default();
                (delay, format!("circuit open: {error}"), "circuit")
            }
            None => (Duration::ZERO, "not sent".to_owned(), "not_sent"),
        };
        let claims: Vec<OutboxClaim> = rows.iter().map(OutboxRow::claim).collect();
        for (claim_token, ids) in by_claim(&claims) {
            let deferred = self.store.outbox().defer(claim_token, &ids, delay, &reason);
            let deferred = bounded(limit, deferred).await?;
            outcome.deferred += usize::try_from(deferred).unwrap_or(usize::MAX);
            metrics::counter!("dedup_outbox_deferred_total", "lane" => self.label.clone(), "reason" => why).increment(deferred);
        }
        Ok(())
    }

    /// Ordinary failures: each spends its attempt and backs off, or is marked failed after the
    /// limit; one statement for the batch's failures, each attempt recorded.
    pub(super) async fn mark_failures(
        &self,
        failures: Vec<Failure>,
        outcome: &mut RelayOutcome,
    ) -> Result<(), StoreError> {
        if failures.is_empty() {
            return Ok(());
        }
        let limit = self.options.statement_timeout;
        let marks: Vec<FailedMark> = failures
            .into_iter()
            .map(|Failure { row, error, attempt }| {
                let attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
                let delay =
                    backoff_delay(self.options.retry_base, self.options.retry_max, attempts);
                tracing::warn!(lane = %self.label, outbox_id = row.id, source = %row.source, event_id = %row.event_id, event_type = %row.event_type, attempts, %error, ?delay, "delivery failed");
                FailedMark {
                    attempt,
                    delay,
                    max_attempts: self.options.max_attempts,
                }
            })
            .collect();
        outcome.failed_attempts += marks.len();
        metrics::counter!("dedup_outbox_delivery_failures_total").increment(marks.len() as u64);
        // If this mark is lost, the rows are simply retried when their lease ends.
        let mark = self.store.outbox().mark_failed(&marks, self.attempt_lane());
        let marked = bounded(limit, mark).await?;
        outcome.lease_lost += lease_lost(marks.len(), marked);
        Ok(())
    }

    /// Records the attempts of rows deferred with their attempt given back (`throttled`,
    /// `probe_failed`): the receiver saw them.
    pub(super) async fn record_deferred(
        &self,
        attempts: &[AttemptMark],
        kind: AttemptKind,
    ) -> Result<(), StoreError> {
        if attempts.is_empty() {
            return Ok(());
        }
        let limit = self.options.statement_timeout;
        let record = self
            .store
            .outbox()
            .record_attempts(attempts, kind, self.attempt_lane());
        bounded(limit, record).await?;
        Ok(())
    }
}
