//! The binary's commands. The only place that uses `anyhow`: library errors are typed, and here
//! they become messages for a person at a terminal.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use dedup_worker::backfill::{self, BackfillRange};
use dedup_worker::config::{Settings, TransportKind};
use dedup_worker::dlq;
use dedup_worker::event::{check_event_field, EventField};
use dedup_worker::inspect::{self, ShowOptions};
use dedup_worker::startup::{build_transport, Application, Overrides};
use dedup_worker::store::{Store, Wakeups};
use dedup_worker::stripe::StripeApi;
use dedup_worker::webhook::stripe::signature_header;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "dedup-worker",
    version,
    about = "Effectively-once webhook and queue processing"
)]
pub struct Cli {
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
    /// Apply database migrations and exit.
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
    /// Inspect and replay dead letters.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Inspect outbox rows that exhausted their delivery attempts.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Inspect events by outcome.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// List Stripe's events for a time range (GET /v1/events, STRIPE_API_KEY) and publish those
    /// not processed yet through the configured transport, as ingress would. Prints a JSON
    /// summary.
    Backfill {
        /// Events created at or after this: RFC 3339 (2026-11-01T00:00:00Z), a date
        /// (2026-11-01, UTC) or Unix seconds.
        #[arg(long, value_parser = parse_time)]
        since: i64,
        /// Events created at or before this (same forms; default: now).
        #[arg(long, value_parser = parse_time)]
        until: Option<i64>,
        /// Only events whose type matches (`*` for any run: `invoice.*`); repeatable.
        #[arg(long = "type", value_name = "PATTERN")]
        types: Vec<String>,
    },
}

/// A `--since`/`--until` value as Unix seconds.
fn parse_time(value: &str) -> Result<i64, String> {
    if let Ok(secs) = value.parse::<i64>() {
        return Ok(secs);
    }
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(value) {
        return Ok(at.timestamp());
    }
    chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp())
        .ok_or_else(|| {
            format!("{value:?} is not RFC 3339 (2026-11-01T00:00:00Z), a date or Unix seconds")
        })
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Events the stale-event guard held back (newest first), as JSON lines with the newer
    /// event that made each stale.
    Stale {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// What happened to one event: when it was received, whether it was handled, deduplicated,
    /// dead-lettered or stale, its outbox rows and whether it waits in the database queue.
    /// Exits 0 when anything of it is recorded, 3 when it was not seen.
    Show {
        /// The event id (`evt_…`; a Standard Webhooks `webhook-id`).
        id: String,
        /// The source half of the dedup key (`standard_webhooks.source` for Standard Webhooks).
        #[arg(long, default_value = "stripe")]
        source: String,
        /// Print one JSON object (fields: README, "What happened to an event?").
        #[arg(long)]
        json: bool,
    },
}

/// `events show`'s exit status when nothing of the event is recorded (0: found; 1: an error;
/// 2: a usage error, clap's).
const NOT_SEEN: u8 = 3;

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// List dead letters as JSON lines.
    List {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Publish dead letters again through the configured transport, each to the queue it was
    /// recorded on, deleting each once its publish succeeded.
    Redrive {
        /// Dead letter ids.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<i64>,
        /// Redrive every dead letter.
        #[arg(long)]
        all: bool,
        /// Publish to this queue (name, or SQS queue URL) instead of each one's recorded queue.
        #[arg(long, value_name = "QUEUE")]
        queue: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// List failed outbox rows as JSON lines.
    Failed {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
}

/// `events show`: the report on stdout; exit status [`NOT_SEEN`] when nothing is recorded.
async fn show(
    config: Option<PathBuf>,
    source: &str,
    id: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // An id no event can have would only fail in the database, less clearly.
    check_event_field(EventField::Source, source).context("--source")?;
    check_event_field(EventField::Id, id).context("the event id")?;
    let settings = store_settings(config)?;
    let store = Store::connect(&settings).await?;
    let options = ShowOptions {
        statement_timeout: Duration::from_millis(settings.database.statement_timeout_ms),
        database_queue: settings.transport.kind == TransportKind::Database,
        default_source: settings.consumer.source.clone(),
        limit: 100,
    };
    let report = inspect::event_report(&store, source, id, &options).await?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(if report.found() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(NOT_SEEN)
    })
}

pub async fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let log = Settings::log_settings(cli.config.as_deref());
    let telemetry = dedup_worker::telemetry::init(log.format);
    let result = run_command(cli).await;
    telemetry.shutdown();
    result
}

async fn run_command(cli: Cli) -> anyhow::Result<ExitCode> {
    let done = match cli.command {
        Command::Sign {
            secret,
            timestamp,
            thin_event,
            file,
        } => sign(&secret, timestamp, thin_event.as_deref(), &file),
        Command::Serve => serve(cli.config, None).await,
        Command::Ingest => serve(cli.config, Some((true, false, false))).await,
        Command::Consume => serve(cli.config, Some((false, true, false))).await,
        Command::Relay => serve(cli.config, Some((false, false, true))).await,
        Command::Migrate => {
            let store = connect(cli.config).await?;
            store.migrate().await?;
            println!("migrations applied ({})", store.backend_name());
            Ok(())
        }
        Command::Dlq { command } => {
            let settings = store_settings(cli.config)?;
            let store = Store::connect(&settings).await?;
            match command {
                DlqCommand::List { limit } => {
                    for dl in store.dead_letters(limit).await? {
                        let line = serde_json::json!({
                            "id": dl.id, "source": dl.source, "event_id": dl.event_id,
                            "event_type": dl.event_type, "queue": dl.queue, "error": dl.error,
                            "attempts": dl.attempts, "payload": String::from_utf8_lossy(&dl.payload),
                        });
                        println!("{line}");
                    }
                }
                DlqCommand::Redrive { ids, all, queue } => {
                    let ids = if all { Vec::new() } else { ids };
                    let transport =
                        build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
                    let result =
                        dlq::redrive(&store, transport.as_ref(), &ids, queue.as_deref()).await;
                    // What was redriven before a failure is said either way.
                    let redriven = match &result {
                        Ok(n) => *n,
                        Err(
                            dlq::RedriveError::Store { redriven, .. }
                            | dlq::RedriveError::Publish { redriven, .. }
                            | dlq::RedriveError::Unaddressable { redriven, .. },
                        ) => *redriven,
                    };
                    println!("redriven: {redriven}");
                    result?;
                }
            }
            Ok(())
        }
        Command::Backfill {
            since,
            until,
            types,
        } => {
            let settings = store_settings(cli.config)?;
            anyhow::ensure!(
                !settings.stripe.api_key.expose().is_empty(),
                "backfill lists events with Stripe's API: set STRIPE_API_KEY (stripe.api_key)"
            );
            let store = Store::connect(&settings).await?;
            let transport = build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
            let api = StripeApi::new(
                &settings.stripe.api_base,
                settings.stripe.api_key.clone(),
                &settings.stripe.api_version,
                backfill::REQUEST_TIMEOUT,
            )?;
            let range = BackfillRange {
                since,
                until,
                types,
            };
            let on_terminal = std::io::stderr().is_terminal();
            let summary = backfill::backfill(
                &api,
                &range,
                &store,
                transport.as_ref(),
                Duration::from_millis(settings.transport.publish_timeout_ms),
                |s| {
                    let line = format!(
                        "backfill: page {}, listed {}, enqueued {}, already processed {}",
                        s.pages, s.listed, s.enqueued, s.already_processed
                    );
                    // A line rewritten in place on a terminal; one line per page otherwise.
                    if on_terminal {
                        eprint!("\r{line}");
                    } else {
                        eprintln!("{line}");
                    }
                },
            )
            .await;
            if on_terminal {
                eprintln!();
            }
            let summary = summary?;
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        Command::Events {
            command: EventsCommand::Show { id, source, json },
        } => return show(cli.config, &source, &id, json).await,
        Command::Events {
            command: EventsCommand::Stale { limit },
        } => {
            let store = connect(cli.config).await?;
            for stale in store.stale_events(limit).await? {
                let line = serde_json::json!({
                    "source": stale.source, "event_id": stale.event_id,
                    "event_type": stale.event_type, "object_id": stale.object_id,
                    "version": stale.version, "newer_event_id": stale.newer_event_id,
                    "newer_version": stale.newer_version,
                });
                println!("{line}");
            }
            Ok(())
        }
        Command::Outbox {
            command: OutboxCommand::Failed { limit },
        } => {
            let store = connect(cli.config).await?;
            for row in store.failed_outbox(limit).await? {
                let line = serde_json::json!({
                    "id": row.id, "event_id": row.event_id, "destination": row.destination,
                    "idempotency_key": row.idempotency_key, "attempts": row.attempts,
                });
                println!("{line}");
            }
            Ok(())
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

fn sign(
    secret: &str,
    timestamp: Option<i64>,
    thin_event: Option<&std::path::Path>,
    file: &PathBuf,
) -> anyhow::Result<()> {
    let mut payload = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        buf
    } else {
        std::fs::read(file).with_context(|| format!("reading {}", file.display()))?
    };
    if let Some(out) = thin_event {
        payload = dedup_worker::stripe::thin_event_beside(&payload)
            .context("--thin-event: FILE must be a Stripe snapshot event")?;
        std::fs::write(out, &payload).with_context(|| format!("writing {}", out.display()))?;
    }
    let t = timestamp.unwrap_or_else(|| chrono::Utc::now().timestamp());
    println!("{}", signature_header(secret, t, &payload));
    Ok(())
}

/// Loads settings for commands that only need the store (no secret required).
async fn connect(config: Option<PathBuf>) -> anyhow::Result<Store> {
    Ok(Store::connect(&store_settings(config)?).await?)
}

/// Settings without the ingress role, which is what requires a webhook secret.
fn store_settings(config: Option<PathBuf>) -> anyhow::Result<Settings> {
    let figment = Settings::figment(config.as_deref()).merge(("roles.ingress", false));
    Ok(Settings::from_figment(figment)?)
}

async fn serve(config: Option<PathBuf>, roles: Option<(bool, bool, bool)>) -> anyhow::Result<()> {
    let mut figment = Settings::figment(config.as_deref());
    if let Some((ingress, consumer, relay)) = roles {
        figment = figment
            .merge(("roles.ingress", ingress))
            .merge(("roles.consumer", consumer))
            .merge(("roles.relay", relay));
    }
    let settings = Settings::from_figment(figment)?;
    let app = Application::build(settings, Overrides::default()).await?;
    let addr = app.local_addr()?;
    // Machine-readable for scripts and tests that bind port 0.
    println!("dedup-worker listening on http://{addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, store = app.store().backend_name(), "started");

    let shutdown = CancellationToken::new();
    let signal_token = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stop signal received; draining");
        signal_token.cancel();
    });
    app.run(shutdown).await?;
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
