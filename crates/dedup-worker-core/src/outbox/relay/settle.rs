//! A step's marks of the rows it did not deliver: those not sent or answered `Retry-After`
//! (deferred, their attempt given back), and the failed deliveries (one mark for the batch);
//! the attempts of the deferred rows the receiver saw are recorded too.

use std::time::Duration;

use super::gate::Stop;
use super::lane::{Failure, Lane};
use super::marks::{by_claim, lease_lost};
use super::RelayOutcome;
use crate::retry::backoff_delay;
use crate::store::{
    bounded, AttemptKind, AttemptMark, FailedMark, OutboxClaim, OutboxRow, StoreError,
};

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
