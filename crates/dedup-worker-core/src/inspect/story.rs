//! One vocabulary for what became of an event: [`Story`], with one label and one CSS class
//! each, used by the console's list and event page and by `events show` / `events list`.
//! Before it the list said `dead_letter` and the page `dead_lettered` for the same thing.
//!
//! The machine names scripts read stay what they were: `events show --json`'s `"outcome"`
//! ([`super::Outcome::as_str`]) and `events list --json`'s (`kind_name`). The stories that look
//! at the outbox (delivered, delivering, delivery failed) come with the record of delivery
//! attempts; until then a handled event's story is "handled".

use super::Outcome;
use crate::store::ListedKind;

/// What became of an event (the page), or of one delivery of it (a row of the list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Story {
    /// Processed: its handler ran and committed.
    Handled,
    /// Processed, held back by the stale-event guard.
    Stale,
    /// Waiting in the database queue.
    Queued,
    /// Dead-lettered, not processed.
    DeadLetter,
    /// Redriven to a queue the store cannot see into, not processed yet.
    Redriven,
    /// A delivery recognised as a duplicate (a row of the list).
    Duplicate,
    /// Only duplicate deliveries are recorded (the page).
    DuplicateOnly,
    /// Nothing recorded.
    NotSeen,
}

impl Story {
    /// Every story, for the stylesheet and the tests.
    pub const ALL: [Story; 8] = [
        Story::Handled,
        Story::Stale,
        Story::Queued,
        Story::DeadLetter,
        Story::Redriven,
        Story::Duplicate,
        Story::DuplicateOnly,
        Story::NotSeen,
    ];

    /// Its name, in CSS classes (`s-NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Story::Handled => "handled",
            Story::Stale => "stale",
            Story::Queued => "queued",
            Story::DeadLetter => "dead_letter",
            Story::Redriven => "redriven",
            Story::Duplicate => "duplicate",
            Story::DuplicateOnly => "duplicate_only",
            Story::NotSeen => "not_seen",
        }
    }

    /// What a person reads.
    pub fn label(self) -> &'static str {
        match self {
            Story::Handled => "handled",
            Story::Stale => "held back as stale",
            Story::Queued => "waiting in the queue",
            Story::DeadLetter => "dead letter",
            Story::Redriven => "redriven",
            Story::Duplicate => "duplicate delivery",
            Story::DuplicateOnly => "duplicate only",
            Story::NotSeen => "not seen",
        }
    }

    /// The CSS class its label is shown with; the colours are in the console's stylesheet.
    pub fn class(self) -> String {
        format!("s-{}", self.name())
    }

    /// The story of an event's report.
    pub fn of_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Handled => Story::Handled,
            Outcome::Stale => Story::Stale,
            Outcome::Queued => Story::Queued,
            Outcome::DeadLettered => Story::DeadLetter,
            Outcome::Redriven => Story::Redriven,
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
}
