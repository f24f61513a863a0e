//! The checkout example: three layers of idempotency in one process.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example checkout
//! ```
//!
//! - `POST /v1/payments` (behind the Idempotency-Key layer, keys scoped by
//!   `Authorization: Bearer <account>`) charges a payment-provider stub with the same key;
//! - `GET /v1/payments` lists the caller's payments, so anyone can count that a retried payment
//!   happened once;
//! - the provider stub runs in this process on its own port (printed at start), behind its own
//!   layer, and records one charge per key (`GET /v1/charges`).
//!
//! Environment: `CHECKOUT_LISTEN` (default `127.0.0.1:8081`), `DATABASE_URL` (PostgreSQL,
//! required), `REDIS_URL` (optional fast path), `PROVIDER_LISTEN` (default `127.0.0.1:0`).

use std::time::Duration;

use dedup_worker::idempotency::example::{self, CheckoutState};
use dedup_worker::idempotency::{
    IdempotencyLayer, IdempotentClient, PgIdempotencyStore, RedisCache,
};
use sqlx::postgres::PgPoolOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| "DATABASE_URL must name a PostgreSQL database (postgres://…)")?;
    let listen = std::env::var("CHECKOUT_LISTEN").unwrap_or_else(|_| "127.0.0.1:8081".into());
    let provider_listen = std::env::var("PROVIDER_LISTEN").unwrap_or_else(|_| "127.0.0.1:0".into());
    let redis = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(RedisCache::new(&url, "checkout-example")?),
        _ => None,
    };

    let pool = PgPoolOptions::new()
        .max_connections(32)
        .connect(&database_url)
        .await?;
    dedup_worker::idempotency::migrate(&pool).await?;
    example::setup(&pool).await?;
    let store = PgIdempotencyStore::new(pool.clone());
    // Expired keys are collected in the background, 1000 rows per statement.
    let _gc = store.spawn_expiry_task(Duration::from_secs(60), 1000);

    // The downstream payment-provider stub, with a layer of its own over the same table
    // (its keys live under the "provider/<merchant>" accounts).
    let mut provider_layer =
        IdempotencyLayer::builder(store.clone()).account(example::provider_account);
    if let Some(r) = &redis {
        provider_layer = provider_layer.redis(r.clone());
    }
    let provider_layer = provider_layer.build();
    let provider = example::provider_router(pool.clone(), provider_layer.clone());
    let provider_listener = tokio::net::TcpListener::bind(&provider_listen).await?;
    let provider_addr = provider_listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(provider_listener, provider).await {
            tracing::error!(error = %e, "provider stub stopped");
        }
    });

    let mut checkout_layer = IdempotencyLayer::builder(store).account(example::checkout_account);
    if let Some(r) = &redis {
        checkout_layer = checkout_layer.redis(r.clone());
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let state = CheckoutState {
        pool,
        provider_url: format!("http://{provider_addr}"),
        client: IdempotentClient::new(http),
    };
    let checkout_layer = checkout_layer.build();
    let app = example::checkout_router(state, checkout_layer.clone());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tracing::info!(
        checkout = %listener.local_addr()?,
        provider = %provider_addr,
        redis = redis.is_some(),
        "checkout example listening"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Requests whose clients went away still run; let them finish and store their results
    // (checkout first: it may still be calling the provider).
    checkout_layer.drain(Duration::from_secs(10)).await;
    provider_layer.drain(Duration::from_secs(10)).await;
    Ok(())
}
