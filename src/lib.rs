//! dedup-worker: turn at-least-once deliveries into effects that happen once.
//!
//! A webhook ingress that verifies each sender's signature and enqueues durably before it
//! answers, a consumer that deduplicates on the event's key and runs your handler and its outbox
//! rows in one transaction, and a relay that delivers those rows to their sinks. The binary runs
//! it with a handler that forwards each event; a service of your own runs the same command line
//! with its handler (the book's "Your own handler").
//!
//! # What is public
//!
//! This crate is the promised surface, and all of it:
//!
//! * the [`prelude`]: the [`Service`] builder, the handler's trait and error, the event, the
//!   transaction, outbox messages, migrations;
//! * the macros [`execute!`] and [`with_connection!`] for SQL in a handler, on either store;
//! * with the `testing` feature, `testing`: the kit for a handler crate's own tests (a database
//!   per test, the handler in one transaction, the application on port 0, signed events);
//! * the versions of [`sqlx`] and [`async_trait`](macro@async_trait) a handler's code must match.
//!
//! Its shape is recorded in `docs/public-api/dedup-worker.txt` (`scripts/public_api.sh` writes it
//! again, and with `--check` compares). Everything runs in the engine, the internal crate
//! `dedup-worker-core` (crates/dedup-worker-core), which this repository's binary, tests and
//! benches reach into and which promises nothing; the book's "Layout" is its map.

#[doc(inline)]
pub use dedup_worker_core::prelude;
pub use dedup_worker_core::startup::Service;
pub use dedup_worker_core::{execute, with_connection};

/// The test kit for a handler crate's own tests (feature `testing`).
#[cfg(feature = "testing")]
#[doc(inline)]
pub use dedup_worker_core::testing;

/// The versions a handler crate's own code must match: `sqlx` for `DbTx`'s connections and
/// `async_trait` for [`Handler`](prelude::Handler). (`sqlx::migrate!` expands to `::sqlx::…`
/// paths, so a crate with migrations of its own also depends on `sqlx = "0.8"` directly.)
pub use async_trait::async_trait;
pub use sqlx;
