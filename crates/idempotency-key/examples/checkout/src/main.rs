//! The checkout example: three layers of idempotency in one process.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p idempotency-key-checkout
//! ```
//!
//! - `POST /v1/payments` (behind the Idempotency-Key layer, keys scoped by
//!   `Authorization: Bearer <account>`) charges a payment-provider stub with the same key;
//! - `GET /v1/payments` lists the caller's payments, so anyone can count that a retried payment
//!   happened once;
//! - the provider stub runs in this process on its own port (printed at start), behind its own
//!   layer, and records one charge per key (`GET /v1/charges`).
//! - `GET /metrics` (no bearer needed) is the process's Prometheus text, the layer's
//!   `idempotency_*` metrics among it.
//!
//! Environment: `CHECKOUT_LISTEN` (default `127.0.0.1:8081`), `DATABASE_URL` (PostgreSQL,
//! required), `REDIS_URL` (optional fast path), `PROVIDER_LISTEN` (default `127.0.0.1:0`).
//! Both servers run under [`Limits::default()`](idempotency_key_checkout::Limits) (a request
//! timeout and a cap on requests at once).
//!
//! The whole service is `idempotency_key_checkout::CheckoutApp`, so the tests start the very
//! code this runs.

use idempotency_key_checkout::{install_metrics, CheckoutApp, CheckoutConfig};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut config = CheckoutConfig::from_env()?;
    config.metrics = install_metrics();
    let redis = config.redis_url.is_some();
    let app = CheckoutApp::build(config).await?;
    tracing::info!(
        checkout = %app.addr()?,
        provider = %app.provider_addr()?,
        redis,
        "checkout example listening"
    );
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    app.run(shutdown).await?;
    Ok(())
}
