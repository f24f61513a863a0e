//! [`Service`]: what a service built on the library brings of its own (its handler, its
//! migrations), built in one expression and run as a command line:
//!
//! ```no_run
//! use dedup_worker_core::prelude::*;
//! # use dedup_worker_core::consumer::LedgerHandler as MyHandler;
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     Service::new().handler(MyHandler).run().await
//! }
//! ```
//!
//! The same value starts the application in a test ([`crate::testing::TestApp::spawn`]); its
//! `run` lives with the command line (`cli/service.rs`), which is built on this floor.

use std::sync::Arc;

use crate::consumer::Handler;
use crate::store::Migrations;
use crate::webhook::Clock;

/// A service on the library: its handler and its migrations, run with every stock command of
/// the `dedup-worker` binary (`serve`, `migrate`, `dlq`, `outbox`, `events`, …).
#[derive(Clone, Default)]
pub struct Service {
    /// The handler instead of the configured built-in one (`consumer.handler`); `None` runs
    /// the built-in one.
    pub(crate) handler: Option<Arc<dyn Handler>>,
    /// The application's own migrations (its handler's tables), applied after the library's
    /// on every start (when `database.migrate_on_start`) and by the `migrate` command.
    pub(crate) migrations: Migrations,
    /// The clock signatures are verified against; `None` is the system clock. Tests that sign
    /// with fixed timestamps set it.
    pub(crate) clock: Option<Clock>,
}

impl Service {
    /// The stock service: the configured built-in handler, no migrations of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` for every event instead of the configured built-in one.
    pub fn handler(mut self, handler: impl Handler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Applies the application's `migrations` after the library's, on every start (when
    /// `database.migrate_on_start`) and with `migrate`.
    pub fn migrations(mut self, migrations: Migrations) -> Self {
        self.migrations = migrations;
        self
    }

    /// Verifies signature timestamps against `clock` (Unix seconds) instead of the system
    /// clock: for tests that sign with timestamps of their own.
    pub fn clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("handler", &self.handler.as_ref().map(|_| "custom"))
            .field("migrations", &self.migrations)
            .field("clock", &self.clock.as_ref().map(|_| "fixed"))
            .finish()
    }
}
