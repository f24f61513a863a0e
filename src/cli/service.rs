//! [`Service`]: a service of your own on the library, built in one expression and run as a
//! command line:
//!
//! ```no_run
//! use dedup_worker::prelude::*;
//! # use dedup_worker::consumer::LedgerHandler as MyHandler;
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     Service::new().handler(MyHandler).run().await
//! }
//! ```
//!
//! It is what [`super::run`] takes as [`Overrides`], named for what a handler crate builds.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::consumer::Handler;
use crate::startup::Overrides;
use crate::store::Migrations;

/// A service on the library: its handler and its migrations, run with every stock command of
/// the `dedup-worker` binary (`serve`, `migrate`, `dlq`, `outbox`, `events`, …).
#[derive(Default)]
pub struct Service {
    /// What the wiring takes: the handler instead of the configured built-in one, the
    /// application's migrations after the library's.
    overrides: Overrides,
}

impl Service {
    /// The stock service: the configured built-in handler, no migrations of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` for every event instead of the configured built-in one.
    pub fn handler(self, handler: impl Handler) -> Self {
        Self {
            overrides: self.overrides.handler(handler),
        }
    }

    /// Applies the application's `migrations` after the library's, on every start (when
    /// `database.migrate_on_start`) and with `migrate`.
    pub fn migrations(self, migrations: Migrations) -> Self {
        Self {
            overrides: self.overrides.migrations(migrations),
        }
    }

    /// Runs the command line of this process (`std::env::args_os`); the exit status as
    /// [`super::run`] gives it.
    pub async fn run(self) -> ExitCode {
        super::run(self.overrides).await
    }

    /// Runs the command line `args` (the program name first, as argv).
    pub async fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        super::run_from(args, self.overrides).await
    }
}
