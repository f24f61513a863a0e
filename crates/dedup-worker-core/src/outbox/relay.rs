//! The outbox relay: claim, deliver, mark. One step is [`Relay::try_step`]; [`Relay::run`]
//! repeats it, waking on NOTIFY (PostgreSQL) or the in-process signal, with a polling fallback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::sink::{build_sink, Sink, SinkError};
use crate::config::SinkSpec;
use crate::lease::{heartbeat_period, report_failed, report_lost, with_lease_heartbeat};
use crate::retry::backoff_delay;
use crate::signature::secrets::SigningSecret;
use crate::store::{bounded, OutboxClaim, OutboxRow, Store, StoreError, Wakeups};

/// The longest a give-back or a last mark at shutdown may take.
const OUTSIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Relay options (see `[outbox]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The sink for rows without a destination of their own.
    pub default_sink: SinkSpec,
    pub batch_size: usize,
    pub concurrency: usize,
    pub poll_interval: Duration,
    /// A claimed row not finished within this is claimed again (by any relay). The relay
    /// extends it every third of it while it delivers, so it need not cover a slow batch.
    pub lease: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub http_timeout: Duration,
    /// Standard Webhooks secrets and ed25519 keys signing every HTTP delivery
    /// (`outbox.signing_secret`); empty: unsigned.
    pub signing_secrets: Arc<[SigningSecret]>,
    /// The longest a claim or a mark waits for the store (`database.statement_timeout`): a
    /// database that stops answering fails the step, which backs off and tries again.
    pub statement_timeout: Duration,
}

/// What one step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayOutcome {
    pub claimed: usize,
    /// Rows marked dispatched (delivered and still under this relay's claim).
    pub dispatched: usize,
    pub failed_attempts: usize,
    /// Rows whose mark changed nothing: this relay's lease expired and another relay claimed
    /// them meanwhile (a slow sink, a paused process). That relay's delivery decides them.
    pub lease_lost: usize,
}

pub struct Relay {
    store: Store,
    wakeups: Arc<Wakeups>,
    options: RelayOptions,
    /// Sinks built so far, by destination spec (`None`: the default sink).
    sinks: Mutex<HashMap<Option<String>, Arc<dyn Sink>>>,
    /// Rows the sink accepted whose `dispatched` mark did not reach the store (an outage
    /// between delivering and marking). They are marked before the next claim, so a store blip
    /// does not turn into a second delivery when their lease runs out. Bounded by one batch:
    /// while marking fails, claiming fails too.
    unmarked: std::sync::Mutex<Vec<OutboxClaim>>,
}

impl Relay {
    pub fn new(store: Store, wakeups: Arc<Wakeups>, options: RelayOptions) -> Self {
        Relay {
            store,
            wakeups,
            options,
            sinks: Mutex::new(HashMap::new()),
            unmarked: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Repeats [`Self::try_step`] until `shutdown`; waits for a wake-up or the poll interval
    /// when there is nothing due. A step in progress at shutdown is finished (its deliveries
    /// answered and marked) unless `abandon` comes first (the grace period is nearly over):
    /// then its deliveries are dropped and its rows not yet marked are made due at once, so
    /// the next relay, or this one restarted, delivers them without waiting out their lease.
    pub async fn run(self, shutdown: CancellationToken, abandon: CancellationToken) {
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let notified = self.wakeups.outbox.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let stepped = match self.claim().await {
                Err(error) => Err(error),
                Ok((outcome, rows)) => {
                    let claims: Vec<OutboxClaim> = rows.iter().map(OutboxRow::claim).collect();
                    let finished = tokio::select! {
                        stepped = self.deliver_and_mark(rows, outcome) => Some(stepped),
                        _ = abandon.cancelled() => None,
                    };
                    let Some(stepped) = finished else {
                        self.give_back(&claims).await;
                        break;
                    };
                    stepped
                }
            };
            let idle = match stepped {
                Ok(outcome) => {
                    failures = 0;
                    outcome.claimed == 0
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(%error, "relay step failed");
                    let delay = backoff_delay(
                        Duration::from_millis(100),
                        Duration::from_secs(10),
                        failures,
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(delay) => {}
                    }
                    false
                }
            };
            if idle {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(self.options.poll_interval) => {}
                }
            }
        }
        // Deliveries an outage left unmarked: one more try, or they are delivered again after
        // their lease.
        if !self.lock_unmarked().is_empty() {
            let _ = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, self.mark_unmarked()).await;
        }
        tracing::debug!("relay stopped");
    }

    /// Claims one batch of due rows and delivers it. Rows delivered by an earlier step whose
    /// mark was lost are marked first.
    pub async fn try_step(&self) -> Result<RelayOutcome, StoreError> {
        let (outcome, rows) = self.claim().await?;
        self.deliver_and_mark(rows, outcome).await
    }

    /// Marks what an earlier step left unmarked, then claims a batch of due rows.
    async fn claim(&self) -> Result<(RelayOutcome, Vec<OutboxRow>), StoreError> {
        let mut outcome = RelayOutcome {
            lease_lost: self.mark_unmarked().await?,
            ..RelayOutcome::default()
        };
        let rows = bounded(
            self.options.statement_timeout,
            self.store
                .outbox()
                .claim(self.options.batch_size, self.options.lease),
        )
        .await?;
        outcome.claimed = rows.len();
        Ok((outcome, rows))
    }

    /// Delivers claimed rows, extending their lease every third of it meanwhile, then marks
    /// them. The heartbeat stops before the marks: an extension landing after a failed
    /// delivery's mark would overwrite its backoff.
    async fn deliver_and_mark(
        &self,
        rows: Vec<OutboxRow>,
        mut outcome: RelayOutcome,
    ) -> Result<RelayOutcome, StoreError> {
        if rows.is_empty() {
            return Ok(outcome);
        }
        let held = Arc::new(std::sync::Mutex::new(
            rows.iter().map(OutboxRow::claim).collect::<Vec<_>>(),
        ));
        let lease = self.options.lease;
        let (delivered, failures) = with_lease_heartbeat(
            "outbox",
            heartbeat_period(lease),
            self.deliver(rows),
            || {
                let (store, held) = (self.store.clone(), held.clone());
                async move { extend_outbox_leases(&store, &held, lease).await }
            },
        )
        .await;
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
        for (row, error) in failures {
            outcome.failed_attempts += 1;
            let attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
            let delay = backoff_delay(self.options.retry_base, self.options.retry_max, attempts);
            tracing::warn!(outbox_id = row.id, source = %row.source, event_id = %row.event_id, event_type = %row.event_type, attempts, %error, ?delay, "delivery failed");
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
        Ok(outcome)
    }

    /// Delivers rows, grouped by destination; returns the claims delivered and the failures.
    async fn deliver(
        &self,
        rows: Vec<OutboxRow>,
    ) -> (Vec<OutboxClaim>, Vec<(OutboxRow, SinkError)>) {
        let mut by_destination: HashMap<Option<String>, Vec<OutboxRow>> = HashMap::new();
        for row in rows {
            by_destination
                .entry(row.destination.clone())
                .or_default()
                .push(row);
        }
        let mut delivered = Vec::new();
        let mut failures = Vec::new();
        for (destination, rows) in by_destination {
            let results = match self.sink_for(&destination).await {
                Ok(sink) => sink.deliver_batch(&rows).await,
                Err(reason) => rows
                    .iter()
                    .map(|_| Err(SinkError::Destination(reason.clone())))
                    .collect(),
            };
            for (row, result) in rows.into_iter().zip(results) {
                match result {
                    Ok(()) => delivered.push(row.claim()),
                    Err(error) => failures.push((row, error)),
                }
            }
        }
        (delivered, failures)
    }

    /// Makes claimed rows due at once (a step abandoned at shutdown). What cannot be given back
    /// is delivered after its lease.
    async fn give_back(&self, claims: &[OutboxClaim]) {
        let mut released = 0;
        for (claim_token, ids) in by_claim(claims) {
            match tokio::time::timeout(
                OUTSIDE_CALL_TIMEOUT,
                self.store.outbox().release_leases(claim_token, &ids),
            )
            .await
            {
                Ok(Ok(rows)) => released += rows,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "could not give claimed rows back; they are delivered after their lease")
                }
                Err(_) => tracing::warn!(
                    "giving claimed rows back timed out; they are delivered after their lease"
                ),
            }
        }
        tracing::warn!(
            released,
            "shutdown grace period over mid-delivery; the rows not yet marked were given back"
        );
    }

    /// Marks the rows a failed step delivered but could not mark; they stay remembered until
    /// the store takes the mark. Returns how many had been claimed by another relay meanwhile
    /// (the outage outlasted the lease): their marks change nothing, that relay decides them.
    /// A mark that did commit although the step saw an error counts as marked again.
    async fn mark_unmarked(&self) -> Result<usize, StoreError> {
        let claims = std::mem::take(&mut *self.lock_unmarked());
        if claims.is_empty() {
            return Ok(0);
        }
        let limit = self.options.statement_timeout;
        match bounded(limit, self.store.outbox().mark_dispatched(&claims)).await {
            Ok(marked) => {
                metrics::counter!("dedup_outbox_dispatched_total").increment(marked);
                tracing::info!(rows = marked, "marked deliveries an outage left unmarked");
                Ok(lease_lost(claims.len(), marked))
            }
            Err(error) => {
                self.lock_unmarked().extend_from_slice(&claims);
                Err(error)
            }
        }
    }

    fn lock_unmarked(&self) -> std::sync::MutexGuard<'_, Vec<OutboxClaim>> {
        // A poisoned lock only means a panic elsewhere mid-push; the ids are still valid.
        self.unmarked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn sink_for(
        &self,
        destination: &Option<String>,
    ) -> Result<Arc<dyn Sink>, Arc<dyn std::error::Error + Send + Sync>> {
        let mut sinks = self.sinks.lock().await;
        if let Some(sink) = sinks.get(destination) {
            return Ok(sink.clone());
        }
        let spec = match destination {
            None => self.options.default_sink.clone(),
            Some(spec) => SinkSpec::parse(spec).map_err(|e| Arc::new(e) as Arc<_>)?,
        };
        let sink: Arc<dyn Sink> = build_sink(
            &spec,
            self.options.http_timeout,
            self.options.concurrency,
            &self.options.signing_secrets,
        )
        .await
        .map_err(|e| Arc::new(e) as Arc<_>)?
        .into();
        sinks.insert(destination.clone(), sink.clone());
        Ok(sink)
    }
}

/// Claimed rows by claim token (one claim, one token; grouped anyway).
fn by_claim(claims: &[OutboxClaim]) -> HashMap<i64, Vec<i64>> {
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
async fn extend_outbox_leases(
    store: &Store,
    held: &std::sync::Mutex<Vec<OutboxClaim>>,
    lease: Duration,
) {
    let claims = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut extended = std::collections::HashSet::new();
    for (claim_token, ids) in by_claim(&claims) {
        match store.outbox().extend_leases(claim_token, &ids, lease).await {
            Ok(ids) => extended.extend(ids.into_iter().map(|id| (id, claim_token))),
            Err(error) => return report_failed("outbox", &error),
        }
    }
    let lost = claims.len() - extended.len();
    report_lost("outbox", lost);
    if lost > 0 {
        held.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|c| extended.contains(&(c.id, c.claim_token)));
    }
}

/// Of `attempted` marks, those that changed nothing (`marked` counts the rest): logged and
/// counted, not an error, since the relay that owns the rows now finishes them.
fn lease_lost(attempted: usize, marked: u64) -> usize {
    let lost = attempted.saturating_sub(usize::try_from(marked).unwrap_or(usize::MAX));
    if lost > 0 {
        tracing::warn!(rows = lost, "lease lost; another relay owns the row");
        metrics::counter!("dedup_outbox_lease_lost_total").increment(lost as u64);
    }
    lost
}
