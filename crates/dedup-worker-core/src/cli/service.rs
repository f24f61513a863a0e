//! [`Service::run`]: a service of your own runs the command line of the `dedup-worker` binary.
//! The builder itself is on the wiring's floor (`startup/service.rs`), where tests start it too.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::startup::Service;

impl Service {
    /// Runs the command line of this process (`std::env::args_os`); the exit status as
    /// [`super::run`] gives it.
    pub async fn run(self) -> ExitCode {
        super::run(self).await
    }

    /// Runs the command line `args` (the program name first, as argv).
    pub async fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        super::run_from(args, self).await
    }
}
