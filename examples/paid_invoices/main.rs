//! `paid_invoices`: a service of your own on dedup-worker, as the book's "Your own handler"
//! (docs/src/handler/your-own-handler.md) walks through it. It records each paid Stripe invoice once in a table of its own and tells
//! the sink about it once, on PostgreSQL or SQLite, with every stock command of the
//! `dedup-worker` binary (`serve`, `migrate`, `dlq`, `outbox`, `events`, `sign`, …):
//!
//! ```sh
//! STRIPE_WEBHOOK_SECRET=whsec_local cargo run --example paid_invoices -- serve
//! ```
//!
//! What a service brings of its own is three things: its migrations (a folder per store, made
//! with `sqlx::migrate!`), its handler ([`handler::PaidInvoices`]), and this `main`.

mod handler;

use dedup_worker::prelude::*;
use sqlx::migrate::Migrator;

/// The service's own tables, applied after dedup-worker's on every start (when
/// `database.migrate_on_start`) and by `paid_invoices migrate`, each once; their history is
/// apart from the library's.
static POSTGRES: Migrator = sqlx::migrate!("examples/paid_invoices/migrations/postgres");
static SQLITE: Migrator = sqlx::migrate!("examples/paid_invoices/migrations/sqlite");

fn migrations() -> Migrations {
    Migrations::new(&POSTGRES, &SQLITE)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    Service::new()
        .handler(handler::PaidInvoices)
        .migrations(migrations())
        .run()
        .await
}
