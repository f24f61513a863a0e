//! The operator's bulk actions, by filter: redrive or discard dead letters, retry failed outbox
//! deliveries, re-send dispatched ones. Each has a count (the dry run) and the action, and each action is
//! recorded in `admin_actions` (who, when, what filter, how many). The CLI (`dlq redrive`,
//! `outbox retry`, `outbox resend`) and the console run the same functions.
//!
//! A count and its action select rows with the same statement's WHERE clause
//! ([`crate::store::BulkRows`]), so a dry run says what the action would take at that moment.
//! Actions move rows in bounded chunks and take nothing newer than the newest row that existed
//! when they began. An action that fails part-way still records what it did before failing.
//!
//! Rows a relay holds are never touched: a relay claims only `pending` rows, and a retry or a
//! re-send takes only `failed` or `dispatched` ones, putting them back to `pending` under no
//! claim (a relay still holding the claim that delivered a row before can no longer mark it).

mod dead_letters;
mod deliveries;
mod sinks;

pub use crate::store::{AdminAction, DeadLetterListing, DeliveryListing, RowFilter};
pub use dead_letters::{
    count_dead_letters, discard_dead_letters, list_dead_letters, redrive_dead_letters,
    redrive_dead_letters_recorded, DiscardError,
};
pub use deliveries::{
    count_dispatched_deliveries, count_failed_deliveries, list_failed_deliveries,
    resend_dispatched_deliveries, resend_dispatched_deliveries_recorded, retry_failed_deliveries,
    retry_failed_deliveries_recorded,
};
pub use sinks::{
    held_keys, known_lanes, lane_states, pause_sink, resume_sink, skip_delivery, SinkActionError,
};

use crate::store::{Store, StoreError};

/// Who acted, as recorded: "console" with a label, or "cli" with $USER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);

impl Actor {
    /// The command line, with the login name when `$USER` says one: `cli (alice)`.
    pub fn cli() -> Self {
        Self::labelled("cli", std::env::var("USER").ok().as_deref())
    }

    /// The console, with the label of whoever signed in (empty: none): `console (ops)`.
    pub fn console(label: &str) -> Self {
        Self::labelled("console", Some(label))
    }

    fn labelled(kind: &str, label: Option<&str>) -> Self {
        match label.map(str::trim).filter(|l| !l.is_empty()) {
            Some(label) => Actor(format!("{kind} ({label})")),
            None => Actor(kind.to_owned()),
        }
    }
}

/// The actions recorded in `admin_actions`, by their recorded names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    DlqRedrive,
    DlqDiscard,
    OutboxRetry,
    OutboxResend,
    SinkPause,
    SinkResume,
    OutboxSkip,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::DlqRedrive => "dlq_redrive",
            Action::DlqDiscard => "dlq_discard",
            Action::OutboxRetry => "outbox_retry",
            Action::OutboxResend => "outbox_resend",
            Action::SinkPause => "sink_pause",
            Action::SinkResume => "sink_resume",
            Action::OutboxSkip => "outbox_skip",
        }
    }
}

/// The action recorded as `id`.
pub async fn recorded_action(store: &Store, id: i64) -> Result<Option<AdminAction>, StoreError> {
    store.admin_actions().get(id).await
}

/// The newest `limit` recorded actions, newest first.
pub async fn recent_actions(store: &Store, limit: i64) -> Result<Vec<AdminAction>, StoreError> {
    store.admin_actions().newest(limit).await
}

/// What an action did: how many rows, and the id it is recorded under (the console's "done"
/// banner reads it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Rows acted on.
    pub count: u64,
    /// Its `admin_actions` id.
    pub action_id: i64,
}

/// Records that `actor` took `action` on `count` rows selected by `filter`; returns the
/// record's id.
async fn record(
    store: &Store,
    actor: &Actor,
    action: Action,
    filter: &RowFilter,
    count: u64,
) -> Result<i64, StoreError> {
    // A filter is plain data: serializing it cannot fail.
    let filter = serde_json::to_string(filter).unwrap_or_else(|_| "{}".into());
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    store
        .admin_actions()
        .record(&actor.0, action.name(), &filter, count)
        .await
}

#[cfg(test)]
mod tests {
    use super::Actor;

    #[test]
    fn an_actor_names_its_kind_and_its_label() {
        assert_eq!(Actor::labelled("cli", Some("alice")).0, "cli (alice)");
        assert_eq!(Actor::labelled("cli", None).0, "cli");
        assert_eq!(Actor::console(" ").0, "console");
        assert_eq!(Actor::console("ops").0, "console (ops)");
    }
}
