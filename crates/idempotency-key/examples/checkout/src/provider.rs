//! The payment-provider stub: the downstream service the checkout charges, itself behind an
//! idempotency layer (keys scoped by merchant).
//!
//! It stands for a real provider's own guarantee: the same key charges once whatever the
//! checkout does, by its layer first and by the table's unique constraint as a last line (see
//! `setup`, whose `executions` column tells the two apart).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use sqlx::{PgPool, Row};

use super::{
    bearer, error, idem_key, listing, missing_bearer_or_key, require_bearer, PaymentRequest,
};
use idempotency_key::{IdempotencyLayer, IdempotentTx};

/// The payment-provider stub: `POST /v1/charges`, `GET /v1/charges`, behind `layer` (whose
/// account extractor should scope by merchant, e.g. [`provider_account`]).
pub fn provider_router(pool: PgPool, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge).get(list_charges))
        .layer(layer)
        .layer(middleware::from_fn(require_bearer))
        .with_state(pool)
}

/// The stub's key scope: its merchant, namespaced apart from checkout accounts sharing the table.
pub fn provider_account(parts: &http::request::Parts) -> Option<String> {
    bearer(&parts.headers).map(|m| format!("provider/{m}"))
}

/// In the transactional mode: the charge row commits with the stored response, so a crash
/// before the response is stored leaves no charge behind, and the retry charges once.
async fn create_charge(
    mut tx: IdempotentTx,
    headers: HeaderMap,
    Json(req): Json<PaymentRequest>,
) -> Response {
    let (Some(merchant), Some(key)) = (bearer(&headers), idem_key(&headers)) else {
        return missing_bearer_or_key();
    };
    if req.source == "tok_chargeDeclined" {
        return error(
            StatusCode::PAYMENT_REQUIRED,
            "card_error",
            "card_declined",
            "Your card was declined.",
        );
    }
    let res = sqlx::query(
        r#"WITH ins AS (
               INSERT INTO provider_charges (merchant, idempotency_key, amount, currency)
               VALUES ($1, $2, $3, $4)
               ON CONFLICT (merchant, idempotency_key)
                   DO UPDATE SET executions = provider_charges.executions + 1
               RETURNING id)
           SELECT id FROM ins"#,
    )
    .bind(&merchant)
    .bind(key.as_str())
    .bind(req.amount)
    .bind(&req.currency)
    .fetch_one(&mut *tx)
    .await;
    match res {
        Ok(row) => {
            let id: i64 = row.try_get(0).unwrap_or_default();
            (
                StatusCode::OK,
                Json(json!({"id": format!("ch_{id}"), "amount": req.amount, "currency": req.currency})),
            )
                .into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "provider stub: insert failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "unavailable",
                "try again",
            )
        }
    }
}

async fn list_charges(State(pool): State<PgPool>, headers: HeaderMap) -> Response {
    let merchant = bearer(&headers).unwrap_or_default();
    let rows = sqlx::query(
        "SELECT id, idempotency_key, amount, currency, executions FROM provider_charges WHERE merchant = $1 ORDER BY id",
    )
    .bind(&merchant)
    .fetch_all(&pool)
    .await;
    listing(rows, |r| {
        json!({"id": format!("ch_{}", r.try_get::<i64, _>(0).unwrap_or_default()),
               "idempotency_key": r.try_get::<String, _>(1).unwrap_or_default(),
               "amount": r.try_get::<i64, _>(2).unwrap_or_default(),
               "currency": r.try_get::<String, _>(3).unwrap_or_default(),
               "executions": r.try_get::<i32, _>(4).unwrap_or_default()})
    })
}
