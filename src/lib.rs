//! dedup-worker: turn at-least-once deliveries into effects that happen once.
//!
//! The data flows through the modules in this order:
//!
//! * [`webhook`]: the HTTP ingress. Verifies `Stripe-Signature` on the raw body
//!   ([`webhook::stripe`]), publishes the event durably through the transport and
//!   only then answers 2xx.
//! * [`queue`]: the transport seam ([`queue::Transport`]) and its implementations
//!   (the embedded database queue, with group commit for ingress).
//! * [`consumer`]: receives batches, deduplicates on `(source, event id)` with
//!   `INSERT … ON CONFLICT DO NOTHING`, runs the [`consumer::Handler`] in the same
//!   transaction, writes outbox rows, commits, and only then acks.
//! * [`outbox`]: rows written inside the caller's transaction, the relay that
//!   claims and delivers them, and the sinks (log, file, HTTP).
//! * [`store`]: PostgreSQL (production) and SQLite (embedded default) behind one
//!   type; every SQL statement of the pipeline lives here.
//! * [`dlq`]: `dlq redrive`, which publishes dead letters again through the configured
//!   transport.
//! * [`lease`]: the heartbeat that extends a consumer's and a relay's leases while they work.
//! * [`retention`]: deletes processed ids past the dedup window and dispatched outbox rows.
//! * [`idempotency`]: standing alone, a tower layer giving synchronous APIs
//!   Stripe-style `Idempotency-Key` semantics.
//!
//! Around them: [`config`] (one typed, validated settings struct), [`startup`]
//! (wires the roles together and runs them until shutdown), [`server`] (the HTTP server with
//! its timeouts and limits against slow and hostile clients), [`telemetry`]
//! (tracing and Prometheus metrics). The binary's commands live in `src/cli.rs`, beside a
//! thin `main.rs`; `anyhow` is used only there.

pub mod config;
pub mod consumer;
pub mod dlq;
pub mod event;
pub mod group_commit;
pub mod idempotency;
pub mod lease;
pub mod outbox;
#[cfg(test)]
mod proptest_support;
pub mod queue;
pub mod retention;
pub mod retry;
pub mod server;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod webhook;
