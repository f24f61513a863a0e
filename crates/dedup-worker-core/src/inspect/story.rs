//! One vocabulary for what became of an event: [`Story`], with one label and one CSS class
//! each, used by the console's list and event page and by `events show` / `events list`.
//! Before it the list said `dead_letter` and the page `dead_lettered` for the same thing.
//!
//! The machine names scripts read stay what they were: `events show --json`'s `"outcome"`
//! ([`super::Outcome::as_str`]) and `events list --json`'s (`kind_name`); both add `"story"`.
//!
//! A handled event's story looks at its deliveries ([`Story::of_deliveries`]): "handled" alone
//! said nothing of a webhook its receiver never took, and the person on call read it as done.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{ListError, Outcome};
use crate::store::{
    bounded, AttemptRecord, DeliveryState, HandledEvent, ListedKind, ListedRow, OutboxRecord, Store,
};

/// What became of an event (the page), or of one delivery of it (a row of the list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Story {
    /// Processed, and every delivery it made was dispatched (or, its rows purged since, the
    /// last attempt of each was delivered).
    Delivered,
    /// Processed; a delivery is pending, not failed yet.
    Delivering,
    /// Processed; a delivery is pending after a failed attempt (it will be tried again).
    DeliveryFailing,
    /// Processed; a delivery failed for good (and no operator skipped it).
    DeliveryFailed,
    /// Processed, with nothing to deliver: no outbox row and no attempt on record.
    Handled,
    /// Processed, held back by the stale-event guard.
    Stale,
    /// Waiting in the database queue.
    Queued,
    /// Dead-lettered, not processed.
    DeadLetter,
    /// A dead letter of an event processed since (a later delivery or a redrive handled it).
    DeadLetterSuperseded,
    /// Redriven to a queue the store cannot see into, not processed yet.
    Redriven,
    /// Dead-lettered, then discarded by an operator.
    Discarded,
    /// A delivery recognised as a duplicate (a row of the list).
    Duplicate,
    /// Only duplicate deliveries are recorded (the page).
    DuplicateOnly,
    /// Nothing recorded.
    NotSeen,
}

impl Story {
    /// Every story, for the stylesheet and the tests.
    pub const ALL: [Story; 14] = [
        Story::Delivered,
        Story::Delivering,
        Story::DeliveryFailing,
        Story::DeliveryFailed,
        Story::Handled,
        Story::Stale,
        Story::Queued,
        Story::DeadLetter,
        Story::DeadLetterSuperseded,
        Story::Redriven,
        Story::Discarded,
        Story::Duplicate,
        Story::DuplicateOnly,
        Story::NotSeen,
    ];

    /// Its name, in CSS classes (`s-NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Story::Delivered => "delivered",
            Story::Delivering => "delivering",
            Story::DeliveryFailing => "delivery_failing",
            Story::DeliveryFailed => "delivery_failed",
            Story::Handled => "handled",
            Story::Stale => "stale",
            Story::Queued => "queued",
            Story::DeadLetter => "dead_letter",
            Story::DeadLetterSuperseded => "dead_letter_superseded",
            Story::Redriven => "redriven",
            Story::Discarded => "discarded",
            Story::Duplicate => "duplicate",
            Story::DuplicateOnly => "duplicate_only",
            Story::NotSeen => "not_seen",
        }
    }

    /// What a person reads.
    pub fn label(self) -> &'static str {
        match self {
            Story::Delivered => "handled and delivered",
            Story::Delivering => "handled, delivering",
            Story::DeliveryFailing => "handled, delivery failing",
            Story::DeliveryFailed => "handled, delivery failed",
            Story::Handled => "handled (nothing to deliver)",
            Story::Stale => "held back as stale",
            Story::Queued => "waiting in the queue",
            Story::DeadLetter => "dead letter",
            Story::DeadLetterSuperseded => "dead letter, handled since",
            Story::Redriven => "redriven",
            Story::Discarded => "dead letter, discarded",
            Story::Duplicate => "duplicate delivery",
            Story::DuplicateOnly => "duplicate only",
            Story::NotSeen => "not seen",
        }
    }

    /// The CSS class its label is shown with; the colours are in the console's stylesheet.
    pub fn class(self) -> String {
        format!("s-{}", self.name())
    }

    /// A handled event's story, from where its deliveries stand: a failure for good outweighs
    /// a failing retry, which outweighs a delivery still on its way; with no row left, the
    /// last relay attempt of each delivery it had tells.
    pub fn of_deliveries(state: &DeliveryState) -> Self {
        if state.failed > 0 {
            Story::DeliveryFailed
        } else if state.failing > 0 {
            Story::DeliveryFailing
        } else if state.pending > 0 {
            Story::Delivering
        } else if state.rows > 0 {
            Story::Delivered
        } else if state.latest_attempts.is_empty() {
            Story::Handled
        } else if state.latest_attempts.iter().any(|k| k == "gave_up") {
            Story::DeliveryFailed
        } else if state.latest_attempts.iter().all(|k| k == "delivered") {
            Story::Delivered
        } else {
            Story::DeliveryFailing
        }
    }

    /// What an event page's outbox rows and attempts say, in the list's terms.
    pub fn delivery_state(outbox: &[OutboxRecord], attempts: &[AttemptRecord]) -> DeliveryState {
        let count =
            |f: &dyn Fn(&OutboxRecord) -> bool| outbox.iter().filter(|o| f(o)).count() as i64;
        let mut latest: Vec<(i64, &str)> = Vec::new();
        if outbox.is_empty() {
            // In the order recorded: a later attempt of an outbox id replaces the earlier.
            for a in attempts
                .iter()
                .filter(|a| !matches!(a.kind.as_str(), "retry" | "resend" | "skip"))
            {
                match latest.iter_mut().find(|(id, _)| *id == a.outbox_id) {
                    Some(entry) => entry.1 = &a.kind,
                    None => latest.push((a.outbox_id, &a.kind)),
                }
            }
        }
        DeliveryState {
            rows: outbox.len() as i64,
            failed: count(&|o| o.status == "failed" && !o.skipped),
            failing: count(&|o| o.status == "pending" && o.last_error.is_some()),
            pending: count(&|o| o.status == "pending"),
            latest_attempts: latest
                .into_iter()
                .map(|(_, kind)| kind.to_owned())
                .collect(),
        }
    }

    /// The story of an event's report (a handled one's without its deliveries: see
    /// [`Story::of_deliveries`]).
    pub fn of_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Handled => Story::Handled,
            Outcome::Stale => Story::Stale,
            Outcome::Queued => Story::Queued,
            Outcome::DeadLettered => Story::DeadLetter,
            Outcome::Redriven => Story::Redriven,
            Outcome::Discarded => Story::Discarded,
            Outcome::DuplicatesOnly => Story::DuplicateOnly,
            Outcome::NotSeen => Story::NotSeen,
        }
    }

    /// The story of a listed row.
    pub fn of_listed(kind: ListedKind) -> Self {
        match kind {
            ListedKind::Handled => Story::Handled,
            ListedKind::Duplicate => Story::Duplicate,
            ListedKind::DeadLetter => Story::DeadLetter,
            ListedKind::Stale => Story::Stale,
            ListedKind::Pending => Story::Queued,
        }
    }
}

/// The stories of a page of listed rows, in their order: a handled row's from its deliveries
/// (one or two statements for the page: `store/reads/delivery_state.rs`), a dead letter's from
/// whether its event was processed since (one statement per source on the page).
pub(super) async fn stories_of_rows(
    store: &Store,
    rows: &[ListedRow],
    within: Duration,
) -> Result<Vec<Story>, ListError> {
    let mut stories: Vec<Story> = rows.iter().map(|row| Story::of_listed(row.kind)).collect();
    let handled: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].kind == ListedKind::Handled)
        .collect();
    let events: Vec<HandledEvent> = handled
        .iter()
        .map(|&i| HandledEvent {
            source: rows[i].source.clone(),
            event_id: rows[i].event_id.clone(),
            processed_us: rows[i].position.at_us,
        })
        .collect();
    let states = bounded(within, store.reads().delivery_states(&events))
        .await
        .map_err(|source| ListError::Store {
            kind: ListedKind::Handled,
            source,
        })?;
    for (&i, state) in handled.iter().zip(&states) {
        stories[i] = Story::of_deliveries(state);
    }
    // Dead letters with an id, by source: which of their events were processed since.
    let mut dead: BTreeMap<&str, Vec<(usize, String)>> = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        if row.kind == ListedKind::DeadLetter && !row.event_id.is_empty() {
            dead.entry(row.source.as_str())
                .or_default()
                .push((i, row.event_id.clone()));
        }
    }
    for (source, letters) in dead {
        let ids: Vec<String> = letters.iter().map(|(_, id)| id.clone()).collect();
        let processed = bounded(within, store.dedup().processed_among(source, &ids))
            .await
            .map_err(|source| ListError::Store {
                kind: ListedKind::DeadLetter,
                source,
            })?;
        for (i, id) in &letters {
            if processed.contains(id) {
                stories[*i] = Story::DeadLetterSuperseded;
            }
        }
    }
    Ok(stories)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_story_has_its_own_name_and_label() {
        for (i, a) in Story::ALL.iter().enumerate() {
            for b in &Story::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.label(), b.label());
            }
            assert_eq!(a.class(), format!("s-{}", a.name()));
        }
    }

    #[test]
    fn the_list_and_the_page_tell_the_same_story_of_the_same_state() {
        let pairs = [
            (ListedKind::Handled, Outcome::Handled),
            (ListedKind::DeadLetter, Outcome::DeadLettered),
            (ListedKind::Stale, Outcome::Stale),
            (ListedKind::Pending, Outcome::Queued),
        ];
        for (kind, outcome) in pairs {
            assert_eq!(Story::of_listed(kind), Story::of_outcome(outcome));
        }
    }

    fn state(rows: i64, failed: i64, failing: i64, pending: i64, latest: &[&str]) -> DeliveryState {
        DeliveryState {
            rows,
            failed,
            failing,
            pending,
            latest_attempts: latest.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn a_handled_events_story_is_where_its_deliveries_stand() {
        let table = [
            // Every row dispatched.
            (state(2, 0, 0, 0, &[]), Story::Delivered),
            // A row on its way, none failed yet.
            (state(2, 0, 0, 1, &[]), Story::Delivering),
            // A row to be tried again after a failure outweighs one on its way.
            (state(3, 0, 1, 2, &[]), Story::DeliveryFailing),
            // A failure for good outweighs everything.
            (state(3, 1, 1, 2, &[]), Story::DeliveryFailed),
            // No row and no attempt: nothing to deliver.
            (state(0, 0, 0, 0, &[]), Story::Handled),
            // Rows purged since: the last attempt of each tells.
            (
                state(0, 0, 0, 0, &["delivered", "delivered"]),
                Story::Delivered,
            ),
            (
                state(0, 0, 0, 0, &["delivered", "gave_up"]),
                Story::DeliveryFailed,
            ),
            (
                state(0, 0, 0, 0, &["delivered", "failed"]),
                Story::DeliveryFailing,
            ),
        ];
        for (state, story) in table {
            assert_eq!(Story::of_deliveries(&state), story, "{state:?}");
        }
    }

    fn outbox_row(id: i64, status: &str, error: bool, skipped: bool) -> OutboxRecord {
        OutboxRecord {
            id,
            destination: None,
            event_type: "invoice.paid".into(),
            status: status.into(),
            attempts: 1,
            last_error: error.then(|| "503".to_owned()),
            created_at: 0,
            next_attempt_at: 0,
            dispatched_at: None,
            skipped,
        }
    }

    fn attempt(outbox_id: i64, kind: &str) -> AttemptRecord {
        AttemptRecord {
            at: 0,
            outbox_id,
            attempt: 1,
            kind: kind.into(),
            lane: "default".into(),
            destination: None,
            started_at: None,
            duration_ms: None,
            status: None,
            error: None,
            response_headers: None,
            response_body: None,
            body_truncated: false,
            actor: None,
        }
    }

    #[test]
    fn the_event_page_counts_its_rows_as_the_list_does() {
        let rows = [
            outbox_row(1, "dispatched", false, false),
            outbox_row(2, "failed", true, true),
            outbox_row(3, "pending", true, false),
            outbox_row(4, "pending", false, false),
        ];
        assert_eq!(Story::delivery_state(&rows, &[]), state(4, 0, 1, 2, &[]));
        let failed = [outbox_row(1, "failed", true, false)];
        assert_eq!(
            Story::of_deliveries(&Story::delivery_state(&failed, &[])),
            Story::DeliveryFailed
        );
        // The rows gone: the latest relay attempt of each id, operator acts passed over.
        let attempts = [
            attempt(7, "failed"),
            attempt(8, "gave_up"),
            attempt(7, "delivered"),
            attempt(8, "retry"),
            attempt(8, "delivered"),
            attempt(8, "resend"),
        ];
        let gone = Story::delivery_state(&[], &attempts);
        assert_eq!(gone, state(0, 0, 0, 0, &["delivered", "delivered"]));
        assert_eq!(Story::of_deliveries(&gone), Story::Delivered);
        // Rows still there: the attempts are not read.
        assert_eq!(
            Story::delivery_state(&[outbox_row(7, "dispatched", false, false)], &attempts),
            state(1, 0, 0, 0, &[])
        );
    }

    #[test]
    fn every_story_of_the_plans_table_has_its_label() {
        let table = [
            (Story::Delivered, "delivered", "handled and delivered"),
            (Story::Delivering, "delivering", "handled, delivering"),
            (
                Story::DeliveryFailing,
                "delivery_failing",
                "handled, delivery failing",
            ),
            (
                Story::DeliveryFailed,
                "delivery_failed",
                "handled, delivery failed",
            ),
            (Story::Handled, "handled", "handled (nothing to deliver)"),
            (Story::Stale, "stale", "held back as stale"),
            (Story::Queued, "queued", "waiting in the queue"),
            (Story::DeadLetter, "dead_letter", "dead letter"),
            (
                Story::DeadLetterSuperseded,
                "dead_letter_superseded",
                "dead letter, handled since",
            ),
            (Story::Redriven, "redriven", "redriven"),
            (Story::Discarded, "discarded", "dead letter, discarded"),
            (Story::Duplicate, "duplicate", "duplicate delivery"),
            (Story::DuplicateOnly, "duplicate_only", "duplicate only"),
            (Story::NotSeen, "not_seen", "not seen"),
        ];
        assert_eq!(table.len(), Story::ALL.len());
        for (story, name, label) in table {
            assert_eq!((story.name(), story.label()), (name, label));
            assert!(Story::ALL.contains(&story));
        }
    }
}
