//! Wiring: builds the store, transport, handler, consumer and relay from [`Settings`], binds
//! the listener, and runs the enabled roles until shutdown.
//!
//! [`Application::build`] binds before returning, so tests (and `serve`) learn the real port
//! when `http.listen` has port 0. [`Application::run`] takes a [`CancellationToken`]: on
//! cancellation the HTTP server stops accepting and finishes in-flight requests, the consumers
//! finish and commit their batches, the relays finish their deliveries, and everything is
//! drained within `shutdown.grace_secs`. Work that cannot finish in time is given back (the
//! last quarter of the grace period, at most 5 s, is kept for that), so nothing waits out a
//! lease after a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{HandlerKind, Settings, TransportKind};
use crate::consumer::{
    Consumer, ConsumerOptions, ForwardHandler, FullEventFetch, Handler, LedgerHandler, StaleGuard,
};
use crate::gauges::{run_gauges, GaugeSources};
use crate::http::{ops, serve, ServerLimits};
use crate::outbox::relay::{Relay, RelayOptions};
use crate::queue::database::GroupCommit;
use crate::queue::rabbitmq::RabbitOptions;
use crate::queue::{DatabaseQueue, RabbitMqQueue, SqsQueue, Transport};
use crate::retention::{run_retention, RetentionOptions};
use crate::store::{Backend, Migrations, Store, StoreError, Wakeups};
use crate::stripe::StripeApi;
use crate::webhook::{Clock, IngressState, StandardProvider, StripeProvider};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("cannot build the client for Stripe's API (stripe.fetch_thin_events): {0}")]
    StripeApi(#[source] reqwest::Error),
    /// The handler's SQL is written for other stores than the one configured.
    #[error("the handler runs on {supported} only, and database_url is {configured}")]
    HandlerBackend {
        supported: String,
        configured: Backend,
    },
}

/// What a service built on the library brings of its own (and what tests replace):
///
/// ```no_run
/// # use dedup_worker::{consumer::ForwardHandler, startup::Overrides, store::Migrations};
/// let overrides = Overrides::default()
///     .handler(ForwardHandler)
///     .migrations(Migrations::NONE);
/// # let _ = overrides;
/// ```
#[derive(Clone, Default)]
pub struct Overrides {
    /// A custom handler instead of the configured built-in one.
    pub handler: Option<Arc<dyn Handler>>,
    /// The application's own migrations (its handler's tables), applied after the library's
    /// by `build` (when `database.migrate_on_start`) and by the `migrate` command.
    pub migrations: Migrations,
    /// A fixed clock for signature verification.
    pub clock: Option<Clock>,
}

impl Overrides {
    /// Runs `handler` instead of the configured built-in one.
    pub fn handler(mut self, handler: impl Handler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Applies the application's `migrations` after the library's.
    pub fn migrations(mut self, migrations: Migrations) -> Self {
        self.migrations = migrations;
        self
    }
}

pub struct Application {
    settings: Settings,
    store: Store,
    transport: Arc<dyn Transport>,
    handler: Arc<dyn Handler>,
    wakeups: Arc<Wakeups>,
    listener: TcpListener,
    clock: Clock,
}

impl Application {
    /// Connects, migrates (unless disabled), builds the transport and binds the listener.
    pub async fn build(settings: Settings, overrides: Overrides) -> Result<Self, StartupError> {
        let handler: Arc<dyn Handler> = match overrides.handler {
            Some(handler) => handler,
            None => match settings.consumer.handler {
                HandlerKind::Forward => Arc::new(ForwardHandler),
                HandlerKind::Ledger => Arc::new(LedgerHandler),
            },
        };
        let store = Store::connect(&settings).await?;
        let configured = store.backend();
        if !handler.backends().contains(&configured) {
            let supported = handler
                .backends()
                .iter()
                .map(|b| b.name())
                .collect::<Vec<_>>();
            return Err(StartupError::HandlerBackend {
                supported: supported.join(" and "),
                configured,
            });
        }
        if settings.database.migrate_on_start {
            store.migrate_with(&overrides.migrations).await?;
        }
        let wakeups = Arc::new(Wakeups::default());
        let transport = build_transport(&settings, &store, wakeups.clone()).await;
        let clock = overrides
            .clock
            .unwrap_or_else(|| Arc::new(|| chrono::Utc::now().timestamp()));
        let addr = settings.http.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartupError::Bind { addr, source })?;
        Ok(Application {
            settings,
            store,
            transport,
            handler,
            wakeups,
            listener,
            clock,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs the enabled roles until `shutdown` is cancelled, then drains them.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        let Application {
            settings,
            store,
            transport,
            handler,
            wakeups,
            listener,
            clock,
        } = self;
        let roles = settings.roles;
        let listen_task = store.spawn_listener(wakeups.clone());
        let mut tasks = JoinSet::new();
        // Cancelled when the grace period is nearly over: consumers and relays drop the work
        // they could not finish and give it back, rather than be aborted holding its leases.
        let abandon = CancellationToken::new();

        let check_timeout = Duration::from_millis(settings.transport.publish_timeout_ms);
        let metrics = crate::telemetry::metrics_handle();
        let mut app = ops::router(ops::OpsState {
            store: store.clone(),
            transport: transport.clone(),
            check_timeout,
            metrics: metrics.clone(),
        });
        // Every role: see `crate::gauges` for why.
        let sources = GaugeSources {
            store: store.clone(),
            transport: transport.clone(),
            transport_kind: settings.transport.kind.name(),
            timeout: check_timeout,
            metrics,
        };
        let token = shutdown.clone();
        tasks.spawn(async move {
            run_gauges(sources, token).await;
            Ok(())
        });
        if roles.ingress {
            let state = IngressState {
                transport: transport.clone(),
                stripe: StripeProvider::from_settings(&settings.stripe),
                standard: StandardProvider::from_settings(&settings.standard_webhooks),
                publish_timeout: check_timeout,
                clock,
            };
            app = app.merge(crate::webhook::router(
                state,
                settings.http.body_limit_bytes,
            ));
        }
        let http_shutdown = shutdown.clone();
        let limits = ServerLimits::from(&settings.http);
        tasks.spawn(async move {
            serve(listener, app, limits, http_shutdown)
                .await
                .map_err(StartupError::Serve)
        });

        if roles.consumer {
            let c = &settings.consumer;
            let options = ConsumerOptions {
                source: c.source.clone(),
                dedup_key_pointer: c.dedup_key_pointer.clone(),
                batch_size: c.batch_size,
                poll_interval: Duration::from_millis(c.poll_interval_ms),
                max_attempts: c.max_attempts,
                retry_base: Duration::from_millis(c.retry_base_ms),
                retry_max: Duration::from_millis(c.retry_max_ms),
                max_message_bytes: c.max_message_bytes,
                lease: Duration::from_secs(c.lease_secs),
                step_timeout: Duration::from_millis(c.step_timeout_ms),
                envelope: c.envelope,
            };
            let workers = if store.single_writer() { 1 } else { c.workers };
            let fetch = full_event_fetch(&settings)?;
            let stripe_secrets = StripeProvider::from_settings(&settings.stripe).secrets;
            for _ in 0..workers {
                let consumer = Consumer::new(
                    store.clone(),
                    transport.clone(),
                    handler.clone(),
                    wakeups.clone(),
                    options.clone(),
                )
                .with_stale_guard(StaleGuard::from_settings(&c.stale_guard))
                .with_full_event_fetch(fetch.clone())
                .with_stripe_secrets(stripe_secrets.clone());
                let (token, abandon) = (shutdown.clone(), abandon.clone());
                tasks.spawn(async move {
                    consumer.run(token, abandon).await;
                    Ok(())
                });
            }
            let retention = RetentionOptions {
                dedup_window: c.dedup_window(),
                outbox_window: settings.outbox.retention(),
                interval: Duration::from_secs(c.retention_interval_secs.max(1)),
                batch: c.retention_batch,
                statement_timeout: Duration::from_millis(settings.database.statement_timeout_ms),
            };
            let token = shutdown.clone();
            let retention_store = store.clone();
            tasks.spawn(async move {
                run_retention(retention_store, retention, token).await;
                Ok(())
            });
        }

        if roles.relay {
            let o = &settings.outbox;
            let options = RelayOptions {
                default_sink: o.sink.clone(),
                batch_size: o.batch_size,
                concurrency: o.concurrency,
                poll_interval: Duration::from_millis(o.poll_interval_ms),
                lease: Duration::from_secs(o.lease_secs),
                max_attempts: o.max_attempts,
                retry_base: Duration::from_millis(o.retry_base_ms),
                retry_max: Duration::from_millis(o.retry_max_ms),
                http_timeout: Duration::from_millis(o.http_timeout_ms),
                signing_secrets: o.signing_secret.clone().into(),
                statement_timeout: Duration::from_millis(settings.database.statement_timeout_ms),
            };
            let relay = Relay::new(store.clone(), wakeups.clone(), options);
            let (token, abandon) = (shutdown.clone(), abandon.clone());
            tasks.spawn(async move {
                relay.run(token, abandon).await;
                Ok(())
            });
        }
        drop(transport);

        // Run until asked to stop (or a task fails), then drain under the grace period.
        let mut result = Ok(());
        tokio::select! {
            _ = shutdown.cancelled() => {}
            Some(joined) = tasks.join_next() => {
                result = flatten(joined);
                shutdown.cancel();
            }
        }
        let grace = settings.shutdown_grace();
        let give_back_window = (grace / 4).min(MAX_GIVE_BACK_WINDOW);
        let mut drained = tokio::time::timeout(grace - give_back_window, drain(&mut tasks))
            .await
            .is_ok();
        if !drained {
            tracing::warn!(
                ?grace,
                "shutdown grace period nearly over; giving back unfinished work"
            );
            abandon.cancel();
            drained = tokio::time::timeout(give_back_window, drain(&mut tasks))
                .await
                .is_ok();
        }
        if !drained {
            tracing::warn!(
                ?grace,
                "shutdown grace period over; aborting remaining tasks"
            );
            tasks.abort_all();
        }
        if let Some(task) = listen_task {
            task.abort();
        }
        store.close().await;
        result
    }
}

/// The configured transport, as `serve` and `dlq redrive` use it: connections are made on first
/// use, so building it needs no broker.
pub async fn build_transport(
    settings: &Settings,
    store: &Store,
    wakeups: Arc<Wakeups>,
) -> Arc<dyn Transport> {
    match settings.transport.kind {
        TransportKind::Rabbitmq => Arc::new(RabbitMqQueue::new(
            settings.transport.amqp_url.expose().to_owned(),
            settings.transport.queue.clone(),
            RabbitOptions {
                prefetch: u16::try_from(settings.consumer.batch_size * 2).unwrap_or(u16::MAX),
                delivery_limit: settings.transport.delivery_limit,
                retry_max: Duration::from_millis(settings.consumer.retry_max_ms),
            },
        )),
        TransportKind::Sqs => Arc::new(
            SqsQueue::from_env(
                settings.transport.queue.clone(),
                Duration::from_secs(settings.consumer.lease_secs),
                Duration::from_millis(settings.transport.publish_timeout_ms),
            )
            .await
            .with_long_poll(Duration::from_secs(settings.transport.sqs_wait_time_secs))
            .with_message_group_pointer(settings.transport.sqs_message_group_pointer.clone()),
        ),
        TransportKind::Database => {
            Arc::new(DatabaseQueue::start(
                store.clone(),
                settings.transport.queue.clone(),
                wakeups.clone(),
                GroupCommit {
                    max_batch: settings.transport.publish_batch_max,
                    // SQLite has one writer; more writer tasks would only wait on its lock.
                    writers: if store.single_writer() {
                        1
                    } else {
                        settings.transport.publish_writers
                    },
                    channel_capacity: settings.transport.publish_channel_capacity,
                    commit_timeout: Duration::from_millis(settings.transport.publish_timeout_ms),
                    lease: Duration::from_secs(settings.consumer.lease_secs),
                    statement_timeout: Duration::from_millis(
                        settings.database.statement_timeout_ms,
                    ),
                },
            ))
        }
    }
}

/// The most of the grace period kept for giving back unfinished work (a quarter of it, if
/// less): enough for one give-back call each.
const MAX_GIVE_BACK_WINDOW: Duration = Duration::from_secs(5);

/// Waits for every task, logging those that fail.
async fn drain(tasks: &mut JoinSet<Result<(), StartupError>>) {
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = flatten(joined) {
            tracing::error!(%error, "task failed during shutdown");
        }
    }
}

fn flatten(
    joined: Result<Result<(), StartupError>, tokio::task::JoinError>,
) -> Result<(), StartupError> {
    match joined {
        Ok(result) => result,
        Err(error) => Err(StartupError::Serve(std::io::Error::other(
            error.to_string(),
        ))),
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
        Duration::from_millis(stripe.api_timeout_ms),
    )
    .map_err(StartupError::StripeApi)?;
    Ok(Some(FullEventFetch::new(
        api,
        settings.consumer.max_message_bytes,
    )))
}
