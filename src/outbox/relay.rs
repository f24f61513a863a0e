//! The outbox relay: claim, deliver, mark. One step is [`Relay::try_step`]; [`Relay::run`]
//! repeats it, waking on NOTIFY (PostgreSQL) or the in-process signal, with a polling fallback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::sink::{build_sink, Sink, SinkError, SinkSpec};
use crate::retry::backoff_delay;
use crate::store::{OutboxRow, Store, StoreError, Wakeups};

/// Relay options (see `[outbox]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The sink for rows without a destination of their own.
    pub default_sink: SinkSpec,
    pub batch_size: usize,
    pub concurrency: usize,
    pub poll_interval: Duration,
    /// A claimed row not finished within this is claimed again (by any relay).
    pub lease: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub http_timeout: Duration,
}

/// What one step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayOutcome {
    pub claimed: usize,
    pub dispatched: usize,
    pub failed_attempts: usize,
}

pub struct Relay {
    store: Store,
    wakeups: Arc<Wakeups>,
    options: RelayOptions,
    /// Sinks built so far, by destination spec (`None`: the default sink).
    sinks: Mutex<HashMap<Option<String>, Arc<dyn Sink>>>,
}

impl Relay {
    pub fn new(store: Store, wakeups: Arc<Wakeups>, options: RelayOptions) -> Self {
        Relay {
            store,
            wakeups,
            options,
            sinks: Mutex::new(HashMap::new()),
        }
    }

    /// Repeats [`Self::try_step`] until `shutdown`; waits for a wake-up or the poll interval
    /// when there is nothing due.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let notified = self.wakeups.outbox.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let idle = match self.try_step().await {
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
        tracing::debug!("relay stopped");
    }

    /// Claims one batch of due rows and delivers it.
    pub async fn try_step(&self) -> Result<RelayOutcome, StoreError> {
        let rows = self
            .store
            .claim_outbox(self.options.batch_size, self.options.lease)
            .await?;
        let mut outcome = RelayOutcome {
            claimed: rows.len(),
            ..RelayOutcome::default()
        };
        if rows.is_empty() {
            return Ok(outcome);
        }
        let mut by_destination: HashMap<Option<String>, Vec<OutboxRow>> = HashMap::new();
        for row in rows {
            by_destination
                .entry(row.destination.clone())
                .or_default()
                .push(row);
        }
        let mut delivered = Vec::new();
        for (destination, rows) in by_destination {
            let results = match self.sink_for(&destination).await {
                Ok(sink) => sink.deliver_batch(&rows).await,
                Err(reason) => rows
                    .iter()
                    .map(|_| Err(SinkError::Destination(reason.clone())))
                    .collect(),
            };
            for (row, result) in rows.iter().zip(results) {
                match result {
                    Ok(()) => delivered.push(row.id),
                    Err(error) => {
                        outcome.failed_attempts += 1;
                        let attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
                        let delay = backoff_delay(
                            self.options.retry_base,
                            self.options.retry_max,
                            attempts,
                        );
                        tracing::warn!(outbox_id = row.id, event_id = %row.event_id, attempts, %error, ?delay, "delivery failed");
                        self.store
                            .mark_delivery_failed(
                                row.id,
                                &error.to_string(),
                                delay,
                                self.options.max_attempts,
                            )
                            .await?;
                    }
                }
            }
        }
        self.store.mark_dispatched(&delivered).await?;
        outcome.dispatched = delivered.len();
        metrics::counter!("dedup_outbox_dispatched_total").increment(outcome.dispatched as u64);
        metrics::counter!("dedup_outbox_delivery_failures_total")
            .increment(outcome.failed_attempts as u64);
        Ok(outcome)
    }

    async fn sink_for(&self, destination: &Option<String>) -> Result<Arc<dyn Sink>, String> {
        let mut sinks = self.sinks.lock().await;
        if let Some(sink) = sinks.get(destination) {
            return Ok(sink.clone());
        }
        let spec = match destination {
            None => self.options.default_sink.clone(),
            Some(spec) => SinkSpec::parse(spec)?,
        };
        let sink: Arc<dyn Sink> =
            build_sink(&spec, self.options.http_timeout, self.options.concurrency)
                .await
                .map_err(|e| e.to_string())?
                .into();
        sinks.insert(destination.clone(), sink.clone());
        Ok(sink)
    }
}
