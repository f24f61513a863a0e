//! What the operator reads across the tables, each read one bounded statement: [`Reads`],
//! reached as `store.reads()`. One file a question:
//! * `list/`: events by outcome, type and time, in keyset pages (`/events`, `events list`;
//!   `query.rs`: the SQL builder its queries and the bodies' search share);
//! * `bodies.rs`: events by what their kept body is about (customer, object, id prefix);
//! * `trail.rs`: one event's trail (`events show`): its dead letters, their redrives, the
//!   stale guard's records, its outbox rows, its messages still queued (its dedup record and
//!   duplicates are the ring's own: `store.dedup()`);
//! * `activity.rs`: what happened per minute lately (the console's front page);
//! * `alerts.rs`: the rows an operator is paged for (the gauges of `/metrics`);
//! * `attempts.rs`: one event's delivery attempts and operator acts (its timeline);
//! * `delivery_state.rs`: where the deliveries of a page of handled events stand (their story).
//!
//! Each statement is written once where both stores take it, or its two forms side by side in
//! one `match` where they keep times differently.

mod activity;
mod alerts;
mod attempts;
mod bodies;
mod delivery_state;
mod list;
mod trail;

use super::Pool;

pub use activity::MinuteCount;
pub use alerts::AlertCounts;
pub use attempts::AttemptRecord;
pub use bodies::{BodyPage, BodyPosition, BodySearch, FoundBody};
pub use delivery_state::{DeliveryState, HandledEvent};
pub use list::{ListFilter, ListPosition, ListedKind, ListedRow, Tie};

/// The operator's reads across the tables (see the module): the console's pages, `events
/// show` and `events list`, the gauges. They change nothing.
#[derive(Debug, Clone, Copy)]
pub struct Reads<'a> {
    pub(super) pool: &'a Pool,
}
