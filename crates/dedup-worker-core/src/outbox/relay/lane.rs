//! [`Lane`]: one sink's claim → deliver → mark, on its own task, with its own batch size,
//! concurrency, rate, circuit breaker and leases, so a sink that hangs or fails holds back
//! nothing but its own rows.
//!
//! Each step first reads the lane's shared state (`outbox_sinks`, see `store/sinks.rs`):
//! * paused by hand: nothing is claimed;
//! * held by the receiver's `Retry-After`: nothing is claimed until the hold ends;
//! * circuit open: nothing is claimed; once the probe is due, one relay takes it and delivers
//!   a single row: delivered closes the circuit, failed opens it again for a doubled interval;
//! * closed: a batch is claimed and delivered through a gate (`gate.rs`).
//!
//! Attempts are counted when a row is claimed (a relay killed mid-delivery must count). A row
//! not sent because the batch stopped, a row the receiver answered with `Retry-After`, and a
//! failed probe are deferred with that attempt given back: while a sink is down or asks for
//! time, its rows keep their attempts. Ordinary failures spend theirs and back off per row.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use super::breaker::{next_probe_interval, Breaker, BreakerPolicy};
use super::gate::{Gate, Stop};
use super::marks::{self, by_claim, extend_outbox_leases, lease_lost};
use super::rate::LaneRate;
use super::RelayOutcome;
use crate::lease::heartbeat_period;
use crate::lease::with_lease_heartbeat;
use crate::outbox::sink::{Sink, SinkError};
use crate::retry::backoff_delay;
use crate::store::{bounded, Circuit, OutboxClaim, OutboxRow, Store, StoreError};

/// The longest a waiting lane sleeps before it reads its shared state again, so an operator's
/// `resume` is seen within about this long even while a probe is minutes away.
const STATE_READ_EVERY: Duration = Duration::from_secs(1);

/// One lane's settings: `[outbox]`'s, with its `[outbox.sinks.NAME]` applied.
#[derive(Debug, Clone)]
pub struct LaneOptions {
    pub batch_size: usize,
    /// Deliveries in flight at once (row-wise sinks).
    pub concurrency: usize,
    pub poll_interval: Duration,
    pub lease: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// The longest any one store call waits (`database.statement_timeout`).
    pub statement_timeout: Duration,
    /// The longest a receiver's `Retry-After` holds the lane.
    pub max_retry_after: Duration,
    pub breaker: BreakerPolicy,
    /// Deliveries a second and burst; `None`: unpaced.
    pub rate: Option<(f64, u32)>,
    /// Rows of one ordering key are claimed one at a time, in id order (`ordered = true`).
    pub ordered: bool,
}

/// What a lane does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rest {
    /// It claimed rows: step again at once.
    None,
    /// Nothing due: wait for a wake-up or the poll interval.
    Idle,
    /// Paused, held or open: read the state again after this (a wake-up does not cut it short).
    For(Duration),
}

/// One sink's lane (see the module's doc).
pub struct Lane {
    /// The lane's name in the store (`outbox.sink` column): `default`, a configured sink's
    /// name, or an ad-hoc destination spec.
    pub(super) name: String,
    /// The lane as logs and metrics show it: the name, or for an ad-hoc spec (which may hold
    /// a token) `~` and a hash of it.
    pub(super) label: String,
    pub(super) store: Store,
    /// The sink, or why it could not be built (every row then fails with that reason, and the
    /// breaker opens on them like on any failure).
    sink: Result<Arc<dyn Sink>, Arc<dyn std::error::Error + Send + Sync>>,
    pub(super) options: LaneOptions,
    /// This process's count of the lane's outcomes (the open state itself is shared).
    breaker: Arc<Mutex<Breaker>>,
    /// Shared by the lane's batches, and through the store by every relay process, so the
    /// rate holds across them.
    rate: Option<Arc<LaneRate>>,
    /// Rows the sink accepted whose `dispatched` mark did not reach the store (an outage
    /// between delivering and marking), marked before the next claim so a store blip does not
    /// turn into a second delivery when their lease runs out.
    pub(super) unmarked: Mutex<Vec<OutboxClaim>>,
}

/// A claimed batch and how it was claimed.
pub(super) struct Batch {
    pub(super) rows: Vec<OutboxRow>,
    /// `Some(previous interval)`: a probe of an open circuit.
    probe: Option<Duration>,
    /// When the claim was sent: its lease runs out `lease` after this at the latest.
    claimed_at: Instant,
}

impl Lane {
    pub(super) fn new(
        name: String,
        label: String,
        store: Store,
        sink: Result<Arc<dyn Sink>, Arc<dyn std::error::Error + Send + Sync>>,
        options: LaneOptions,
    ) -> Self {
        Lane {
            breaker: Arc::new(Mutex::new(Breaker::new(options.breaker.clone()))),
            rate: options.rate.map(|(rate, burst)| {
                Arc::new(LaneRate::new(
                    store.clone(),
                    name.clone(),
                    rate,
                    burst,
                    options.statement_timeout,
                ))
            }),
            name,
            label,
            store,
            sink,
            options,
            unmarked: Mutex::new(Vec::new()),
        }
    }

    /// One step: reads the lane's state, claims what it allows, delivers and marks it.
    pub async fn try_step(&self) -> Result<(RelayOutcome, Rest), StoreError> {
        let (outcome, batch) = self.claim().await?;
        match batch {
            Ok(batch) => self.deliver_and_mark(batch, outcome).await,
            Err(rest) => Ok((outcome, rest)),
        }
    }

    /// Marks what an earlier step left unmarked, reads the lane's state and claims what it
    /// allows: a batch, one probe row, or nothing and how long to rest.
    pub(super) async fn claim(&self) -> Result<(RelayOutcome, Result<Batch, Rest>), StoreError> {
        let limit = self.options.statement_timeout;
        let mut outcome = RelayOutcome {
            lease_lost: self.mark_unmarked().await?,
            ..RelayOutcome::default()
        };
        let state = bounded(limit, self.store.sinks().gate(&self.name)).await?;
        let rest = |d: Duration| Err(Rest::For(d.min(STATE_READ_EVERY)));
        if state.paused {
            return Ok((outcome, rest(self.options.poll_interval)));
        }
        if let Some(held) = state.held_for() {
            return Ok((outcome, rest(held)));
        }
        let (max, probe) = match state.circuit {
            Circuit::Closed => (self.options.batch_size, None),
            Circuit::Open | Circuit::HalfOpen => {
                // Another process may have opened it: this one's count starts afresh.
                self.lock_breaker().reset();
                let wait = state.probe_in();
                if !wait.is_zero() {
                    return Ok((outcome, rest(wait)));
                }
                let lease = self.options.lease;
                match bounded(limit, self.store.sinks().take_probe(&self.name, lease)).await? {
                    Some(previous) => (1, Some(previous)),
                    None => return Ok((outcome, rest(self.options.poll_interval))),
                }
            }
        };
        let lease = self.options.lease;
        // Before the claim is sent: the lease runs from no later than this.
        let claimed_at = Instant::now();
        let rows = bounded(
            limit,
            self.store
                .outbox()
                .claim_lane(&self.name, max, lease, self.options.ordered),
        )
        .await?;
        outcome.claimed = rows.len();
        if rows.is_empty() {
            if let Some(previous) = probe {
                // Nothing to probe with: the circuit stays open, probed again later.
                let interval = previous.max(self.options.breaker.probe_after);
                let store = self.store.sinks();
                bounded(
                    limit,
                    store.probe_failed(&self.name, interval, "no row to probe with"),
                )
                .await?;
            }
            return Ok((outcome, Err(Rest::Idle)));
        }
        Ok((
            outcome,
            Ok(Batch {
                rows,
                probe,
                claimed_at,
            }),
        ))
    }

    /// Delivers a batch, extending its leases every third of a lease meanwhile, then marks it.
    /// The heartbeat stops before the marks: an extension landing after a failed delivery's
    /// mark would overwrite its backoff.
    pub(super) async fn deliver_and_mark(
        &self,
        batch: Batch,
        mut outcome: RelayOutcome,
    ) -> Result<(RelayOutcome, Rest), StoreError> {
        let Batch {
            rows,
            probe,
            claimed_at,
        } = batch;
        let held = Arc::new(Mutex::new(
            rows.iter().map(OutboxRow::claim).collect::<Vec<_>>(),
        ));
        let lease = self.options.lease;
        let gate = Arc::new(Gate::new(
            self.rate.clone(),
            probe.is_none().then(|| self.breaker.clone()),
            claimed_at + lease,
        ));
        let results = with_lease_heartbeat(
            "outbox",
            heartbeat_period(lease),
            self.deliver(&rows, &gate),
            || {
                let (store, held, gate) = (self.store.clone(), held.clone(), gate.clone());
                async move {
                    let asked = Instant::now();
                    if extend_outbox_leases(&store, &held, lease).await {
                        gate.lease_extended(asked + lease);
                    }
                }
            },
        )
        .await;
        let mut delivered = Vec::new();
        let mut failures = Vec::new();
        let mut not_sent = Vec::new();
        for (row, result) in rows.into_iter().zip(results) {
            match result {
                Ok(()) => delivered.push(row.claim()),
                Err(SinkError::NotSent | SinkError::Throttled { .. }) => not_sent.push(row),
                Err(error) => failures.push((row, error)),
            }
        }
        // Deliveries are marked first: an outage now must not lose what the sink already has.
        let limit = self.options.statement_timeout;
        let marked = match bounded(limit, self.store.outbox().mark_dispatched(&delivered)).await {
            Ok(marked) => marked,
            Err(error) => {
                self.lock_unmarked().extend_from_slice(&delivered);
                return Err(error);
            }
        };
        outcome.dispatched = usize::try_from(marked).unwrap_or(usize::MAX);
        outcome.lease_lost += lease_lost(delivered.len(), marked);
        metrics::counter!("dedup_outbox_dispatched_total").increment(marked);
        if let Some(previous) = probe {
            self.settle_probe(previous, !delivered.is_empty(), &mut failures)
                .await?;
            // A failed probe is deferred below, its attempt given back.
            not_sent.extend(failures.drain(..).map(|(row, _)| row));
        }
        self.defer_unsent(gate.stopped(), probe, not_sent, &mut outcome)
            .await?;
        self.mark_failures(failures, &mut outcome).await?;
        Ok((outcome, Rest::None))
    }

    /// Hands rows to the sink: row by row through the gate, `concurrency` at once, for a
    /// row-wise sink; as one batch admitted once otherwise.
    async fn deliver(&self, rows: &[OutboxRow], gate: &Gate) -> Vec<Result<(), SinkError>> {
        let sink = match &self.sink {
            Ok(sink) => sink,
            Err(reason) => {
                return rows
                    .iter()
                    .map(|_| {
                        let result = Err(SinkError::Destination(reason.clone()));
                        gate.settle(&result);
                        result
                    })
                    .collect()
            }
        };
        if !sink.row_wise() {
            if !gate.admit().await {
                return rows.iter().map(|_| Err(SinkError::NotSent)).collect();
            }
            let results = sink.deliver_batch(rows).await;
            results.iter().for_each(|result| gate.settle(result));
            return results;
        }
        // Futures collected first: a closure in `map` over a stream trips the higher-ranked
        // lifetime check of the spawned task's Send bound.
        let sends: Vec<_> = rows.iter().map(|row| send_one(sink, gate, row)).collect();
        stream::iter(sends)
            .buffered(self.options.concurrency)
            .collect()
            .await
    }

    /// A probe's answer: delivered closes the circuit; failed opens it again for a doubled
    /// interval (±20 %).
    async fn settle_probe(
        &self,
        previous: Duration,
        delivered: bool,
        failures: &mut [(OutboxRow, SinkError)],
    ) -> Result<(), StoreError> {
        let limit = self.options.statement_timeout;
        let sinks = self.store.sinks();
        if delivered {
            self.lock_breaker().reset();
            if bounded(limit, sinks.close(&self.name)).await? {
                tracing::info!(lane = %self.label, "circuit closed: the probe was delivered");
                metrics::counter!("dedup_outbox_circuit_transitions_total", "lane" => self.label.clone(), "to" => "closed").increment(1);
            }
            return Ok(());
        }
        let Some((_, error)) = failures.first() else {
            return Ok(()); // throttled: the hold below decides when to try again
        };
        let previous = (!previous.is_zero()).then_some(previous);
        let jitter = rand::random::<f64>() * 2.0 - 1.0;
        let interval = next_probe_interval(previous, &self.options.breaker, jitter);
        let error = error.to_string();
        tracing::warn!(lane = %self.label, %error, next_probe_in = ?interval, "probe failed; the circuit stays open");
        bounded(limit, sinks.probe_failed(&self.name, interval, &error)).await
    }

    /// Rows claimed and not sent, or answered with `Retry-After`: due again when the lane may
    /// send, their attempt given back. A `Retry-After` holds the lane for every relay; a trip
    /// opens the circuit for every relay.
    async fn defer_unsent(
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
    /// limit.
    async fn mark_failures(
        &self,
        failures: Vec<(OutboxRow, SinkError)>,
        outcome: &mut RelayOutcome,
    ) -> Result<(), StoreError> {
        let limit = self.options.statement_timeout;
        for (row, error) in failures {
            outcome.failed_attempts += 1;
            let attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
            let delay = backoff_delay(self.options.retry_base, self.options.retry_max, attempts);
            tracing::warn!(lane = %self.label, outbox_id = row.id, source = %row.source, event_id = %row.event_id, event_type = %row.event_type, attempts, %error, ?delay, "delivery failed");
            // If this mark is lost, the row is simply retried when its lease ends.
            let marked = bounded(
                limit,
                self.store.outbox().mark_delivery_failed(
                    row.claim(),
                    &error.to_string(),
                    delay,
                    self.options.max_attempts,
                ),
            )
            .await?;
            if marked == 0 {
                tracing::warn!(outbox_id = row.id, source = %row.source, event_id = %row.event_id, event_type = %row.event_type, "lease lost; another relay owns the row");
                metrics::counter!("dedup_outbox_lease_lost_total").increment(1);
                outcome.lease_lost += 1;
            }
        }
        metrics::counter!("dedup_outbox_delivery_failures_total")
            .increment(outcome.failed_attempts as u64);
        Ok(())
    }

    /// Makes claimed rows due at once (a step abandoned at shutdown).
    pub(super) async fn give_back(&self, claims: &[OutboxClaim]) {
        marks::give_back(&self.store, &self.label, claims).await;
    }

    /// Marks what an outage left unmarked (see [`Lane::unmarked`]).
    pub(super) async fn mark_unmarked(&self) -> Result<usize, StoreError> {
        let limit = self.options.statement_timeout;
        marks::mark_unmarked(&self.store, &self.label, &self.unmarked, limit).await
    }

    fn lock_breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn lock_unmarked(&self) -> std::sync::MutexGuard<'_, Vec<OutboxClaim>> {
        // A poisoned lock only means a panic elsewhere mid-push; the ids are still valid.
        self.unmarked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One row of a row-wise sink, admitted by the gate first and told to it after.
async fn send_one(sink: &Arc<dyn Sink>, gate: &Gate, row: &OutboxRow) -> Result<(), SinkError> {
    if !gate.admit().await {
        return Err(SinkError::NotSent);
    }
    let result = sink
        .deliver_batch(std::slice::from_ref(row))
        .await
        .pop()
        .unwrap_or(Err(SinkError::NotSent));
    gate.settle(&result);
    result
}
