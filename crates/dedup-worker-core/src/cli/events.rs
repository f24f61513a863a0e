//! `events`: `show` (what happened to one event), `list` (events by type, time and outcome,
//! newest first, a page at a time: the console's `/events` on a terminal) and `stale`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use super::commands::{connect, store_settings};
use crate::config::TransportKind;
use crate::event::{check_event_field, EventField};
use crate::inspect::{
    self, search_events, EventQuery, ListOptions, OutcomeFilter, SearchError, ShowOptions, MAX_PAGE,
};
use crate::store::Store;

#[derive(Debug, Subcommand)]
pub(super) enum EventsCommand {
    /// Events by type prefix, time range and outcome, or by customer, object or id prefix (their
    /// kept bodies), newest first (the console's /events).
    List(ListArgs),
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

pub(super) async fn events(
    config: Option<PathBuf>,
    command: EventsCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        EventsCommand::Show { id, source, json } => show(config, &source, &id, json).await,
        EventsCommand::List(args) => list(config, args).await.map(|()| ExitCode::SUCCESS),
        EventsCommand::Stale { limit } => {
            let store = connect(config).await?;
            for stale in store.stale_events().list(limit).await? {
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
        statement_timeout: settings.database.statement_timeout,
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

/// `events list`'s flags.
#[derive(Debug, clap::Args)]
pub(super) struct ListArgs {
    /// Only events whose type starts with this (`invoice.` or `invoice.paid`).
    #[arg(long = "type", value_name = "PREFIX")]
    type_prefix: Option<String>,
    /// At or after this: RFC 3339, a date (UTC) or Unix seconds.
    #[arg(long, value_parser = super::commands::parse_time)]
    since: Option<i64>,
    /// Before this (same forms).
    #[arg(long, value_parser = super::commands::parse_time)]
    until: Option<i64>,
    /// any, handled, duplicate, dead_letter, stale or pending.
    #[arg(long, default_value = "any", value_parser = parse_outcome)]
    outcome: OutcomeFilter,
    /// Only this event id (under each source configured), or ids starting with a prefix of at
    /// least 4 characters ending in `*` (`evt_1ab*`: kept bodies).
    #[arg(long)]
    id: Option<String>,
    /// Events of this customer (`search.customer_pointer`'s value in their kept bodies).
    #[arg(long, value_name = "ID")]
    customer: Option<String>,
    /// Events about this object (`search.object_pointer`'s value in their kept bodies).
    #[arg(long, value_name = "ID")]
    object: Option<String>,
    /// Only this source's events: a `[sources.NAME]` name, `stripe`, or Standard Webhooks'
    /// `standard_webhooks.source`.
    #[arg(long, value_name = "NAME")]
    source: Option<String>,
    /// Rows to print (at most 500 a page; `--after` goes on).
    #[arg(long, default_value_t = 100)]
    limit: i64,
    /// The cursor printed after the previous page (`next: …`, or the `next` JSON line).
    #[arg(long, conflicts_with = "before")]
    after: Option<String>,
    /// The page of newer events before this cursor (`previous: …`, or the `previous` JSON line).
    #[arg(long)]
    before: Option<String>,
    /// One JSON object a line, then `{"next": CURSOR}` when there is more.
    #[arg(long)]
    json: bool,
}

fn parse_outcome(value: &str) -> Result<OutcomeFilter, String> {
    OutcomeFilter::parse(value).ok_or_else(|| format!("one of {}", OutcomeFilter::NAMES.join(", ")))
}

async fn list(config: Option<PathBuf>, args: ListArgs) -> anyhow::Result<()> {
    let settings = store_settings(config)?;
    let store = Store::connect(&settings).await?;
    for (flag, value) in [
        ("--id", &args.id),
        ("--customer", &args.customer),
        ("--object", &args.object),
    ] {
        // What no kept field can hold would only fail in the database, less clearly.
        if let Some(value) = value {
            check_event_field(EventField::Id, value).context(flag)?;
        }
    }
    let query = EventQuery {
        id: args.id,
        customer: args.customer,
        object: args.object,
        type_prefix: args.type_prefix,
        source: args.source,
        since_ms: args.since.map(|s| s.saturating_mul(1000)),
        until_ms: args.until.map(|s| s.saturating_mul(1000)),
        outcome: args.outcome,
        cursor: args.after,
        before: args.before,
        limit: args.limit.clamp(1, MAX_PAGE),
    };
    let page = match search_events(&store, &query, &ListOptions::from_settings(&settings)).await {
        Ok(page) => page,
        Err(SearchError::Field { field, reason }) => anyhow::bail!("--{field}: {reason}"),
        Err(other) => return Err(other).context("listing events"),
    };
    if let Some(total) = page.total {
        if args.json {
            println!("{}", total.to_json());
        } else {
            println!("found: {}", total.shown());
        }
    }
    for event in &page.events {
        if args.json {
            println!("{}", event.to_json());
        } else {
            println!(
                "{}  {:<28}  {:<40}  {}/{}",
                crate::inspect::time(event.at_ms),
                event.story.label(),
                event.event_type,
                event.source,
                event.event_id
            );
        }
    }
    if let Some(previous) = page.previous {
        if args.json {
            println!("{}", serde_json::json!({ "previous": previous }));
        } else {
            println!("previous: --before {previous}");
        }
    }
    if let Some(next) = page.next {
        if args.json {
            println!("{}", serde_json::json!({ "next": next }));
        } else {
            println!("next: --after {next}");
        }
    }
    store.close().await;
    Ok(())
}
