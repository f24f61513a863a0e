//! `dedup-worker events show`: what happened to one event, from everything the store recorded
//! of it: its dedup record (when the transport took it in, on which delivery it was handled, and
//! when), the later deliveries recognised as its duplicates, the stale guard's record, its dead
//! letters and the redrives of earlier ones, its outbox rows, and its messages still waiting in
//! the database queue. [`EventReport::to_json`] is the form for scripts, [`EventReport::to_text`]
//! the one for people (`text.rs`).
//!
//! Only the store is read: messages on RabbitMQ or SQS are not visible here, and what retention
//! removed (ids past the dedup window, dispatched outbox rows past `outbox.retention_hours`) is
//! gone. Each read is bounded in rows and by the statement timeout.

mod attempts;
mod list;
mod search;
mod story;
mod text;

use std::time::Duration;

use serde_json::{json, Value};

pub use list::{
    kind_name, list_events, EventPage, EventQuery, ListError, ListOptions, ListedEvent,
    OutcomeFilter, Total, MAX_PAGE,
};
pub use search::{search_events, IdMatch, Plan, SearchError, MIN_ID_PREFIX, TOTAL_CAP};
pub use story::Story;

use crate::config::shown_destination;
use crate::store::{
    bounded, AttemptRecord, DeadLetterRecord, DuplicateDeliveries, OutboxRecord, ProcessedRecord,
    QueuedRecord, RedriveRecord, StaleRecord, Store, StoreError,
};

/// How to look.
#[derive(Debug, Clone)]
pub struct ShowOptions {
    /// Each read's bound (`database.statement_timeout`).
    pub statement_timeout: Duration,
    /// Whether the transport is the database queue, the one transport whose waiting messages
    /// the store holds.
    pub database_queue: bool,
    /// The source a queued message without one is consumed under (`consumer.source`).
    pub default_source: String,
    /// The most entries listed of each kind (and duplicates counted).
    pub limit: i64,
}

/// A read failed; the report would be incomplete, so there is none.
#[derive(Debug, thiserror::Error)]
#[error("reading {what} of the event")]
pub struct ShowError {
    what: &'static str,
    #[source]
    source: StoreError,
}

/// The event's state, from the most telling record: the latest stage it reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Processed: its handler ran and committed.
    Handled,
    /// Processed, held back by the stale guard: recorded, not handled.
    Stale,
    /// Not processed yet, waiting in the database queue (first delivery, retry or redrive).
    Queued,
    /// Dead-lettered, not processed.
    DeadLettered,
    /// Dead-lettered and redriven to a queue the store cannot see into, not processed yet.
    Redriven,
    /// Dead-lettered, then discarded by an operator: never processed, on purpose.
    Discarded,
    /// Only deliveries recognised as duplicates are recorded: its own processed id is past the
    /// dedup window, or the one delivery it duplicated is still being retried.
    DuplicatesOnly,
    /// Nothing recorded anywhere.
    NotSeen,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Handled => "handled",
            Outcome::Stale => "stale",
            Outcome::Queued => "queued",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Redriven => "redriven",
            Outcome::Discarded => "discarded",
            Outcome::DuplicatesOnly => "duplicates_only",
            Outcome::NotSeen => "not_seen",
        }
    }
}

/// Everything recorded of one event.
#[derive(Debug, Clone)]
pub struct EventReport {
    pub source: String,
    pub event_id: String,
    pub processed: Option<ProcessedRecord>,
    pub duplicates: DuplicateDeliveries,
    pub stale: Vec<StaleRecord>,
    pub dead_letters: Vec<DeadLetterRecord>,
    pub redrives: Vec<RedriveRecord>,
    pub outbox: Vec<OutboxRecord>,
    /// Its delivery attempts and the operator's acts on its deliveries, in the order recorded
    /// (they outlive the outbox rows).
    pub attempts: Vec<AttemptRecord>,
    /// `None`: not looked up (the transport is not the database queue).
    pub queued: Option<Vec<QueuedRecord>>,
    /// The most entries of each list (and duplicates counted).
    pub limit: i64,
}

/// Reads everything the store recorded of `(source, event_id)`.
pub async fn event_report(
    store: &Store,
    source: &str,
    event_id: &str,
    options: &ShowOptions,
) -> Result<EventReport, ShowError> {
    let limit = options.limit;
    let read = |what: &'static str| move |source: StoreError| ShowError { what, source };
    let within = options.statement_timeout;
    let processed = bounded(within, store.dedup().processed_record(source, event_id))
        .await
        .map_err(read("the dedup record"))?;
    let duplicates = bounded(within, store.dedup().duplicates_of(source, event_id, limit))
        .await
        .map_err(read("the duplicate deliveries"))?;
    let stale = bounded(
        within,
        store.reads().stale_records_of(source, event_id, limit),
    )
    .await
    .map_err(read("the stale guard's records"))?;
    let dead_letters = bounded(
        within,
        store.reads().dead_letters_of(source, event_id, limit),
    )
    .await
    .map_err(read("the dead letters"))?;
    let redrives = bounded(within, store.reads().redrives_of(source, event_id, limit))
        .await
        .map_err(read("the redrives"))?;
    let outbox = match processed {
        // Outbox rows are written with the processed id, and found by its time.
        Some(_) => bounded(within, store.reads().outbox_of(source, event_id, limit))
            .await
            .map_err(read("the outbox rows"))?,
        None => Vec::new(),
    };
    let attempts = match &processed {
        // Attempts are recorded after the event was processed: older partitions are skipped.
        Some(p) => bounded(
            within,
            store
                .reads()
                .attempts_of(source, event_id, p.processed_at, limit),
        )
        .await
        .map_err(read("the delivery attempts"))?,
        None => Vec::new(),
    };
    let queued = if options.database_queue {
        let lookup = store
            .reads()
            .queued_of(source, event_id, &options.default_source, limit);
        Some(
            bounded(within, lookup)
                .await
                .map_err(read("the database queue"))?,
        )
    } else {
        None
    };
    Ok(EventReport {
        source: source.to_owned(),
        event_id: event_id.to_owned(),
        processed,
        duplicates,
        stale,
        dead_letters,
        redrives,
        outbox,
        attempts,
        queued,
        limit,
    })
}

impl EventReport {
    pub fn outcome(&self) -> Outcome {
        let queued = self.queued.as_ref().is_some_and(|q| !q.is_empty());
        match &self.processed {
            Some(_) if !self.stale.is_empty() => Outcome::Stale,
            Some(_) => Outcome::Handled,
            None if queued => Outcome::Queued,
            None if !self.dead_letters.is_empty() => Outcome::DeadLettered,
            // The latest record tells: redriven after an earlier discard is on its way again.
            None => match self.redrives.last() {
                Some(r) if r.discarded() => Outcome::Discarded,
                Some(_) => Outcome::Redriven,
                None if self.duplicates.count > 0 => Outcome::DuplicatesOnly,
                None if !self.stale.is_empty() => Outcome::Stale,
                None => Outcome::NotSeen,
            },
        }
    }

    /// The story the console and `events show` tell of it.
    pub fn story(&self) -> Story {
        match self.outcome() {
            Outcome::Handled => {
                Story::of_deliveries(&Story::delivery_state(&self.outbox, &self.attempts))
            }
            outcome => Story::of_outcome(outcome),
        }
    }

    /// Whether anything of the event is recorded.
    pub fn found(&self) -> bool {
        self.outcome() != Outcome::NotSeen
    }

    /// The event's type, from whichever record knows it.
    pub fn event_type(&self) -> Option<&str> {
        let types = self.processed.iter().map(|p| p.event_type.as_str());
        let types = types
            .chain(self.dead_letters.iter().map(|d| d.event_type.as_str()))
            .chain(self.redrives.iter().map(|r| r.event_type.as_str()))
            .chain(self.outbox.iter().map(|o| o.event_type.as_str()))
            .chain(self.stale.iter().map(|s| s.event_type.as_str()));
        types.into_iter().find(|t| !t.is_empty())
    }

    /// The report as one JSON object (the book's "What happened to an event?",
    /// docs/src/operations/events-show.md, lists the fields). Times are RFC 3339 in UTC with
    /// milliseconds.
    pub fn to_json(&self) -> Value {
        let processed = self.processed.as_ref().map(|p| {
            json!({
                "at": time(p.processed_at), "received_at": p.received_at.map(time),
                "delivery_attempt": p.delivery_attempt,
            })
        });
        let stale: Vec<Value> = self
            .stale
            .iter()
            .map(|s| {
                json!({
                    "at": time(s.recorded_at), "object_id": s.object_id, "version": s.version,
                    "newer_event_id": s.newer_event_id, "newer_version": s.newer_version,
                })
            })
            .collect();
        let dead_letters: Vec<Value> = self
            .dead_letters
            .iter()
            .map(|d| {
                json!({
                    "id": d.id, "at": time(d.created_at), "queue": d.queue, "attempts": d.attempts,
                    "error": d.error,
                })
            })
            .collect();
        let redrives: Vec<Value> = self.redrives.iter().map(|r| json!({
            "dead_letter_id": r.dead_letter_id, "dead_lettered_at": time(r.dead_lettered_at),
            "queue": r.queue, "attempts": r.attempts, "error": r.error,
            "redriven_at": time(r.redriven_at), "redriven_to": r.redriven_to,
            "outcome": r.outcome, "actor": r.actor,
        })).collect();
        let outbox: Vec<Value> = self
            .outbox
            .iter()
            .map(|o| {
                json!({
                    "id": o.id, "destination": o.destination.as_deref().map(shown_destination),
                    "status": o.status, "attempts": o.attempts, "last_error": o.last_error,
                    "created_at": time(o.created_at), "next_attempt_at": time(o.next_attempt_at),
                    "dispatched_at": o.dispatched_at.map(time),
                })
            })
            .collect();
        let queued: Option<Vec<Value>> = self.queued.as_ref().map(|q| {
            q.iter()
                .map(|m| {
                    json!({
                        "id": m.id, "queue": m.queue, "attempts": m.attempts,
                        "enqueued_at": time(m.enqueued_at), "visible_at": time(m.visible_at),
                    })
                })
                .collect()
        });
        json!({
            "source": self.source, "event_id": self.event_id,
            "outcome": self.outcome().as_str(), "story": self.story().name(),
            "found": self.found(),
            "event_type": self.event_type(),
            "processed": processed,
            "duplicates": {
                "count": self.duplicates.count,
                "first_at": self.duplicates.first_at.map(time),
                "last_at": self.duplicates.last_at.map(time),
            },
            "stale": stale, "dead_letters": dead_letters, "redrives": redrives,
            "outbox": outbox, "queued": queued, "limit": self.limit,
            "attempts": attempts::to_json(&self.attempts),
        })
    }

    /// The report for people; see `text.rs`.
    pub fn to_text(&self) -> String {
        text::render(self)
    }
}

/// Unix milliseconds as RFC 3339 in UTC (`2026-12-02T10:00:00.123Z`); the number itself if it
/// is no time chrono can show.
pub fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_tokens_in_a_destination_url_are_hidden() {
        assert_eq!(
            shown_destination("amqp://user:secret@broker:5672/%2f?exchange=x"),
            "amqp://user:***@broker:5672/%2f (exchange x)"
        );
        assert_eq!(
            shown_destination("https://hooks.slack.com/services/T0/B0/S3CRET"),
            "https://hooks.slack.com/services/…"
        );
        assert_eq!(
            shown_destination("https://hooks.example/a@b"),
            "https://hooks.example/a@b"
        );
        assert_eq!(shown_destination("file:/tmp/x"), "file:/tmp/x");
        assert_eq!(
            shown_destination("gopher://h/x/S3CRET"),
            "gopher://h/x/…",
            "one that does not parse"
        );
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(time(1_796_119_200_123), "2026-12-01T10:00:00.123Z");
    }
}
