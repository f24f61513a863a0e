//! The commands that list and repair what the pipeline could not finish: `dlq list`,
//! `dlq redrive`, `outbox failed`, `outbox retry`, `outbox resend`, and the lanes' `outbox
//! sinks`, `outbox pause SINK`, `outbox resume SINK`. The bulk actions run
//! [`crate::operator`]'s functions (as the console does), print a one-line JSON summary
//! (`{"action":…,"dry_run":…,"count":…,"filter":{…}}`), and are recorded in `admin_actions`
//! as `cli (…$USER)`. `--dry-run` counts what the action would take and changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{ArgGroup, Args, Subcommand};

use super::commands::{connect, parse_time, store_settings};
use crate::config::{lane_label, shown_destination};
use crate::operator::{self, Action, Actor, RowFilter};
use crate::startup::build_transport;
use crate::store::{Circuit, Store, Wakeups};

/// Which rows by type and time (each command says which time). Unset: any.
#[derive(Debug, Clone, Default, Args)]
pub(super) struct FilterArgs {
    /// Only events whose type starts with this (an exact type is its own prefix).
    #[arg(long = "type", value_name = "PREFIX")]
    type_prefix: Option<String>,
    /// Only rows at or after this: RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01, UTC)
    /// or Unix seconds.
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    since: Option<i64>,
    /// Only rows before this (same forms).
    #[arg(long, value_parser = parse_time, value_name = "TIME")]
    until: Option<i64>,
}

impl FilterArgs {
    /// The filter, restricted to `ids` when there are any; times in milliseconds.
    fn filter(self, ids: Vec<i64>) -> RowFilter {
        RowFilter {
            type_prefix: self.type_prefix,
            since_ms: self.since.map(|s| s.saturating_mul(1000)),
            until_ms: self.until.map(|s| s.saturating_mul(1000)),
            ids,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum DlqCommand {
    /// List dead letters (oldest first) as JSON lines; --type, --since and --until (when it
    /// was dead-lettered) narrow the list.
    List {
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Publish dead letters again through the configured transport, each to the queue it was
    /// recorded on, deleting each once its publish succeeded. Which: IDS, --all, or a filter
    /// (--type, --since, --until: when it was dead-lettered; with IDS, among those).
    #[command(group(
        ArgGroup::new("selection")
            .required(true)
            .multiple(true)
            .args(["ids", "all", "type_prefix", "since", "until"])
    ))]
    Redrive {
        /// Dead letter ids.
        #[arg(conflicts_with = "all")]
        ids: Vec<i64>,
        /// Redrive every dead letter (that the filter selects, if one is given).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Publish to this queue (name, or SQS queue URL) instead of each one's recorded queue.
        #[arg(long, value_name = "QUEUE")]
        queue: Option<String>,
        /// Print how many would be redriven; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete dead letters for good (junk: no event id, not JSON, not wanted), each leaving a
    /// record of what it was and who discarded it (`events show` and the console's page of the
    /// dead letter show it); nothing is published. Which: IDS, --all, or a filter.
    #[command(group(
        ArgGroup::new("selection")
            .required(true)
            .multiple(true)
            .args(["ids", "all", "type_prefix", "since", "until"])
    ))]
    Discard {
        /// Dead letter ids.
        #[arg(conflicts_with = "all")]
        ids: Vec<i64>,
        /// Discard every dead letter (that the filter selects, if one is given).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print how many would be discarded; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum OutboxCommand {
    /// List failed outbox rows as JSON lines.
    Failed {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Deliver failed rows again: back to pending with a fresh count of attempts, delivered
    /// under their original idempotency key. --since and --until: when the row was written.
    Retry {
        /// Retry rows that failed (required: it names what is retried).
        #[arg(long, required = true)]
        failed: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print how many would be retried; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Deliver dispatched rows a second time, under their original idempotency key (for a
    /// receiver that lost them): the rows dispatched in [--since, --until).
    Resend {
        /// Rows dispatched at or after this: RFC 3339, a date (UTC) or Unix seconds.
        #[arg(long, value_parser = parse_time, value_name = "TIME")]
        since: i64,
        /// Rows dispatched before this (same forms; default: now).
        #[arg(long, value_parser = parse_time, value_name = "TIME")]
        until: Option<i64>,
        /// Only events whose type starts with this (an exact type is its own prefix).
        #[arg(long = "type", value_name = "PREFIX")]
        type_prefix: Option<String>,
        /// Print how many would be re-sent; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List the lanes the store has state for (paused, circuit, the receiver's hold, last
    /// error) as JSON lines.
    Sinks,
    /// Stop delivering to SINK from every relay (deliveries in flight finish); its rows wait
    /// without spending attempts. Recorded as `sink_pause`.
    Pause {
        /// `default`, a `[outbox.sinks.NAME]`, or an ad-hoc lane as `outbox sinks` lists it.
        sink: String,
    },
    /// Deliver to SINK again: not paused, its circuit closed, the receiver's hold lifted.
    /// Recorded as `sink_resume`.
    Resume { sink: String },
    /// List the keys of ordered sinks held by a row that failed for good (its id, lane, key,
    /// error, and how many rows wait behind it) as JSON lines.
    Held {
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Skip failed row ID: it stays failed, and the next row of its ordering key may go (the
    /// key's order is broken on purpose). Recorded as `outbox_skip`.
    Skip { id: i64 },
}

/// The one-line summary of a bulk action (or of its dry run), its fields in this order.
#[derive(serde::Serialize)]
struct Summary<'a> {
    action: &'static str,
    dry_run: bool,
    count: u64,
    filter: &'a RowFilter,
}

fn print_summary(action: Action, dry_run: bool, count: u64, filter: &RowFilter) {
    let summary = Summary {
        action: action.name(),
        dry_run,
        count,
        filter,
    };
    // Plain data: serializing it cannot fail.
    println!("{}", serde_json::to_string(&summary).unwrap_or_default());
}

/// `dlq list` and `dlq redrive`.
pub(super) async fn dlq(config: Option<PathBuf>, command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::List { limit, filter } => {
            let store = connect(config).await?;
            let filter = filter.filter(Vec::new());
            for dl in store
                .bulk()
                .dead_letters_where(&filter, 0, i64::MAX, limit)
                .await?
            {
                let line = serde_json::json!({
                    "id": dl.id, "source": dl.source, "event_id": dl.event_id,
                    "event_type": dl.event_type, "queue": dl.queue, "error": dl.error,
                    "attempts": dl.attempts, "payload": String::from_utf8_lossy(&dl.payload),
                });
                println!("{line}");
            }
            Ok(())
        }
        DlqCommand::Redrive {
            ids,
            all: _,
            filter,
            queue,
            dry_run,
        } => redrive(config, filter.filter(ids), queue.as_deref(), dry_run).await,
        DlqCommand::Discard {
            ids,
            all: _,
            filter,
            dry_run,
        } => discard(config, filter.filter(ids), dry_run).await,
    }
}

/// `dlq discard`: the summary (also when it stopped part-way, before the error).
async fn discard(config: Option<PathBuf>, filter: RowFilter, dry_run: bool) -> anyhow::Result<()> {
    let store = connect(config).await?;
    if dry_run {
        let count = operator::count_dead_letters(&store, &filter).await?;
        print_summary(Action::DlqDiscard, true, count, &filter);
        return Ok(());
    }
    let result = operator::discard_dead_letters(&store, &filter, &Actor::cli()).await;
    let discarded = match &result {
        Ok(done) => done.count,
        Err(error) => error.discarded,
    };
    print_summary(Action::DlqDiscard, false, discarded, &filter);
    result?;
    Ok(())
}

/// `dlq redrive`: the summary, then `redriven: N` (the line scripts read before the summary
/// existed), also when it stopped part-way, before the error.
async fn redrive(
    config: Option<PathBuf>,
    filter: RowFilter,
    to_queue: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let settings = store_settings(config)?;
    let store = Store::connect(&settings).await?;
    if dry_run {
        let count = operator::count_dead_letters(&store, &filter).await?;
        print_summary(Action::DlqRedrive, true, count, &filter);
        return Ok(());
    }
    let transport = build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
    let result = operator::redrive_dead_letters(
        &store,
        transport.as_ref(),
        &filter,
        to_queue,
        &Actor::cli(),
    )
    .await;
    let redriven = match &result {
        Ok(n) => *n,
        Err(error) => error.redriven(),
    };
    print_summary(Action::DlqRedrive, false, redriven, &filter);
    println!("redriven: {redriven}");
    result?;
    Ok(())
}

/// `outbox failed`, `outbox retry` and `outbox resend`.
pub(super) async fn outbox(config: Option<PathBuf>, command: OutboxCommand) -> anyhow::Result<()> {
    let configured: Vec<String> = store_settings(config.clone())?
        .outbox
        .sinks
        .into_keys()
        .collect();
    let store = connect(config).await?;
    match command {
        OutboxCommand::Sinks => {
            for lane in operator::lane_states(&store).await? {
                let line = serde_json::json!({
                    "sink": lane_label(&lane.sink), "paused": lane.paused,
                    "paused_by": lane.paused_by, "circuit": lane.circuit, "trips": lane.trips,
                    "probe_in_ms": (lane.circuit != Circuit::Closed)
                        .then(|| lane.probe_in().as_millis() as u64),
                    "held_for_ms": lane.held_for().map(|d| d.as_millis() as u64),
                    "last_error": lane.last_error,
                });
                println!("{line}");
            }
        }
        OutboxCommand::Pause { sink } => {
            let paused = operator::pause_sink(&store, &configured, &sink, &Actor::cli()).await?;
            let line = serde_json::json!({"action": "sink_pause", "sink": lane_label(&sink), "changed": paused});
            println!("{line}");
        }
        OutboxCommand::Resume { sink } => {
            let resumed = operator::resume_sink(&store, &configured, &sink, &Actor::cli()).await?;
            let line = serde_json::json!({"action": "sink_resume", "sink": lane_label(&sink), "changed": resumed});
            println!("{line}");
        }
        OutboxCommand::Held { limit } => {
            for held in operator::held_keys(&store, limit).await? {
                let line = serde_json::json!({
                    "id": held.id, "sink": lane_label(&held.sink), "ordering_key": held.ordering_key,
                    "event_id": held.event_id, "last_error": held.last_error, "waiting": held.waiting,
                });
                println!("{line}");
            }
        }
        OutboxCommand::Skip { id } => {
            let skipped = operator::skip_delivery(&store, id, &Actor::cli()).await?;
            let Some((sink, key)) = skipped else {
                anyhow::bail!("outbox row {id} is not a failed row (or was skipped already); `dedup-worker outbox held` lists the rows holding a key");
            };
            let line = serde_json::json!({"action": "outbox_skip", "id": id, "sink": lane_label(&sink), "ordering_key": key});
            println!("{line}");
        }
        OutboxCommand::Failed { limit } => {
            for row in store.outbox().failed(limit).await? {
                let line = serde_json::json!({
                    "id": row.id, "event_id": row.event_id,
                    "destination": row.destination.as_deref().map(shown_destination),
                    "idempotency_key": row.idempotency_key, "attempts": row.attempts,
                });
                println!("{line}");
            }
        }
        OutboxCommand::Retry {
            failed: _,
            filter,
            dry_run,
        } => {
            let filter = filter.filter(Vec::new());
            let count = if dry_run {
                operator::count_failed_deliveries(&store, &filter).await?
            } else {
                operator::retry_failed_deliveries(&store, &filter, &Actor::cli()).await?
            };
            print_summary(Action::OutboxRetry, dry_run, count, &filter);
        }
        OutboxCommand::Resend {
            since,
            until,
            type_prefix,
            dry_run,
        } => {
            let filter = FilterArgs {
                type_prefix,
                since: Some(since),
                until,
            }
            .filter(Vec::new());
            let count = if dry_run {
                operator::count_dispatched_deliveries(&store, &filter).await?
            } else {
                operator::resend_dispatched_deliveries(&store, &filter, &Actor::cli()).await?
            };
            print_summary(Action::OutboxResend, dry_run, count, &filter);
        }
    }
    Ok(())
}
