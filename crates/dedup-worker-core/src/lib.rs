//! dedup-worker's engine: turn at-least-once deliveries into effects that happen once.
//!
//! **Internal.** This crate is what the `dedup-worker` crate, its binary, its integration tests
//! and its benches are built on; a service of your own depends on `dedup-worker`, whose
//! surface (the prelude, `Service`, the SQL macros and the test kit) is the promised one.
//! Everything here may change in any release.
//!
//! The data flows through the modules in this order:
//!
//! * `webhook`: the HTTP ingress. Verifies `Stripe-Signature` (`webhook::stripe`) or
//!   Standard Webhooks (`webhook::standard`) on the raw body, publishes the event durably
//!   through the transport and only then answers 2xx.
//! * `queue`: the transport seam (`queue::Transport`) and its implementations: the embedded
//!   database queue (group commit for ingress), RabbitMQ and SQS.
//! * `consumer`: receives batches, deduplicates on `(source, event id)` with
//!   `INSERT … ON CONFLICT DO NOTHING`, runs the `consumer::Handler` in the same
//!   transaction, writes outbox rows, commits, and only then acks.
//! * `outbox`: what handlers return (`outbox::OutboxMessage`), the relay that claims and
//!   delivers the rows, and the sinks (log, file, HTTP, AMQP, SQS).
//! * `store`: PostgreSQL (production) and SQLite (embedded default) behind one
//!   type; every SQL statement of the pipeline lives here.
//! * `stripe`: what the pipeline knows of Stripe: the shapes a change arrives in (snapshot
//!   event, thin event, EventBridge envelope) and the dedup key of each, and its API (the
//!   backfill's event list, a thin event's full event).
//! * `signature`: every signature, verified and made: `Stripe-Signature` (checked by the
//!   ingress on each delivery, and again by the consumer on the copy the ingress carried,
//!   before it trusts an event's `created`), Standard Webhooks `v1` (HMAC) and `v1a` (ed25519),
//!   and the keys the configuration parses once and the HTTP sink signs with.
//! * `dlq`: `dlq redrive`, which publishes dead letters again through the configured
//!   transport; `backfill`: events Stripe no longer retries, listed from its API and
//!   published the same way, so dedup absorbs those received before.
//! * `retention`: deletes processed ids past the dedup window and dispatched outbox rows.
//! * `gauges`: samples the queue's backlog, dead letters and failed outbox rows in the
//!   background, for the gauges `/metrics` shows.
//! * `inspect`: `events show`, what happened to one event, from everything the store
//!   recorded of it, and `events list`, events by type, time and outcome.
//! * `operator`: the bulk actions an operator takes by filter (redrive dead letters, retry
//!   failed deliveries, re-send dispatched ones), each with a dry-run count and recorded.
//! * `console`: the operator console, HTML pages on the admin listener (`admin.listen`),
//!   behind a token, over `inspect` and `operator`.
//!
//! Beside it, in crates of their own: `idempotency-key` (crates/idempotency-key), a tower layer
//! giving synchronous APIs Stripe-style `Idempotency-Key` semantics, which a service can use
//! without this pipeline; and `dedup-db` (crates/dedup-db), what both do against their database
//! (group commit with a breaker, backoff, the PostgreSQL schema `dedup_worker` they share).
//!
//! Around them: `config` (one typed settings struct, parsed and validated once; the ground
//! floor, importing nothing of the pipeline but the signature keys it parses), `startup` (wires the roles together and runs
//! them until shutdown), `http` (the server with its timeouts and limits against slow and
//! hostile clients, problem+json, the operational routes), `lease` (the heartbeat that
//! extends leases while work runs), `error` (the cause every boundary error keeps),
//! `telemetry` (tracing and Prometheus metrics).
//!
//! On top: `cli`, the whole command line, which the binary's `main.rs` runs with nothing
//! overridden and a service's own `main` runs with its handler and migrations (`anyhow` is used
//! only there); and, with the `testing` feature, `testing`: the kit for a handler crate's own
//! tests (a database per test, the handler in one transaction, the application on port 0).
//!
//! # What the `dedup-worker` crate promises
//!
//! A service of your own needs the [`prelude`] (the [`Service`] builder, the handler's trait
//! and error, the event, the transaction, outbox messages, migrations), the macros
//! [`execute!`] and [`with_connection!`] for SQL in a handler, and, with the `testing` feature,
//! `testing`: the `dedup-worker` crate re-exports those and nothing else; its shape is recorded
//! in `docs/public-api/dedup-worker.txt` (`scripts/public_api.sh` writes it again, and with
//! `--check` compares).
//!
//! Imports go down the floors of the book's "Layout" (docs/src/guide/layout.md) only (checked
//! by `tests/it/architecture.rs` at the top of the repository): config and the vocabulary, store, queue, outbox, the stages,
//! the webhook routes, startup, the command line.

pub mod backfill;
pub mod cli;
pub mod config;
pub mod console;
pub mod consumer;
pub mod dlq;
pub mod error;
pub mod event;
pub mod gauges;
pub mod http;
pub mod inspect;
pub mod lease;
pub mod operator;
pub mod outbox;
#[cfg(test)]
mod proptest_support;
pub mod queue;
pub mod retention;
pub mod retry;
pub mod signature;
pub mod startup;
pub mod store;
pub mod stripe;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod webhook;

pub use startup::Service;

/// What a handler crate imports: `use dedup_worker::prelude::*;` brings the handler's trait and
/// its error (and `.retryable()` / `.fatal()` on any result, [`HandlerResultExt`](crate::consumer::HandlerResultExt)),
/// the event, the transaction, the store a handler may require ([`Backend`](crate::store::Backend)),
/// outbox messages, migrations and the service builder.
/// (The test kit is `dedup_worker_core::testing`, with the `testing` feature.)
pub mod prelude {
    pub use crate::consumer::{Handler, HandlerError, HandlerResultExt, OutboxMessage};
    pub use crate::event::Event;
    pub use crate::startup::Service;
    pub use crate::store::{Backend, DbTx, Migrations};
    pub use async_trait::async_trait;
}

/// The versions a handler crate's own code must match: `sqlx` for `DbTx`'s connections and
/// `async_trait` for [`Handler`](prelude::Handler). (`sqlx::migrate!` expands to `::sqlx::…`
/// paths, so a crate with migrations of its own also depends on `sqlx = "0.8"` directly.)
pub use async_trait::async_trait;
pub use sqlx;
