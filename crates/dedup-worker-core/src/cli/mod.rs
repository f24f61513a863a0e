//! The command line, whole: what the stock `dedup-worker` binary runs, and what a service built
//! on the library runs with its own handler and migrations. Its `main` is one call:
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
//! ([`Service::run`] is [`run`] with the service.)
//!
//! Every subcommand is there (`serve`, `ingest`, `consume`, `relay`, `migrate`, `sign`, `dlq`,
//! `outbox`, `events`, `backfill`). The roles (`serve`, `ingest`, `consume`, `relay`) run with
//! the [`Service`]'s handler; `migrate` applies the library's migrations and then the service's;
//! the other commands read the store and ignore the handler. The
//! usage text names the program as it was started (argv\[0\]).
//!
//! The only place that uses `anyhow`: library errors are typed, and here they become one line
//! for a person at a terminal.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::startup::{Application, Service};

mod commands;
mod events;
mod repair;
mod retention;
mod service;

use events::EventsCommand;
use repair::{DlqCommand, OutboxCommand};
use retention::RetentionCommand;

/// The program name when argv\[0\] says none.
const DEFAULT_NAME: &str = "dedup-worker";

#[derive(Debug, Parser)]
#[command(
    name = "dedup-worker",
    version,
    about = "Effectively-once webhook and queue processing"
)]
struct Cli {
    /// A TOML file overriding config/default.toml (the environment overrides both).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the roles enabled in configuration (default: ingress, consumer and relay).
    Serve,
    /// Run only the HTTP ingress.
    Ingest,
    /// Run only the deduplicating consumer.
    Consume,
    /// Run only the outbox relay.
    Relay,
    /// Apply database migrations (the library's, then the application's) and exit.
    Migrate,
    /// Print a valid Stripe-Signature header for a payload file (`-` for stdin).
    Sign {
        /// The webhook secret (`whsec_…`), used whole as the HMAC key.
        #[arg(long)]
        secret: String,
        /// Unix seconds to sign at (default: now).
        #[arg(long)]
        timestamp: Option<i64>,
        /// FILE is a snapshot event: write the thin event (event notification) Stripe sends
        /// beside it to this path, and print the header for that thin event instead.
        #[arg(long, value_name = "OUT")]
        thin_event: Option<PathBuf>,
        /// The payload file, signed byte for byte.
        file: PathBuf,
    },
    /// Inspect and replay dead letters (by id, or by type and time).
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Inspect outbox rows that exhausted their delivery attempts; retry them, or re-send
    /// dispatched ones.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Inspect events by outcome.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Run retention now: purge what is past its window, make and drop the history's day
    /// partitions (PostgreSQL). Prints what it did as JSON.
    Retention {
        #[command(subcommand)]
        command: RetentionCommand,
    },
    /// List Stripe's events for a time range (GET /v1/events, STRIPE_API_KEY) and publish those
    /// not processed yet through the configured transport, as ingress would. Prints a JSON
    /// summary.
    Backfill {
        /// Events created at or after this: RFC 3339 (2026-11-01T00:00:00Z), a date
        /// (2026-11-01, UTC) or Unix seconds.
        #[arg(long, value_parser = commands::parse_time)]
        since: i64,
        /// Events created at or before this (same forms; default: now).
        #[arg(long, value_parser = commands::parse_time)]
        until: Option<i64>,
        /// Only events whose type matches (`*` for any run: `invoice.*`); repeatable.
        #[arg(long = "type", value_name = "PATTERN")]
        types: Vec<String>,
    },
}

/// Runs the command line of this process ([`std::env::args_os`]) with `service`; see
/// [`run_from`].
pub async fn run(service: Service) -> ExitCode {
    run_from(std::env::args_os(), service).await
}

/// Runs the command line `args` (the program name first, as argv) with `service` and returns
/// the exit status: 0 on success, 1 on an error (printed to stderr as one line,
/// `{program}: {error}: {cause}: …`, each cause said once), 2 on a usage error, and a command's
/// own statuses (`events show`: 3 when the event was not seen).
pub async fn run_from<I, T>(args: I, service: Service) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let name = program_name(args.first());
    let matches = Cli::command()
        .name(name.clone())
        .bin_name(name.clone())
        .try_get_matches_from(args);
    let cli = match matches.and_then(|mut m| Cli::from_arg_matches_mut(&mut m)) {
        Ok(cli) => cli,
        Err(usage) => {
            // Help and version on stdout (status 0), usage errors on stderr (status 2).
            let _ = usage.print();
            return ExitCode::from(u8::try_from(usage.exit_code()).unwrap_or(2));
        }
    };
    let log = Settings::log_settings(cli.config.as_deref());
    let telemetry = crate::telemetry::init(log.format);
    let result = run_command(cli, service).await;
    telemetry.shutdown();
    result.unwrap_or_else(|error| {
        eprintln!("{name}: {}", one_line(error.chain()));
        ExitCode::FAILURE
    })
}

/// The file name of argv\[0\] (without the platform's executable suffix).
fn program_name(argv0: Option<&OsString>) -> String {
    let name = argv0
        .and_then(|path| std::path::Path::new(path).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let suffix = std::env::consts::EXE_SUFFIX;
    let name = match name.strip_suffix(suffix) {
        Some(stem) if !suffix.is_empty() => stem.to_owned(),
        _ => name,
    };
    if name.is_empty() {
        DEFAULT_NAME.to_owned()
    } else {
        name
    }
}

/// An error and its causes on one line, `: ` between them, leaving out a cause whose text the
/// line says already (an error whose message includes its source's, as sqlx's and many others'
/// do, would otherwise say it twice).
fn one_line<'a>(chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut line = String::new();
    for error in chain {
        let text = error.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

async fn run_command(cli: Cli, service: Service) -> anyhow::Result<ExitCode> {
    let config = cli.config;
    let done = match cli.command {
        Command::Sign {
            secret,
            timestamp,
            thin_event,
            file,
        } => commands::sign(&secret, timestamp, thin_event.as_deref(), &file),
        Command::Serve => serve(config, None, service).await,
        Command::Ingest => serve(config, Some((true, false, false)), service).await,
        Command::Consume => serve(config, Some((false, true, false)), service).await,
        Command::Relay => serve(config, Some((false, false, true)), service).await,
        Command::Migrate => {
            let store = commands::connect(config).await?;
            store.migrate_with(&service.migrations).await?;
            println!("migrations applied ({})", store.backend_name());
            Ok(())
        }
        Command::Dlq { command } => repair::dlq(config, command).await,
        Command::Backfill {
            since,
            until,
            types,
        } => commands::backfill(config, since, until, types).await,
        Command::Events { command } => return events::events(config, command).await,
        Command::Outbox { command } => repair::outbox(config, command).await,
        Command::Retention { command } => retention::retention(config, command).await,
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// Runs the roles (`Some((ingress, consumer, relay))`, or those configured) until SIGINT or
/// SIGTERM, then drains.
async fn serve(
    config: Option<PathBuf>,
    roles: Option<(bool, bool, bool)>,
    service: Service,
) -> anyhow::Result<()> {
    let mut figment = Settings::figment(config.as_deref());
    if let Some((ingress, consumer, relay)) = roles {
        figment = figment
            .merge(("roles.ingress", ingress))
            .merge(("roles.consumer", consumer))
            .merge(("roles.relay", relay));
    }
    let settings = Settings::from_figment(figment)?;
    let app = Application::build(settings, service).await?;
    let addr = app.local_addr()?;
    // Installed before the listening line: a stop signal sent right after it (a rollout that
    // changes its mind, a supervisor that read the line) drains the process instead of
    // meeting the default action, which kills it mid-batch.
    let stop_signal = stop_signal()?;
    // Machine-readable for scripts and tests that bind port 0: the same words whatever the
    // program is called.
    println!("dedup-worker listening on http://{addr}");
    if let Some(admin) = app.local_admin_addr() {
        println!("dedup-worker console on http://{admin}");
    }
    std::io::stdout().flush()?;
    tracing::info!(%addr, store = app.store().backend_name(), "started");

    let shutdown = CancellationToken::new();
    let signal_token = shutdown.clone();
    tokio::spawn(async move {
        stop_signal.await;
        tracing::info!("stop signal received; draining");
        signal_token.cancel();
    });
    app.run(shutdown).await?;
    Ok(())
}

/// SIGTERM or SIGINT, registered now (the returned future only waits): a signal that arrives
/// before anything polls it is kept, not lost to the default action.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::{one_line, program_name};

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("context")]
    struct Context(#[source] Repeats);

    #[test]
    fn a_cause_the_line_says_already_is_left_out() {
        let error = Context(Repeats(std::io::Error::other("refused")));
        let chain =
            std::iter::successors(Some(&error as &(dyn std::error::Error + 'static)), |e| {
                e.source()
            });
        assert_eq!(one_line(chain), "context: outer: refused");
    }

    #[test]
    fn the_program_is_named_by_argv0s_file_name() {
        let name = |s: &str| program_name(Some(&OsString::from(s)));
        assert_eq!(name("/opt/bin/paid-invoices"), "paid-invoices");
        assert_eq!(name("dedup-worker"), "dedup-worker");
        assert_eq!(program_name(None), "dedup-worker");
        assert_eq!(name(""), "dedup-worker");
    }
}
