//! The checkout example (`cargo run -p idempotency-key-checkout`), a library so that tests run
//! the very code the example serves. It uses the idempotency-key crate alone: none of the
//! dedup-worker pipeline.
//!
//! Three layers of idempotency:
//! 1. the caller uses [`IdempotentClient`]: one key per payment, retried with the same key;
//! 2. `POST /v1/payments` sits behind [`IdempotencyLayer`], keys scoped by the bearer account;
//! 3. the checkout handler runs in phases with recovery points (payment row, provider charge,
//!    final update: see `checkout.rs`) and charges a payment-provider stub with the same key
//!    (and the caller's account as the provider-side merchant), through the same retrying
//!    client; the stub is itself behind the layer and writes its one charge per key in the
//!    transactional mode, committed with its stored response.
//!
//! This file wires both services and owns what they share (configuration, the bearer account,
//! the tables, error bodies); the checkout service is in `checkout.rs`, the provider stub in
//! `provider.rs`. Both answer in Stripe's error shape so that the client and the tests read them
//! the same way.

mod checkout;
mod provider;

use std::net::SocketAddr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
pub use checkout::{checkout_account, checkout_router, CheckoutState};
use idempotency_key::{
    IdempotencyKey, IdempotencyLayer, IdempotentClient, PgIdempotencyStore, RedisCache,
    IDEMPOTENCY_KEY,
};
use metrics_exporter_prometheus::PrometheusHandle;
pub use provider::{provider_account, provider_router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

/// What the checkout example runs with (its environment, see `src/main.rs`).
#[derive(Debug, Clone)]
pub struct CheckoutConfig {
    /// PostgreSQL (`DATABASE_URL`): keys, payments and the stub's charges.
    pub database_url: String,
    /// Redis fast path (`REDIS_URL`), if any.
    pub redis_url: Option<String>,
    /// Prefix of the Redis keys, so several services (or tests) share one Redis.
    pub redis_prefix: String,
    /// Checkout listen address (`CHECKOUT_LISTEN`).
    pub listen: String,
    /// Provider stub listen address (`PROVIDER_LISTEN`).
    pub provider_listen: String,
    /// Timeouts and caps of both servers.
    pub limits: Limits,
    /// Where `GET /metrics` reads from (the layer's `idempotency_*` metrics among them); none:
    /// no such route. `main` installs the recorder ([`install_metrics`]); a test passes the
    /// handle of the recorder its process already has.
    pub metrics: Option<PrometheusHandle>,
}

/// The bounds both servers run under: `axum::serve` with tower's and tower-http's layers.
/// (A public service also needs header-read timeouts and a connection cap, which `axum::serve`
/// does not set: a proxy in front, or hyper's own builder, gives them.)
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Every request is answered within this; then 503 with `Retry-After`, and the key is
    /// released by the layer's drain, not by the client's wait.
    pub request_timeout: Duration,
    /// Requests handled at once; more are answered 503 with `Retry-After` at once.
    pub max_concurrent_requests: usize,
}

impl Default for Limits {
    /// Every answer within 15 s, 1,024 requests at once.
    fn default() -> Self {
        Limits {
            request_timeout: Duration::from_secs(15),
            max_concurrent_requests: 1024,
        }
    }
}

/// Installs the process's Prometheus recorder, with buckets for the layer's histograms, and
/// returns its handle (none if the process already has a recorder).
pub fn install_metrics() -> Option<PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let seconds = [
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
    ];
    let group_sizes = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("idempotency_request_seconds".into()),
            &seconds,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("idempotency_group_size".into()), &group_sizes)
        })
        .ok()?
        .install_recorder()
        .ok()
}

/// Serves `router` on `listener` under `limits` until `shutdown`, then lets the requests in
/// flight finish.
async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // Both refusals are "not now": the cap's load shedding (at once) and the request timeout
    // (the handler kept running past it; the layer releases or completes its key on its own).
    let busy = |_: tower::BoxError| async {
        let unavailable = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "unavailable",
            "try again",
        );
        ([(header::RETRY_AFTER, "1")], unavailable)
    };
    let bounded = router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(busy))
            .load_shed()
            .concurrency_limit(limits.max_concurrent_requests.max(1))
            .timeout(limits.request_timeout),
    );
    axum::serve(listener, bounded)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

impl CheckoutConfig {
    /// Reads the example's environment; only `DATABASE_URL` is required.
    pub fn from_env() -> Result<Self, &'static str> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Ok(CheckoutConfig {
            database_url: var("DATABASE_URL")
                .ok_or("DATABASE_URL must name a PostgreSQL database (postgres://…)")?,
            redis_url: var("REDIS_URL"),
            redis_prefix: "checkout-example".into(),
            listen: var("CHECKOUT_LISTEN").unwrap_or_else(|| "127.0.0.1:8081".into()),
            provider_listen: var("PROVIDER_LISTEN").unwrap_or_else(|| "127.0.0.1:0".into()),
            limits: Limits::default(),
            metrics: None,
        })
    }
}

/// The checkout example, bound and ready to run: what `cargo run -p idempotency-key-checkout` serves,
/// and what tests start on port 0.
pub struct CheckoutApp {
    checkout: (TcpListener, Router),
    provider: (TcpListener, Router),
    /// Drained at shutdown: requests whose clients went away still finish and store results.
    checkout_layer: IdempotencyLayer,
    provider_layer: IdempotencyLayer,
    /// Deletes expired keys in the background.
    expiry: tokio::task::JoinHandle<()>,
    limits: Limits,
}

impl CheckoutApp {
    /// Connects, creates the tables, builds both layers and binds both listeners.
    pub async fn build(
        config: CheckoutConfig,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let redis = match &config.redis_url {
            Some(url) => Some(RedisCache::new(url, &config.redis_prefix)?),
            None => None,
        };
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .acquire_timeout(Duration::from_secs(5))
            // No ping before each lend: one round trip less per transaction. The price, after
            // PostgreSQL restarts: a request transaction's BEGIN on a dead connection is retried
            // once by the layer, but the store's other statements (a claim it decides alone,
            // a release, a lease extension) and this service's own reads fail once per dead
            // idle connection, each a 503 the client retries.
            .test_before_acquire(false)
            .connect(&config.database_url)
            .await?;
        PgIdempotencyStore::migrate(&pool).await?;
        setup(&pool).await?;
        let store = PgIdempotencyStore::new(pool.clone());
        let expiry = store.spawn_expiry_task(Duration::from_secs(60), 1000);
        let layer = |account: fn(&http::request::Parts) -> Option<String>| {
            let mut builder = IdempotencyLayer::builder(store.clone()).account(account);
            if let Some(r) = &redis {
                builder = builder.redis(r.clone());
            }
            builder.build()
        };
        // The downstream payment-provider stub, with a layer of its own over the same table
        // (its keys live under the "provider/<merchant>" accounts).
        let provider_layer = layer(provider_account);
        let provider_listener = TcpListener::bind(&config.provider_listen).await?;
        let provider_url = format!("http://{}", provider_listener.local_addr()?);
        let provider = provider_router(pool.clone(), provider_layer.clone());
        let checkout_layer = layer(checkout_account);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let state = CheckoutState {
            pool,
            provider_url,
            client: IdempotentClient::new(http),
        };
        // `/metrics` beside it, outside the bearer check: what Prometheus scrapes of a service
        // that mounts the layer (its `idempotency_*` metrics).
        let mut checkout = checkout_router(state, checkout_layer.clone());
        if let Some(handle) = config.metrics {
            let render = move || {
                let text = handle.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
            };
            checkout = checkout.route("/metrics", get(render));
        }
        let checkout_listener = TcpListener::bind(&config.listen).await?;
        Ok(CheckoutApp {
            checkout: (checkout_listener, checkout),
            provider: (provider_listener, provider),
            checkout_layer,
            provider_layer,
            expiry,
            limits: config.limits,
        })
    }

    /// Where `POST /v1/payments` is served.
    pub fn addr(&self) -> std::io::Result<SocketAddr> {
        self.checkout.0.local_addr()
    }

    /// Where the provider stub is served.
    pub fn provider_addr(&self) -> std::io::Result<SocketAddr> {
        self.provider.0.local_addr()
    }

    /// Serves both until `shutdown`, then lets detached requests finish (checkout first: it
    /// may still be calling the provider).
    pub async fn run(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let (listener, router) = self.provider;
        let provider = tokio::spawn(serve(listener, router, self.limits, shutdown.clone()));
        let (listener, router) = self.checkout;
        let served = serve(listener, router, self.limits, shutdown.clone()).await;
        self.checkout_layer.drain(Duration::from_secs(10)).await;
        shutdown.cancel();
        let provider = provider
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        self.provider_layer.drain(Duration::from_secs(10)).await;
        self.expiry.abort();
        served.and(provider)
    }
}

/// The account named by `Authorization: Bearer <account>`.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = v.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// Creates the example's own tables (payments and the stub's charges).
pub async fn setup(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query(
        r#"CREATE TABLE IF NOT EXISTS checkout_payments (
               id BIGSERIAL PRIMARY KEY,
               account TEXT NOT NULL,
               idempotency_key TEXT NOT NULL,
               amount BIGINT NOT NULL,
               currency TEXT NOT NULL,
               charge_id TEXT,
               status TEXT NOT NULL DEFAULT 'pending',
               created_at TIMESTAMPTZ NOT NULL DEFAULT now())"#,
    )
    .execute(pool)
    .await?;
    // A table made by an earlier version of the example: a payment now exists before its charge.
    sqlx::query(
        r#"ALTER TABLE checkout_payments
               ADD COLUMN IF NOT EXISTS status TEXT NOT NULL DEFAULT 'pending',
               ALTER COLUMN charge_id DROP NOT NULL"#,
    )
    .execute(pool)
    .await?;
    // The unique constraint is the stub's own last line of defence: one charge per key even
    // if it were deployed without the layer. `executions` counts how often the charge code ran
    // for the key, so a test can tell the layer (1) from the constraint (> 1) doing the work.
    sqlx::query(
        r#"CREATE TABLE IF NOT EXISTS provider_charges (
               id BIGSERIAL PRIMARY KEY,
               merchant TEXT NOT NULL,
               idempotency_key TEXT NOT NULL,
               amount BIGINT NOT NULL,
               currency TEXT NOT NULL,
               executions INT NOT NULL DEFAULT 1,
               created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
               UNIQUE (merchant, idempotency_key))"#,
    )
    .execute(pool)
    .await?;
    Ok(())
}

async fn require_bearer(req: Request, next: Next) -> Response {
    if bearer(req.headers()).is_none() {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"type": "authentication_error", "message": "send Authorization: Bearer <account>"}})),
        )
            .into_response();
    }
    next.run(req).await
}

/// A payment request (checkout) or charge request (provider).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentRequest {
    /// Amount in minor units.
    pub amount: i64,
    /// ISO currency code.
    pub currency: String,
    /// Card token; `tok_chargeDeclined` is declined with 402.
    #[serde(default = "default_source")]
    pub source: String,
}

fn default_source() -> String {
    "tok_visa".into()
}

fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"type": kind, "code": code, "message": message}})),
    )
        .into_response()
}

fn idem_key(headers: &HeaderMap) -> Option<IdempotencyKey> {
    IdempotencyKey::from_header(headers.get(IDEMPOTENCY_KEY)?).ok()
}

/// The 400 for a create request without a bearer account or a key: both services pass the
/// key on, so neither can do without it.
fn missing_bearer_or_key() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "missing",
        "bearer and key required",
    )
}

/// A `GET` listing, `{"data": [...]}` with one object per row, or a 503 to retry.
fn listing(rows: Result<Vec<PgRow>, sqlx::Error>, item: impl Fn(&PgRow) -> Value) -> Response {
    match rows {
        Ok(rows) => {
            Json(json!({"data": rows.iter().map(item).collect::<Vec<_>>()})).into_response()
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "unavailable",
            "try again",
        ),
    }
}
