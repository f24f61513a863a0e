//! `soak_service`: the service under test of the fault soak (`bench/soak.sh`, driver in
//! `examples/soak`). A service of one's own on the library, like `examples/paid_invoices`, whose
//! handler ([`handler::SoakEffects`]) writes one row per call into an effect table with no unique
//! key (`soak_effects`, its own migration) and forwards the event to the sink, both in the
//! consumer's batch transaction. One binary runs every role: `soak_service ingest`, `consume`,
//! `relay` (or `serve`), with every setting from the environment as `dedup-worker` takes them;
//! and `soak_service api` ([`api`]), a synchronous API behind the Idempotency-Key layer whose
//! handler sets per-tenant session state and writes one row per execution (`soak_api_effects`).
//!
//! Environment of its own:
//!
//! * `SOAK_PROCESS`: a tag written into each effect row (which process handled it);
//! * `SOAK_SERVICE_FAULT`: a deliberately broken service, to show that the soak's checker
//!   catches what it claims to: `forget-dedup` deletes the event's dedup record in the handler's
//!   transaction (the effect commits without it: duplicates are handled again, "doubled"), and
//!   `drop-forward` forwards nothing for about one event in fifty ("lost"), and
//!   `api-outside-tx` makes the API role's handler write its row outside the layer's
//!   transaction (a retry after a failure writes another: "api_doubled"). Unset: correct.

mod api;
mod handler;

use std::process::ExitCode;

use dedup_worker::Service;
use dedup_worker_core::store::Migrations;
use sqlx::migrate::Migrator;

/// The effect table, applied after dedup-worker's migrations on every start.
static POSTGRES: Migrator = sqlx::migrate!("examples/soak_service/migrations/postgres");

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("api") {
        return api::run().await;
    }
    let handler = match handler::SoakEffects::from_env() {
        Ok(handler) => handler,
        Err(refused) => {
            eprintln!("soak_service: {refused}");
            return ExitCode::from(2);
        }
    };
    Service::new()
        .handler(handler)
        .migrations(Migrations::postgres_only(&POSTGRES))
        .run()
        .await
}
