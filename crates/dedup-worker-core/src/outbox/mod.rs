//! The transactional outbox: rows written in the handler's transaction, delivered after commit.
//!
//! * [`OutboxMessage`]: what a handler returns. The consumer writes one row per message
//!   ([`crate::store::StoreTx::insert_outbox`]) in the batch transaction, never committing on
//!   its own; so a message exists if and only if the event it came from was handled.
//! * [`relay`]: claims due rows (`FOR UPDATE SKIP LOCKED` on PostgreSQL, never by id order,
//!   since transactions commit out of order), delivers them through a [`sink::Sink`], marks them
//!   dispatched, or backs off per row and marks them failed after the limit. Several relays
//!   may run at once; a row whose relay died is claimed again after its lease, with the same
//!   idempotency key. Marks apply only under the claim that leased the row, so a relay that was
//!   merely slow (a hanging sink, a paused process) and lost its lease to another cannot mark the
//!   row dispatched, failed or due again under it: its step reports `lease_lost`, logs "lease
//!   lost; another relay owns the row" and counts `dedup_outbox_lease_lost_total`.
//! * [`sink`]: where rows go (log, JSON-lines file, HTTP POST with `Idempotency-Key`).

mod message;
pub mod pace;
mod plan;
pub mod relay;
pub mod routes;
pub mod sink;

pub use message::OutboxMessage;
pub use plan::OutboxPlan;
