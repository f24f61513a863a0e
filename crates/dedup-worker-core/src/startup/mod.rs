//! Wiring: builds the store, transport, handler, consumer and relay from [`Settings`] and a
//! [`Service`], binds the listener, and runs the enabled roles until shutdown.
//!
//! [`Application::build`] binds before returning, so tests (and `serve`) learn the real port
//! when `http.listen` has port 0. [`Application::run`] takes a [`CancellationToken`]: on
//! cancellation the HTTP server stops accepting and finishes in-flight requests, the consumers
//! finish and commit their batches, the relays finish their deliveries, and everything is
//! drained within `shutdown.grace`. Work that cannot finish in time is given back (the
//! last quarter of the grace period, at most 5 s, is kept for that), so nothing waits out a
//! lease after a restart.
//!
//! `service.rs` is what a service brings of its own; `roles.rs` spawns each role from the
//! settings; `transport.rs` builds the configured transport.

mod roles;
mod service;
mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{HandlerKind, Settings};
use crate::consumer::{ForwardHandler, Handler, LedgerHandler};
use crate::queue::Transport;
use crate::store::{bounded, Backend, Store, StoreError, Wakeups, PARTITIONED};
use crate::webhook::Clock;
use roles::{Roles, Tasks};
pub use service::Service;
pub use transport::build_transport;

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

/// The application, built and bound, not yet running.
pub struct Application {
    /// The parsed configuration: which roles run, and each one's options.
    settings: Settings,
    store: Store,
    transport: Arc<dyn Transport>,
    /// The service's handler, or the configured built-in one.
    handler: Arc<dyn Handler>,
    /// Wakes consumers and relays when the store says new rows are there.
    wakeups: Arc<Wakeups>,
    /// Bound by `build`, so its port is known before `run`.
    listener: TcpListener,
    /// The operator console's listener (`admin.listen`), bound by `build` too.
    admin_listener: Option<TcpListener>,
    /// What signature timestamps are checked against.
    clock: Clock,
}

impl Application {
    /// Connects, migrates (unless disabled), builds the transport and binds the listener.
    pub async fn build(settings: Settings, service: Service) -> Result<Self, StartupError> {
        let handler: Arc<dyn Handler> = match service.handler {
            Some(handler) => handler,
            None => match settings.consumer.handler {
                HandlerKind::Forward => Arc::new(ForwardHandler),
                HandlerKind::Ledger => Arc::new(LedgerHandler),
            },
        };
        let store = Store::connect(&settings).await?;
        refuse_other_backends(handler.as_ref(), store.backend())?;
        if settings.database.migrate_on_start {
            store.migrate_with(&service.migrations).await?;
        }
        // The history's days ahead, at every role's start (a catalog read when none is missing);
        // a failure only warns: retention tries again, and the insert guard keeps batches going.
        // Bounded as a whole (each statement is by the session's own timeout too): a start never
        // waits on a catalog lock longer than one statement's time per table.
        let partitions_bound = settings.database.statement_timeout * PARTITIONED.len() as u32;
        if let Err(error) = bounded(partitions_bound, store.partitions().ensure_all()).await {
            tracing::warn!(%error, "making the history tables' day partitions failed; retention will try again");
        }
        let wakeups = Arc::new(Wakeups::default());
        let transport = build_transport(&settings, &store, wakeups.clone()).await;
        let clock = service
            .clock
            .unwrap_or_else(|| Arc::new(|| chrono::Utc::now().timestamp()));
        let addr = settings.http.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartupError::Bind { addr, source })?;
        let admin_listener = match settings.admin.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartupError::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Application {
            settings,
            store,
            transport,
            handler,
            wakeups,
            listener,
            admin_listener,
            clock,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The operator console's address, when `admin.listen` is set.
    pub fn local_admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener.as_ref()?.local_addr().ok()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs the enabled roles until `shutdown` is cancelled (or one of them fails), then drains
    /// them within the grace period.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        let Application {
            settings,
            store,
            transport,
            handler,
            wakeups,
            listener,
            admin_listener,
            clock,
        } = self;
        let listen_task = store.spawn_listener(wakeups.clone());
        let mut tasks = Tasks::new();
        let abandon = CancellationToken::new();
        let roles = Roles {
            settings: &settings,
            store: &store,
            transport: &transport,
            wakeups: &wakeups,
            shutdown: &shutdown,
            abandon: &abandon,
        };
        roles.spawn_http_and_gauges(&mut tasks, listener, clock);
        if let Some(admin_listener) = admin_listener {
            roles.spawn_console(&mut tasks, admin_listener);
        }
        let mut result = Ok(());
        if settings.roles.consumer {
            result = roles.spawn_consumers(&mut tasks, &handler);
        }
        if settings.roles.relay && result.is_ok() {
            roles.spawn_relay(&mut tasks);
        }
        drop(transport);

        if result.is_ok() {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                Some(joined) = tasks.join_next() => result = flatten(joined),
            }
        }
        shutdown.cancel();
        drain_within(settings.shutdown_grace(), &mut tasks, &abandon).await;
        if let Some(task) = listen_task {
            task.abort();
        }
        store.close().await;
        result
    }
}

/// Refuses a handler whose SQL does not run on the configured store.
fn refuse_other_backends(handler: &dyn Handler, configured: Backend) -> Result<(), StartupError> {
    if handler.backends().contains(&configured) {
        return Ok(());
    }
    let supported = handler
        .backends()
        .iter()
        .map(|b| b.name())
        .collect::<Vec<_>>();
    Err(StartupError::HandlerBackend {
        supported: supported.join(" and "),
        configured,
    })
}

/// The most of the grace period kept for giving back unfinished work (a quarter of it, if
/// less): enough for one give-back call each.
const MAX_GIVE_BACK_WINDOW: Duration = Duration::from_secs(5);

/// Waits for every task within `grace`: near its end, `abandon` tells consumers and relays to
/// give back what they hold; at its end, what is left is aborted.
async fn drain_within(grace: Duration, tasks: &mut Tasks, abandon: &CancellationToken) {
    let give_back_window = (grace / 4).min(MAX_GIVE_BACK_WINDOW);
    if tokio::time::timeout(grace - give_back_window, drain(tasks))
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        ?grace,
        "shutdown grace period nearly over; giving back unfinished work"
    );
    abandon.cancel();
    if tokio::time::timeout(give_back_window, drain(tasks))
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "shutdown grace period over; aborting remaining tasks"
        );
        tasks.abort_all();
    }
}

/// Waits for every task, logging those that fail.
async fn drain(tasks: &mut Tasks) {
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
