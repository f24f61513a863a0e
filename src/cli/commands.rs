//! The commands that read or repair the store and then exit: `sign`, `dlq`, `backfill`,
//! `events`, `outbox`. None of them runs the handler.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

use crate::backfill::{self, BackfillLimits, BackfillRange};
use crate::config::{shown_destination, Settings, TransportKind};
use crate::dlq;
use crate::event::{check_event_field, EventField};
use crate::inspect::{self, ShowOptions};
use crate::signature::stripe::signature_header;
use crate::startup::build_transport;
use crate::store::{Store, Wakeups};
use crate::stripe::StripeApi;

#[derive(Debug, Subcommand)]
pub(super) enum EventsCommand {
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
        #[arg(long, default_value = crate::stripe::SOURCE)]
        source: String,
        /// Print one JSON object (fields: the book's "What happened to an event?").
        #[arg(long)]
        json: bool,
    },
}

/// `events show`'s exit status when nothing of the event is recorded (0: found; 1: an error;
/// 2: a usage error, clap's).
const NOT_SEEN: u8 = 3;

#[derive(Debug, Subcommand)]
pub(super) enum DlqCommand {
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
pub(super) enum OutboxCommand {
    /// List failed outbox rows as JSON lines.
    Failed {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
}

/// A `--since`/`--until` value as Unix seconds.
pub(super) fn parse_time(value: &str) -> Result<i64, String> {
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

/// `sign`: prints the `Stripe-Signature` header for the file (or its thin event).
pub(super) fn sign(
    secret: &str,
    timestamp: Option<i64>,
    thin_event: Option<&Path>,
    file: &Path,
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
        payload = crate::stripe::thin_event_beside(&payload)
            .context("--thin-event: FILE must be a Stripe snapshot event")?;
        std::fs::write(out, &payload).with_context(|| format!("writing {}", out.display()))?;
    }
    let t = timestamp.unwrap_or_else(|| chrono::Utc::now().timestamp());
    println!("{}", signature_header(secret, t, &payload));
    Ok(())
}

/// `dlq list` and `dlq redrive`.
pub(super) async fn dlq(config: Option<PathBuf>, command: DlqCommand) -> anyhow::Result<()> {
    let settings = store_settings(config)?;
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
            let transport = build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
            let result = dlq::redrive(&store, transport.as_ref(), &ids, queue.as_deref()).await;
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

/// `backfill`: lists Stripe's events in the range and publishes those not processed yet.
pub(super) async fn backfill(
    config: Option<PathBuf>,
    since: i64,
    until: Option<i64>,
    types: Vec<String>,
) -> anyhow::Result<()> {
    let settings = store_settings(config)?;
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
        BackfillLimits {
            publish_timeout: Duration::from_millis(settings.transport.publish_timeout_ms),
            max_page_bytes: backfill::page_limit(settings.consumer.max_message_bytes),
        },
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

/// `events stale` and `events show` (whose status says whether the event was seen).
pub(super) async fn events(
    config: Option<PathBuf>,
    command: EventsCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        EventsCommand::Show { id, source, json } => show(config, &source, &id, json).await,
        EventsCommand::Stale { limit } => {
            let store = connect(config).await?;
            for stale in store.stale_events(limit).await? {
                let line = serde_json::json!({
                    "source": stale.source, "event_id": stale.event_id,
                    "event_type": stale.event_type, "object_id": stale.object_id,
                    "version": stale.version, "newer_event_id": stale.newer_event_id,
                    "newer_version": stale.newer_version,
                });
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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

/// `outbox failed`.
pub(super) async fn outbox(config: Option<PathBuf>, command: OutboxCommand) -> anyhow::Result<()> {
    let OutboxCommand::Failed { limit } = command;
    let store = connect(config).await?;
    for row in store.failed_outbox(limit).await? {
        let line = serde_json::json!({
            "id": row.id, "event_id": row.event_id,
            "destination": row.destination.as_deref().map(shown_destination),
            "idempotency_key": row.idempotency_key, "attempts": row.attempts,
        });
        println!("{line}");
    }
    Ok(())
}

/// Loads settings for commands that only need the store (no secret required).
pub(super) async fn connect(config: Option<PathBuf>) -> anyhow::Result<Store> {
    Ok(Store::connect(&store_settings(config)?).await?)
}

/// Settings without the ingress role, which is what requires a webhook secret.
fn store_settings(config: Option<PathBuf>) -> anyhow::Result<Settings> {
    let figment = Settings::figment(config.as_deref()).merge(("roles.ingress", false));
    Ok(Settings::from_figment(figment)?)
}
