//! What dedup-worker's two products do against their database, in one place so that neither
//! imports the other: the pipeline (crate `dedup-worker`) and the Idempotency-Key layer (crate
//! `idempotency-key`) both write in groups, back off, and keep their PostgreSQL tables in one
//! schema with one migration history.
//!
//! * [`backoff`]: the jittered exponential delay every retrying loop waits, and durations as
//!   the milliseconds SQL binds.
//! * [`group_commit`]: what every group-commit writer does around its statement: bound it in
//!   time, and stop trying while the database cannot be reached (a breaker).
//! * [`schema`]: the PostgreSQL schema `dedup_worker`, where both products' tables and their
//!   shared sqlx history live; each product applies its own migrations there
//!   ([`schema::migrate`]), under one lock, after moving an earlier version's layout out of
//!   `public`.
//!
//! It knows `sqlx`'s error kinds and nothing of queues, events or keys.

pub mod backoff;
pub mod group_commit;
pub mod schema;
