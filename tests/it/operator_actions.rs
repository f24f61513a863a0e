//! The operator's bulk actions (issue 28): `dlq redrive`, `outbox retry --failed` and `outbox
//! resend` by filter, each with its dry-run count, each recorded in `admin_actions`.
//!
//! * [`dead_letters`], [`deliveries`]: on both stores, rows written directly with their types and times: for each
//!   filter (type prefix, since, until, ids, and together) the count equals what the action
//!   then changes, rows outside it are untouched, lists are newest first, an action larger than
//!   a chunk takes every row, and each action is recorded with its actor, filter and count;
//! * [`binary`]: through the real binary and its CLI, an HTTP sink recording each delivery's
//!   `Idempotency-Key`: `outbox resend` of a dispatched range delivers exactly those rows a
//!   second time under their original keys; `outbox retry --failed` after a sink that failed
//!   and recovered; the dry runs count the same rows and change nothing; a `dlq redrive` that
//!   names nothing is refused.

/// Runs each named test on PostgreSQL and on SQLite, each on a database of its own.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(crate::helpers::Backend::Postgres).await } )*
        }
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(crate::helpers::Backend::Sqlite).await } )*
        }
    };
}

mod binary;
mod common;
mod dead_letters;
mod deliveries;
