//! Each role as the settings configure it, spawned onto the application's task set: the HTTP
//! server (ops endpoints, and the webhook ingress when enabled), the gauges, the consumers and
//! retention, the relay. Options are read from [`Settings`] here, in one place, so the pipeline's
//! modules take plain option structs and never the configuration's shape.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::StartupError;
use crate::config::Settings;
use crate::console::{ConsoleOptions, ConsoleState, Keys};
use crate::consumer::{Consumer, ConsumerOptions, FullEventFetch, Handler, StaleGuard};
use crate::event::search_keys::SearchPointers;
use crate::gauges::{run_gauges, GaugeSources};
use crate::http::{ops, serve, ServerLimits};
use crate::inspect::ListOptions;
use crate::outbox::relay::{Relay, RelayOptions};
use crate::queue::Transport;
use crate::retention::{run_retention, RetentionOptions};
use crate::store::{Store, Wakeups};
use crate::stripe::StripeApi;
use crate::webhook::{Clock, IngressState, StandardProvider, StripeProvider};

/// The running roles' tasks; each returns an error only when the whole application must stop.
pub(super) type Tasks = JoinSet<Result<(), StartupError>>;

/// What every role is built from, borrowed for the spawning.
pub(super) struct Roles<'a> {
    pub settings: &'a Settings,
    pub store: &'a Store,
    pub transport: &'a Arc<dyn Transport>,
    pub wakeups: &'a Arc<Wakeups>,
    /// Cancelled to stop: each role stops taking work and finishes what it holds.
    pub shutdown: &'a CancellationToken,
    /// Cancelled when the grace period is nearly over: consumers and relays drop the work they
    /// could not finish and give it back, rather than be aborted holding its leases.
    pub abandon: &'a CancellationToken,
}

impl Roles<'_> {
    /// The HTTP server on `listener` (ops endpoints always, the webhooks with the ingress role)
    /// and the gauges behind `/metrics`, which every role has: see `crate::gauges` for why.
    pub fn spawn_http_and_gauges(&self, tasks: &mut Tasks, listener: TcpListener, clock: Clock) {
        let settings = self.settings;
        let check_timeout = settings.transport.publish_timeout;
        let metrics = crate::telemetry::metrics_handle();
        let mut app = ops::router(ops::OpsState {
            store: self.store.clone(),
            transport: self.transport.clone(),
            check_timeout,
            metrics: metrics.clone(),
        });
        let sources = GaugeSources {
            store: self.store.clone(),
            transport: self.transport.clone(),
            transport_kind: settings.transport.kind.name(),
            timeout: check_timeout,
            metrics,
        };
        let token = self.shutdown.clone();
        tasks.spawn(async move {
            run_gauges(sources, token).await;
            Ok(())
        });
        if settings.roles.ingress {
            let state = IngressState {
                transport: self.transport.clone(),
                stripe: StripeProvider::from_settings(&settings.stripe),
                standard: StandardProvider::from_settings(&settings.standard_webhooks),
                sources: crate::webhook::sources::from_settings(&settings.sources),
                publish_timeout: check_timeout,
                clock,
            };
            app = app.merge(crate::webhook::router(
                state,
                settings.http.body_limit_bytes,
            ));
        }
        let shutdown = self.shutdown.clone();
        let limits = ServerLimits::from(&settings.http);
        tasks.spawn(async move {
            serve(listener, app, limits, shutdown)
                .await
                .map_err(StartupError::Serve)
        });
    }

    /// The operator console on its own listener (`admin.listen`), with the webhook listener's
    /// limits. Without `admin.token` (allowed on loopback only) a token is made for this run
    /// and logged, so the console is never open to whoever reaches the port.
    pub fn spawn_console(&self, tasks: &mut Tasks, listener: TcpListener) {
        let settings = self.settings;
        let admin = &settings.admin;
        let mut token = admin.token.expose().to_owned();
        if token.is_empty() {
            token = uuid::Uuid::new_v4().simple().to_string();
            tracing::warn!(
                %token,
                "admin.token is not set: the console's token for this run (set DEDUP_ADMIN__TOKEN to choose one)"
            );
        }
        let listing = ListOptions::from_settings(settings);
        let state = ConsoleState {
            store: self.store.clone(),
            transport: self.transport.clone(),
            keys: Keys::new(&token, admin.on_loopback()),
            wakeups: self.wakeups.clone(),
            options: Arc::new(ConsoleOptions {
                statement_timeout: listing.statement_timeout,
                sources: listing.sources,
                default_source: listing.default_source,
                database_queue: listing.database_queue,
                queue: settings.transport.queue.clone(),
                show_payloads: admin.payloads_shown(),
            }),
        };
        let router = crate::console::router(state);
        let shutdown = self.shutdown.clone();
        let limits = ServerLimits::from(&settings.http);
        tasks.spawn(async move {
            serve(listener, router, limits, shutdown)
                .await
                .map_err(StartupError::Serve)
        });
    }

    /// `consumer.workers` consumers (one on SQLite, which has one writer) and retention.
    pub fn spawn_consumers(
        &self,
        tasks: &mut Tasks,
        handler: &Arc<dyn Handler>,
    ) -> Result<(), StartupError> {
        let settings = self.settings;
        let c = &settings.consumer;
        let options = consumer_options(settings);
        let workers = if self.store.single_writer() {
            1
        } else {
            c.workers
        };
        let fetch = full_event_fetch(settings)?;
        for _ in 0..workers {
            let consumer = Consumer::new(
                self.store.clone(),
                self.transport.clone(),
                handler.clone(),
                self.wakeups.clone(),
                options.clone(),
            )
            .with_stale_guard(StaleGuard::from_settings(&c.stale_guard))
            .with_kept_bodies(kept_bodies(settings))
            .with_full_event_fetch(fetch.clone());
            let (token, abandon) = (self.shutdown.clone(), self.abandon.clone());
            tasks.spawn(async move {
                consumer.run(token, abandon).await;
                Ok(())
            });
        }
        let retention = RetentionOptions::from_settings(settings);
        let (store, token) = (self.store.clone(), self.shutdown.clone());
        tasks.spawn(async move {
            run_retention(store, retention, token).await;
            Ok(())
        });
        Ok(())
    }

    /// The outbox relay.
    pub fn spawn_relay(&self, tasks: &mut Tasks) {
        let relay = Relay::new(
            self.store.clone(),
            self.wakeups.clone(),
            relay_options(self.settings),
        );
        let (token, abandon) = (self.shutdown.clone(), self.abandon.clone());
        tasks.spawn(async move {
            relay.run(token, abandon).await;
            Ok(())
        });
    }
}

/// Where the kept bodies' search keys are; `None` when bodies are not kept
/// (`retention.payload_days = 0`).
fn kept_bodies(settings: &Settings) -> Option<SearchPointers> {
    settings.retention.keeps_payloads().then(|| SearchPointers {
        object: settings.search.object_pointer.clone(),
        customer: settings.search.customer_pointer.clone(),
    })
}

fn consumer_options(settings: &Settings) -> ConsumerOptions {
    let c = &settings.consumer;
    ConsumerOptions {
        source: c.source.clone(),
        dedup_key_pointer: c.dedup_key_pointer.clone(),
        batch_size: c.batch_size,
        poll_interval: c.poll_interval,
        max_attempts: c.max_attempts,
        retry_base: c.retry_base,
        retry_max: c.retry_max,
        max_message_bytes: c.max_message_bytes,
        lease: c.lease,
        step_timeout: c.step_timeout,
        envelope: c.envelope,
        outbox_plan: std::sync::Arc::new(crate::outbox::OutboxPlan::new(&settings.outbox)),
    }
}

fn relay_options(settings: &Settings) -> RelayOptions {
    let o = &settings.outbox;
    RelayOptions {
        default_sink: o.sink.clone(),
        batch_size: o.batch_size,
        concurrency: o.concurrency,
        poll_interval: o.poll_interval,
        lease: o.lease,
        max_attempts: o.max_attempts,
        retry_base: o.retry_base,
        retry_max: o.retry_max,
        http_timeout: o.http_timeout,
        signing_secrets: o.signing_secret.clone().into(),
        statement_timeout: settings.database.statement_timeout,
        max_retry_after: o.max_retry_after,
        default_rate: crate::config::lane_rate(o.rate_per_sec, o.burst),
        breaker: o.breaker.clone(),
        sinks: o.sinks.clone(),
        response_excerpt_bytes: o.response_excerpt_bytes,
        // Attempts are kept as long as bodies: `retention.payload_days = 0` keeps neither.
        record_attempts: settings.retention.payload_days > 0,
    }
}

/// The consumer's thin-event fetch, when `stripe.fetch_thin_events` is on (validated: a key, a
/// request timeout inside the step's).
fn full_event_fetch(settings: &Settings) -> Result<Option<FullEventFetch>, StartupError> {
    let stripe = &settings.stripe;
    if !stripe.fetch_thin_events {
        return Ok(None);
    }
    let api = StripeApi::new(
        &stripe.api_base,
        stripe.api_key.clone(),
        &stripe.api_version,
        stripe.api_timeout,
    )
    .map_err(StartupError::StripeApi)?;
    Ok(Some(FullEventFetch::new(
        api,
        settings.consumer.max_message_bytes,
    )))
}
