//! The human-readable `events show` report: a headline (`stripe evt_1: handled`), then one line
//! per record, oldest stage first. Text that came from outside (handler errors, sinks' answers)
//! is made printable, so a report pasted from a terminal shows no control characters.

use std::fmt::Write as _;

use super::{time, EventReport, Outcome};
use crate::config::shown_destination;
use crate::event::printable;

/// The longest error text shown per line (the JSON carries it whole).
const MAX_ERROR_CHARS: usize = 300;

pub(super) fn render(report: &EventReport) -> String {
    let mut out = String::new();
    let outcome = report.outcome();
    // The story's label (the console's), then what it means here.
    let detail = match outcome {
        Outcome::Handled => "",
        Outcome::Stale => " (recorded by the stale-event guard, not handled)",
        Outcome::Queued => " (the database queue), not processed yet",
        Outcome::DeadLettered => ", not processed",
        Outcome::Redriven => ", not processed yet",
        Outcome::Discarded => " by an operator, not processed",
        Outcome::DuplicatesOnly => " (duplicate deliveries recorded, its own record is gone)",
        Outcome::NotSeen => "",
    };
    let headline = format!("{}{detail}", report.story().label());
    line(
        &mut out,
        format!("{} {}: {headline}", report.source, report.event_id),
    );
    if outcome == Outcome::NotSeen {
        let queue = match report.queued {
            Some(_) => ", nor a message in the database queue",
            None => " (messages still on RabbitMQ or SQS are not visible to the store)",
        };
        line(
            &mut out,
            format!(
                "  nothing recorded: no processed id within the dedup window, no duplicate \
                 delivery, dead letter, redrive, stale listing or outbox row{queue}"
            ),
        );
        return out;
    }
    if let Some(event_type) = report.event_type() {
        field(&mut out, "type", event_type.to_owned());
    }
    for dead in report.redrives.iter().filter(|r| r.discarded()) {
        field(
            &mut out,
            "discarded",
            format!(
                "dead letter #{} (dead-lettered {} on {} after {}: {}) discarded by {} at {}",
                dead.dead_letter_id,
                time(dead.dead_lettered_at),
                dead.queue,
                attempts(dead.attempts),
                printable(&dead.error, MAX_ERROR_CHARS),
                dead.actor.as_deref().unwrap_or("an operator"),
                time(dead.redriven_at)
            ),
        );
    }
    for dead in report.redrives.iter().filter(|r| !r.discarded()) {
        field(
            &mut out,
            "redriven",
            format!(
                "dead letter #{} (dead-lettered {} on {} after {}: {}) published to {} at {}",
                dead.dead_letter_id,
                time(dead.dead_lettered_at),
                dead.queue,
                attempts(dead.attempts),
                printable(&dead.error, MAX_ERROR_CHARS),
                dead.redriven_to,
                time(dead.redriven_at)
            ),
        );
    }
    for dead in &report.dead_letters {
        field(
            &mut out,
            &format!("dead letter #{}", dead.id),
            format!(
                "{} on {} after {}: {} (`dedup-worker dlq redrive {}` replays it)",
                time(dead.created_at),
                dead.queue,
                attempts(dead.attempts),
                printable(&dead.error, MAX_ERROR_CHARS),
                dead.id
            ),
        );
    }
    if let Some(processed) = &report.processed {
        let received = match processed.received_at {
            Some(at) => format!("{} (taken in by the transport)", time(at)),
            None => "not recorded (by this transport, or before this version)".to_owned(),
        };
        field(&mut out, "received", received);
        let stage = if report.stale.is_empty() {
            "handled"
        } else {
            "recorded"
        };
        let delivery = processed
            .delivery_attempt
            .map(|n| format!(", on delivery {n}"))
            .unwrap_or_default();
        field(
            &mut out,
            stage,
            format!("{}{delivery}", time(processed.processed_at)),
        );
    }
    for stale in &report.stale {
        field(
            &mut out,
            "stale",
            format!(
                "version {} of {} was held back: {} had version {} (listed {})",
                stale.version,
                stale.object_id,
                stale.newer_event_id,
                stale.newer_version,
                time(stale.recorded_at)
            ),
        );
    }
    let duplicates = &report.duplicates;
    let recognised = match (duplicates.count, duplicates.last_at) {
        (0, _) | (_, None) => "none recognised".to_owned(),
        (1, Some(last)) => format!(
            "1 later delivery recognised as a duplicate, at {}",
            time(last)
        ),
        (n, Some(last)) => format!(
            "{n}{} later deliveries recognised as duplicates, the first at {}, the last at {}",
            if n >= report.limit { " or more" } else { "" },
            time(duplicates.first_at.unwrap_or(last)),
            time(last)
        ),
    };
    field(&mut out, "duplicates", recognised);
    for row in &report.outbox {
        let sink = match &row.destination {
            Some(destination) => shown_destination(destination),
            None => "default sink".to_owned(),
        };
        let error = row
            .last_error
            .as_deref()
            .map(|e| format!("; last error: {}", printable(e, MAX_ERROR_CHARS)))
            .unwrap_or_default();
        let state = match (row.status.as_str(), row.dispatched_at) {
            ("dispatched", Some(at)) => {
                format!(
                    "dispatched at {} after {}",
                    time(at),
                    attempts(row.attempts)
                )
            }
            ("failed", _) => format!(
                "failed after {}, not retried (`dedup-worker outbox failed` lists it){error}",
                attempts(row.attempts)
            ),
            (status, _) => format!(
                "{status}, {} so far, next due {}{error}",
                attempts(row.attempts),
                time(row.next_attempt_at)
            ),
        };
        field(
            &mut out,
            &format!("outbox #{}", row.id),
            format!("to {sink}: {state}"),
        );
    }
    for (name, text) in report.attempts.iter().map(super::attempts::text_line) {
        field(&mut out, &name, text);
    }
    if report.processed.is_some() && report.outbox.is_empty() {
        field(
            &mut out,
            "outbox",
            "no row (the handler sent nothing, or retention removed it)".to_owned(),
        );
    }
    match &report.queued {
        Some(queued) => {
            for message in queued {
                field(
                    &mut out,
                    &format!("queued #{}", message.id),
                    format!(
                        "on {} since {}, {} so far, visible from {}",
                        message.queue,
                        time(message.enqueued_at),
                        deliveries(message.attempts),
                        time(message.visible_at)
                    ),
                );
            }
        }
        None => field(
            &mut out,
            "queue",
            "not looked up (the transport is not the database queue)".to_owned(),
        ),
    }
    let full = [
        report.dead_letters.len(),
        report.redrives.len(),
        report.outbox.len(),
        report.stale.len(),
        report.queued.as_ref().map_or(0, Vec::len),
    ];
    if full.iter().any(|n| *n as i64 >= report.limit) {
        line(
            &mut out,
            format!("  (each list shows its first {})", report.limit),
        );
    }
    out
}

fn line(out: &mut String, text: String) {
    let _ = writeln!(out, "{text}");
}

/// `  name        value`, names in a column.
fn field(out: &mut String, name: &str, value: String) {
    let _ = writeln!(out, "  {name:<15} {value}");
}

fn attempts(n: i32) -> String {
    if n == 1 {
        "1 attempt".to_owned()
    } else {
        format!("{n} attempts")
    }
}

fn deliveries(n: i32) -> String {
    if n == 1 {
        "1 delivery".to_owned()
    } else {
        format!("{n} deliveries")
    }
}
