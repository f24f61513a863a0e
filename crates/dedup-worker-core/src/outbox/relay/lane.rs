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

use super::attempt::Sent;
use super::breaker::{next_probe_interval, Breaker, BreakerPolicy};
use super::gate::Gate;
use super::marks::{self, extend_outbox_leases, lease_lost};
use super::rate::LaneRate;
use super::RelayOutcome;
use crate::lease::heartbeat_period;
use crate::lease::with_lease_heartbeat;
use crate::outbox::sink::{Sink, SinkError};
use crate::store::{
    bounded, AttemptKind, AttemptLane, AttemptMark, Circuit, OutboxClaim, OutboxRow, Shard, Store,
    StoreError,
};

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
    /// Whether each delivery attempt is recorded in `outbox_attempts`.
    pub record_attempts: bool,
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
    /// The lane's destination as attempts record it (`SinkSpec`'s display: no token of a
    /// webhook URL).
    pub(super) shown: String,
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
    pub(super) unmarked: Mutex<Vec<AttemptMark>>,
    /// The lane's shard of the per-minute counts its marks add to (`activity_minutes`): taken
    /// at random once, so two lanes (or two relay processes) rarely wait on one counter row.
    shard: Shard,
}

/// A delivery that failed: its row, the sink's error, and the attempt to record.
pub(super) struct Failure {
    pub(super) row: OutboxRow,
    pub(super) error: SinkError,
    pub(super) attempt: AttemptMark,
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
        shown: String,
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
            shown,
            store,
            sink,
            options,
            unmarked: Mutex::new(Vec::new()),
            shard: Shard::random(),
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
        // Answered with `Retry-After`: deferred like rows not sent, but the receiver saw them.
        let mut throttled = Vec::new();
        for (row, sent) in rows.into_iter().zip(results) {
            let attempt = sent.attempt(&row);
            match sent.result {
                Ok(_) => delivered.push(attempt),
                Err(SinkError::NotSent) => not_sent.push(row),
                Err(SinkError::Throttled { .. }) => {
                    throttled.push(attempt);
                    not_sent.push(row);
                }
                Err(error) => failures.push(Failure {
                    row,
                    error,
                    attempt,
                }),
            }
        }
        // Deliveries are marked first: an outage now must not lose what the sink already has.
        let limit = self.options.statement_timeout;
        let mark = self
            .store
            .outbox()
            .mark_delivered(&delivered, self.attempt_lane());
        let marked = match bounded(limit, mark).await {
            Ok(marked) => marked,
            Err(error) => {
                self.lock_unmarked().extend(delivered);
                return Err(error);
            }
        };
        outcome.dispatched = usize::try_from(marked).unwrap_or(usize::MAX);
        outcome.lease_lost += lease_lost(delivered.len(), marked);
        metrics::counter!("dedup_outbox_dispatched_total").increment(marked);
        let mut probe_failed = Vec::new();
        if let Some(previous) = probe {
            let error = failures.first().map(|f| &f.error);
            self.settle_probe(previous, !delivered.is_empty(), error)
                .await?;
            // A failed probe is deferred below, its attempt given back.
            for failure in failures.drain(..) {
                probe_failed.push(failure.attempt);
                not_sent.push(failure.row);
            }
        }
        self.defer_unsent(gate.stopped(), probe, not_sent, &mut outcome)
            .await?;
        self.record_deferred(&throttled, AttemptKind::Throttled)
            .await?;
        self.record_deferred(&probe_failed, AttemptKind::ProbeFailed)
            .await?;
        self.mark_failures(failures, &mut outcome).await?;
        Ok((outcome, Rest::None))
    }

    /// Hands rows to the sink: row by row through the gate, `concurrency` at once, for a
    /// row-wise sink; as one batch admitted once otherwise.
    async fn deliver(&self, rows: &[OutboxRow], gate: &Gate) -> Vec<Sent> {
        let sink = match &self.sink {
            Ok(sink) => sink,
            Err(reason) => {
                return rows
                    .iter()
                    .map(|_| {
                        let result = Err(SinkError::Destination(reason.clone()));
                        gate.settle(&result);
                        Sent::unsent(result)
                    })
                    .collect()
            }
        };
        if !sink.row_wise() {
            if !gate.admit().await {
                return rows
                    .iter()
                    .map(|_| Sent::unsent(Err(SinkError::NotSent)))
                    .collect();
            }
            let sent = Sent::each(sink.deliver_batch(rows)).await;
            sent.iter().for_each(|sent| gate.settle(&sent.result));
            return sent;
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
        error: Option<&SinkError>,
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
        let Some(error) = error else {
            return Ok(()); // throttled: the hold below decides when to try again
        };
        let previous = (!previous.is_zero()).then_some(previous);
        let jitter = rand::random::<f64>() * 2.0 - 1.0;
        let interval = next_probe_interval(previous, &self.options.breaker, jitter);
        let error = error.to_string();
        tracing::warn!(lane = %self.label, %error, next_probe_in = ?interval, "probe failed; the circuit stays open");
        bounded(limit, sinks.probe_failed(&self.name, interval, &error)).await
    }

    /// Makes claimed rows due at once (a step abandoned at shutdown).
    pub(super) async fn give_back(&self, claims: &[OutboxClaim]) {
        marks::give_back(&self.store, &self.label, claims).await;
    }

    /// Marks what an outage left unmarked (see [`Lane::unmarked`]).
    pub(super) async fn mark_unmarked(&self) -> Result<usize, StoreError> {
        let limit = self.options.statement_timeout;
        marks::mark_unmarked(
            &self.store,
            &self.label,
            self.attempt_lane(),
            &self.unmarked,
            limit,
        )
        .await
    }

    pub(super) fn lock_breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where this lane's attempts are recorded as going.
    pub(super) fn attempt_lane(&self) -> AttemptLane<'_> {
        AttemptLane {
            lane: &self.name,
            destination: Some(&self.shown),
            record: self.options.record_attempts,
            shard: self.shard,
        }
    }

    pub(super) fn lock_unmarked(&self) -> std::sync::MutexGuard<'_, Vec<AttemptMark>> {
        // A poisoned lock only means a panic elsewhere mid-push; the ids are still valid.
        self.unmarked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One row of a row-wise sink, admitted by the gate first and told to it after.
async fn send_one(sink: &Arc<dyn Sink>, gate: &Gate, row: &OutboxRow) -> Sent {
    if !gate.admit().await {
        return Sent::unsent(Err(SinkError::NotSent));
    }
    let sent = Sent::timed(async {
        sink.deliver_batch(std::slice::from_ref(row))
            .await
            .pop()
            .unwrap_or(Err(SinkError::NotSent))
    })
    .await;
    gate.settle(&sent.result);
    sent
}
