//! The outbox relay: every sink delivered in a [`lane::Lane`] of its own (claim, deliver, mark),
//! each on its own task, so one sink's slowness, death or throttling changes nothing for the
//! others. [`Relay::run`] starts a lane for `default` (`outbox.sink`) and for each
//! `[outbox.sinks.NAME]`, and discovers lanes of ad-hoc destinations (`.to("https://…")`) as
//! their rows appear; each lane waits on NOTIFY (PostgreSQL) or the in-process signal, with a
//! polling fallback. [`Relay::try_step`] runs one step of every lane, for tests.
//!
//! * `lane.rs`: one lane's step and its shared state (paused, held, circuit);
//! * `gate.rs`: a batch's pacing, breaker counting and stop;
//! * `breaker.rs`: when the circuit opens, how probes are spaced (pure);
//! * `attempt.rs`: one row's delivery, timed, and the attempt its mark records;
//! * `marks.rs`: give-backs, marks an outage left, lease extensions;
//! * `rate.rs`: a sink's rate, shared with the other relay processes through the store;
//! * `settle.rs`: a step's deferrals and failure marks.

mod attempt;
pub mod breaker;
mod gate;
pub mod lane;
mod marks;
mod rate;
mod settle;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::breaker::BreakerPolicy;
use self::lane::{Lane, LaneOptions, Rest};
use self::marks::OUTSIDE_CALL_TIMEOUT;
use super::sink::{build_sink, HttpAuth, Sink};
use crate::config::{lane_label, lane_rate, BreakerSettings, SinkSettings, SinkSpec, DEFAULT_LANE};
use crate::retry::backoff_delay;
use crate::signature::secrets::SigningSecret;
use crate::store::{OutboxClaim, OutboxRow, Store, StoreError, Wakeups};

/// The most lanes of ad-hoc destinations one relay runs; rows of further ones wait (logged).
const MAX_ADHOC_LANES: usize = 64;

/// Relay options (see `[outbox]` in config/default.toml): the `default` lane's settings and
/// every lane's defaults, the named sinks, the breaker.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The sink for rows without a destination of their own (the `default` lane).
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
    /// The longest a receiver's `Retry-After` holds a lane.
    pub max_retry_after: Duration,
    /// The `default` lane's rate and burst (`outbox.rate_per_sec`, `outbox.burst`); `None`:
    /// unpaced.
    pub default_rate: Option<(f64, u32)>,
    /// Every lane's circuit breaker, unless its sink overrides it.
    pub breaker: BreakerSettings,
    /// `[outbox.sinks.NAME]`: each a lane of its own.
    pub sinks: BTreeMap<String, SinkSettings>,
    /// How much of an HTTP receiver's answer is kept with each attempt
    /// (`outbox.response_excerpt_bytes`; 0: none).
    pub response_excerpt_bytes: usize,
    /// Whether each delivery attempt is recorded in `outbox_attempts` (off when
    /// `retention.payload_days = 0`).
    pub record_attempts: bool,
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
    /// Rows claimed and put back with their attempt given back: not sent because the lane
    /// stopped (its circuit opened, the receiver asked for time), or answered `Retry-After`.
    pub deferred: usize,
}

impl std::ops::AddAssign for RelayOutcome {
    fn add_assign(&mut self, other: Self) {
        self.claimed += other.claimed;
        self.dispatched += other.dispatched;
        self.failed_attempts += other.failed_attempts;
        self.lease_lost += other.lease_lost;
        self.deferred += other.deferred;
    }
}

pub struct Relay {
    store: Store,
    wakeups: Arc<Wakeups>,
    options: RelayOptions,
    /// The lanes built so far, by name (the `sink` column).
    lanes: Mutex<BTreeMap<String, Arc<Lane>>>,
}

impl Relay {
    pub fn new(store: Store, wakeups: Arc<Wakeups>, options: RelayOptions) -> Self {
        Relay {
            store,
            wakeups,
            options,
            lanes: Mutex::new(BTreeMap::new()),
        }
    }

    /// One step of every configured lane and of every lane with pending rows, in turn.
    pub async fn try_step(&self) -> Result<RelayOutcome, StoreError> {
        let mut names = self.configured_lanes();
        names.extend(self.store.outbox().pending_lanes().await?);
        names.sort();
        names.dedup();
        let mut outcome = RelayOutcome::default();
        for name in names {
            let (stepped, _) = self.lane(&name).await.try_step().await?;
            outcome += stepped;
        }
        Ok(outcome)
    }

    /// Runs every lane until `shutdown`: the configured ones at once, ad-hoc ones as their rows
    /// appear. A lane's step in progress at shutdown is finished (its deliveries answered and
    /// marked) unless `abandon` comes first (the grace period is nearly over): then its
    /// deliveries are dropped and its rows not yet marked are made due at once, so the next
    /// relay, or this one restarted, delivers them without waiting out their lease.
    pub async fn run(self, shutdown: CancellationToken, abandon: CancellationToken) {
        let relay = Arc::new(self);
        let tracker = TaskTracker::new();
        let mut running: HashSet<String> = HashSet::new();
        let configured = relay.configured_lanes();
        let discover_every = relay.options.poll_interval.max(Duration::from_secs(1));
        let mut refused_warned = false;
        while !shutdown.is_cancelled() {
            let mut names = configured.clone();
            match relay.store.outbox().pending_lanes().await {
                Ok(pending) => names.extend(pending),
                Err(error) => tracing::warn!(%error, "could not list the outbox's lanes"),
            }
            for name in names {
                if running.contains(&name) {
                    continue;
                }
                let adhoc = running.len().saturating_sub(configured.len());
                if !configured.contains(&name) && adhoc >= MAX_ADHOC_LANES {
                    if !refused_warned {
                        tracing::warn!(limit = MAX_ADHOC_LANES, "too many ad-hoc destinations; rows of further ones wait (name them as [outbox.sinks.NAME])");
                        refused_warned = true;
                    }
                    continue;
                }
                let lane = relay.lane(&name).await;
                tracing::debug!(lane = %lane.label, "lane started");
                register_lane_metrics(&lane.label);
                running.insert(name);
                tracker.spawn(run_lane(
                    lane,
                    relay.wakeups.clone(),
                    shutdown.clone(),
                    abandon.clone(),
                ));
            }
            // Not on every wake-up (one a commit): an ad-hoc destination's first rows wait at
            // most this long for their lane.
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(discover_every) => {}
            }
        }
        tracker.close();
        tracker.wait().await;
        tracing::debug!("relay stopped");
    }

    /// `default` and every `[outbox.sinks.NAME]`.
    fn configured_lanes(&self) -> Vec<String> {
        std::iter::once(DEFAULT_LANE.to_owned())
            .chain(self.options.sinks.keys().cloned())
            .collect()
    }

    /// The lane `name`, built on first use.
    async fn lane(&self, name: &str) -> Arc<Lane> {
        let mut lanes = self.lanes.lock().await;
        if let Some(lane) = lanes.get(name) {
            return lane.clone();
        }
        let lane = Arc::new(self.build_lane(name).await);
        lanes.insert(name.to_owned(), lane.clone());
        lane
    }

    async fn build_lane(&self, name: &str) -> Lane {
        let o = &self.options;
        let configured = o.sinks.get(name);
        let spec = match configured {
            Some(sink) => Ok(sink.url.clone()),
            None if name == DEFAULT_LANE => Ok(o.default_sink.clone()),
            None => SinkSpec::parse(name).map_err(|e| Arc::new(e) as Arc<_>),
        };
        let concurrency = configured
            .and_then(|s| s.concurrency)
            .unwrap_or(o.concurrency);
        let http_timeout = configured
            .and_then(|s| s.http_timeout)
            .unwrap_or(o.http_timeout);
        let secrets: Arc<[SigningSecret]> = match configured.and_then(|s| s.signing_secret.clone())
        {
            Some(own) => own.into(),
            None => o.signing_secrets.clone(),
        };
        let auth = HttpAuth {
            tls: configured.and_then(|s| s.tls.as_ref()),
            oauth: configured.and_then(|s| s.oauth.as_ref()),
        };
        // What the attempts table keeps of the destination: never a webhook URL's token.
        let shown = match &spec {
            Ok(spec) => spec.to_string(),
            Err(_) => crate::config::shown_destination(name),
        };
        let sink: Result<Arc<dyn Sink>, _> = match spec {
            Ok(spec) => build_sink(
                &spec,
                http_timeout,
                o.response_excerpt_bytes,
                concurrency,
                &secrets,
                auth,
            )
            .await
            .map(Arc::from)
            .map_err(|e| Arc::new(e) as Arc<_>),
            Err(error) => Err(error),
        };
        let breaker = match configured {
            Some(sink) => o.breaker.with(&sink.breaker),
            None => o.breaker.clone(),
        };
        let options = LaneOptions {
            batch_size: configured
                .and_then(|s| s.batch_size)
                .unwrap_or(o.batch_size),
            concurrency,
            poll_interval: o.poll_interval,
            lease: o.lease,
            max_attempts: configured
                .and_then(|s| s.max_attempts)
                .unwrap_or(o.max_attempts),
            retry_base: o.retry_base,
            retry_max: o.retry_max,
            statement_timeout: o.statement_timeout,
            max_retry_after: o.max_retry_after,
            breaker: breaker_policy(&breaker),
            rate: match configured {
                Some(sink) => lane_rate(sink.rate_per_sec, sink.burst),
                None if name == DEFAULT_LANE => o.default_rate,
                None => None,
            },
            ordered: configured.is_some_and(|s| s.ordered),
            record_attempts: o.record_attempts,
        };
        let label = lane_label(name);
        Lane::new(
            name.to_owned(),
            label,
            shown,
            self.store.clone(),
            sink,
            options,
        )
    }
}

/// A lane's metrics exist from its start, so dashboards and alert rules find them before
/// anything happened: its circuit closed (until the gauges' sampling of `outbox_sinks` says
/// otherwise) and its counters at 0.
fn register_lane_metrics(label: &str) {
    let lane = label.to_owned();
    metrics::gauge!("dedup_outbox_sink_circuit", "lane" => lane.clone(), "state" => "closed")
        .set(1.0);
    metrics::gauge!("dedup_outbox_sink_paused", "lane" => lane.clone()).set(0.0);
    metrics::gauge!("dedup_outbox_sink_held_seconds", "lane" => lane.clone()).set(0.0);
    for reason in ["retry_after", "circuit", "not_sent"] {
        metrics::counter!("dedup_outbox_deferred_total", "lane" => lane.clone(), "reason" => reason).increment(0);
    }
    for to in ["open", "closed"] {
        metrics::counter!("dedup_outbox_circuit_transitions_total", "lane" => lane.clone(), "to" => to).increment(0);
    }
}

fn breaker_policy(settings: &BreakerSettings) -> BreakerPolicy {
    BreakerPolicy {
        failures: settings.failures,
        failure_ratio: settings.failure_ratio,
        window: settings.window,
        min_requests: settings.min_requests,
        probe_after: settings.probe_after,
        probe_max: settings.probe_max,
    }
}

/// One lane's loop: steps until `shutdown`, resting as each step says, backing off while the
/// store fails.
async fn run_lane(
    lane: Arc<Lane>,
    wakeups: Arc<Wakeups>,
    shutdown: CancellationToken,
    abandon: CancellationToken,
) {
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let notified = wakeups.outbox.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let stepped = match lane.claim().await {
            Err(error) => Err(error),
            Ok((outcome, Err(rest))) => Ok((outcome, rest)),
            Ok((outcome, Ok(batch))) => {
                let claims: Vec<OutboxClaim> = batch.rows.iter().map(OutboxRow::claim).collect();
                tokio::select! {
                    stepped = lane.deliver_and_mark(batch, outcome) => stepped,
                    _ = abandon.cancelled() => {
                        lane.give_back(&claims).await;
                        break;
                    }
                }
            }
        };
        match stepped {
            Ok((_, Rest::None)) => failures = 0,
            Ok((_, Rest::Idle)) => {
                failures = 0;
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(lane.options.poll_interval) => {}
                }
            }
            Ok((_, Rest::For(wait))) => {
                failures = 0;
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(lane = %lane.label, %error, "relay step failed");
                let delay = backoff_delay(
                    Duration::from_millis(100),
                    Duration::from_secs(10),
                    failures,
                );
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    // Deliveries an outage left unmarked: one more try, or they are delivered again after
    // their lease.
    if !lane.lock_unmarked().is_empty() {
        let _ = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, lane.mark_unmarked()).await;
    }
}
