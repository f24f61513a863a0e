//! `soak_service api`: a synchronous API behind the Idempotency-Key layer (`idempotency-key`),
//! run by the soak beside the pipeline, on the same PostgreSQL server through the same fault
//! proxy, killed, paused and restarted by the same nemesis (issue 36).
//!
//! `POST /v1/charges` with an `Idempotency-Key`, the tenant in `x-tenant` (the layer's account:
//! keys are scoped per tenant) and `{"amount": n}`. The handler works in the layer's
//! [`IdempotentTx`], as a service using row-level security would:
//!
//! 1. it reads the session's `app.tenant` (what an earlier request on the same connection may
//!    have left: it must be empty, a kept connection is as clean as a fresh lend);
//! 2. it sets `app.tenant` for the session (`set_config(…, false)`: not transaction-local, the
//!    setting a reset must remove);
//! 3. it inserts one row into `soak_api_effects`, a table with no unique key: only the layer
//!    stands between a retry and a second row;
//! 4. it answers 201 with the row's id, what it saw, its process and backend, and a fresh nonce,
//!    so a second execution can never produce the same bytes as the first: a replay that is
//!    byte-identical was stored, not run again.
//!
//! Drawn per execution, so retries take the layer's other paths: one in 20 answers 500 after
//! the insert (the writes roll back, the key is released, the retry runs again); one in 40
//! leaves a transaction of its own open on the connection (the layer's commit is at the wrong
//! depth: rolled back, 500); one in 40 swallows a failed statement and answers 201 (PostgreSQL
//! would answer the `COMMIT` with `ROLLBACK`: the layer must not answer 2xx); one in 5 holds
//! the transaction 50–400 ms (duplicates arriving meanwhile get 409, kills land mid-request).
//!
//! Stdout's first line is `dedup-worker listening on http://ADDR`, as the other roles print it.

use std::process::ExitCode;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotency_key::{IdempotencyLayer, IdempotentTx, PgIdempotencyStore};
use rand::Rng;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::Connection;

/// The layer's lease: a killed or stopped process's key is free again this long after its last
/// heartbeat (the soak's pauses are longer, so takeovers happen).
const LEASE: Duration = Duration::from_secs(5);
/// The pool's acquire timeout: a request that cannot get a connection in time answers 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// What a SIGTERM leaves running requests to finish in.
const DRAIN: Duration = Duration::from_secs(10);

/// What the handler knows beside the request.
#[derive(Clone)]
struct Api {
    /// `SOAK_PROCESS`, written into each row and answer.
    process: String,
    /// `SOAK_SERVICE_FAULT=api-outside-tx`: the row is written on a connection of the pool's,
    /// committed at once (a handler that does not use the layer's transaction; the checker
    /// must fail).
    outside_tx: Option<sqlx::PgPool>,
}

#[derive(serde::Deserialize)]
struct ChargeRequest {
    amount: i64,
}

pub async fn run() -> ExitCode {
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("soak_service api: {error:#}");
            ExitCode::from(1)
        }
    }
}

async fn serve() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect(&url)
        .await?;
    idempotency_key::migrate(&pool).await?;
    let fault = crate::handler::ServiceFault::from_env()?;
    let api = Api {
        process: std::env::var("SOAK_PROCESS").unwrap_or_else(|_| "unnamed".to_owned()),
        outside_tx: (fault == Some(crate::handler::ServiceFault::ApiOutsideTx))
            .then(|| pool.clone()),
    };
    let layer = IdempotencyLayer::builder(PgIdempotencyStore::new(pool.clone()))
        .account(|parts| {
            let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
            Some(tenant.to_owned())
        })
        .lease(LEASE)
        .build();
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .with_state(api)
        .layer(layer.clone());
    let listen = std::env::var("DEDUP_LISTEN").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!(
        "dedup-worker listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(terminated())
        .await?;
    layer.drain(DRAIN).await;
    pool.close().await;
    Ok(())
}

async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            term.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// What one execution draws (see the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drawn {
    Succeed,
    FailAfterInsert,
    LeakTransaction,
    SwallowError,
}

fn draw() -> (Drawn, Option<Duration>) {
    let mut rng = rand::thread_rng();
    let drawn = match rng.gen_range(0..40) {
        0 | 1 => Drawn::FailAfterInsert,
        2 => Drawn::LeakTransaction,
        3 => Drawn::SwallowError,
        _ => Drawn::Succeed,
    };
    let hold = rng
        .gen_bool(0.2)
        .then(|| Duration::from_millis(rng.gen_range(50..400)));
    (drawn, hold)
}

async fn charge(
    axum::extract::State(api): axum::extract::State<Api>,
    headers: HeaderMap,
    mut tx: IdempotentTx,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        let value = headers.get(name).and_then(|v| v.to_str().ok());
        value.unwrap_or_default().to_owned()
    };
    let (tenant, key) = (header("x-tenant"), header("idempotency-key"));
    let Ok(request) = serde_json::from_slice::<ChargeRequest>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected {\"amount\": n}").into_response();
    };
    match execute(&api, &tenant, &key, request.amount, &mut tx).await {
        Ok(response) => response,
        // The database failed under the nemesis: the layer releases the key on a 5xx.
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            error.to_string(),
        )
            .into_response(),
    }
}

async fn execute(
    api: &Api,
    tenant: &str,
    key: &str,
    amount: i64,
    tx: &mut IdempotentTx,
) -> Result<Response, sqlx::Error> {
    let (drawn, hold) = draw();
    let (pid, seen_tenant): (i32, String) = sqlx::query_as(
        "SELECT pg_backend_pid(), coalesce(current_setting('app.tenant', true), '')",
    )
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query("SELECT set_config('app.tenant', $1, false)")
        .bind(tenant)
        .execute(&mut **tx)
        .await?;
    let insert = sqlx::query_scalar(
        "INSERT INTO public.soak_api_effects (tenant, idem_key, amount, seen_tenant, process) \
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(tenant)
    .bind(key)
    .bind(amount)
    .bind(&seen_tenant)
    .bind(&api.process);
    let id: i64 = match &api.outside_tx {
        Some(pool) => insert.fetch_one(pool).await?,
        None => insert.fetch_one(&mut **tx).await?,
    };
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    let answer = json!({
        "charge": format!("ch_{id}"),
        "tenant": tenant,
        "amount": amount,
        "seen_tenant": seen_tenant,
        "process": api.process,
        "backend_pid": pid,
        "nonce": uuid::Uuid::new_v4().to_string(),
    });
    match drawn {
        Drawn::Succeed => {}
        Drawn::FailAfterInsert => {
            let failed = json!({"error": "drawn failure", "seen_tenant": seen_tenant});
            return Ok((StatusCode::INTERNAL_SERVER_ERROR, axum::Json(failed)).into_response());
        }
        Drawn::LeakTransaction => {
            // A transaction of the handler's own, never finished: the layer then commits at
            // depth 2, where COMMIT would only release a savepoint.
            let nested = (**tx).begin().await?;
            std::mem::forget(nested);
        }
        Drawn::SwallowError => {
            // A failed statement the handler ignores: the transaction is aborted, and the
            // layer's COMMIT would be answered with ROLLBACK.
            let _ = sqlx::query("SELECT 1 / 0").execute(&mut **tx).await;
        }
    }
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}
