//! The checkout service: `POST /v1/payments` behind the layer, charging the provider with the
//! same key.
//!
//! Passing the caller's key downstream is what makes the whole chain charge once: if a 5xx here
//! released our key and the retry runs the handler again, the provider replays its charge
//! instead of making a second one.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use sqlx::{PgPool, Row};

use super::{
    bearer, error, idem_key, listing, missing_bearer_or_key, require_bearer, PaymentRequest,
};
use crate::idempotency::client::IdempotentClient;
use crate::idempotency::layer::IdempotencyLayer;

/// State of the checkout service.
#[derive(Debug, Clone)]
pub struct CheckoutState {
    /// Payments table.
    pub pool: PgPool,
    /// Base URL of the provider, e.g. `http://127.0.0.1:9000`.
    pub provider_url: String,
    /// Client used for the provider (retries with the same key).
    pub client: IdempotentClient,
}

/// The checkout service: `POST /v1/payments` (behind `layer`, which should scope keys by
/// [`checkout_account`]) and `GET /v1/payments`.
pub fn checkout_router(state: CheckoutState, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/v1/payments", post(create_payment).get(list_payments))
        .layer(layer)
        .layer(middleware::from_fn(require_bearer))
        .with_state(state)
}

/// The checkout's key scope: the bearer account.
pub fn checkout_account(parts: &http::request::Parts) -> Option<String> {
    bearer(&parts.headers)
}

async fn create_payment(
    State(st): State<CheckoutState>,
    headers: HeaderMap,
    Json(req): Json<PaymentRequest>,
) -> Response {
    let (Some(account), Some(key)) = (bearer(&headers), idem_key(&headers)) else {
        return missing_bearer_or_key();
    };
    if req.amount <= 0 || req.currency.len() != 3 {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "parameter_invalid",
            "amount must be positive and currency a 3-letter code",
        );
    }
    // Layer 3: the same key goes downstream, so a re-execution here (after a 5xx released our
    // key) still charges once at the provider.
    let url = format!("{}/v1/charges", st.provider_url);
    let charge = match st
        .client
        .post_json_with_key(&url, Some(&account), &req, &key)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "provider unreachable");
            return error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "provider_unreachable",
                "payment provider unreachable; retry with the same key",
            );
        }
    };
    match charge.status {
        StatusCode::OK => {}
        StatusCode::PAYMENT_REQUIRED => {
            return error(
                StatusCode::PAYMENT_REQUIRED,
                "card_error",
                "card_declined",
                "Your card was declined.",
            );
        }
        other => {
            tracing::warn!(status = %other, "provider refused");
            return error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "provider_error",
                "payment provider failed; retry with the same key",
            );
        }
    }
    let charge_id = charge
        .json::<serde_json::Value>()
        .ok()
        .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
        .unwrap_or_default();
    let row = sqlx::query(
        r#"INSERT INTO checkout_payments (account, idempotency_key, amount, currency, charge_id)
           VALUES ($1, $2, $3, $4, $5) RETURNING id"#,
    )
    .bind(&account)
    .bind(key.as_str())
    .bind(req.amount)
    .bind(&req.currency)
    .bind(&charge_id)
    .fetch_one(&st.pool)
    .await;
    match row {
        Ok(row) => {
            let id = format!("pay_{}", row.try_get::<i64, _>(0).unwrap_or_default());
            (
                StatusCode::CREATED,
                [(header::LOCATION, format!("/v1/payments/{id}"))],
                Json(
                    json!({"id": id, "amount": req.amount, "currency": req.currency,
                            "charge": charge_id, "status": "succeeded"}),
                ),
            )
                .into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "recording payment failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                "unavailable",
                "retry with the same key",
            )
        }
    }
}

async fn list_payments(State(st): State<CheckoutState>, headers: HeaderMap) -> Response {
    let account = bearer(&headers).unwrap_or_default();
    let rows = sqlx::query(
        "SELECT id, idempotency_key, amount, currency, charge_id FROM checkout_payments WHERE account = $1 ORDER BY id",
    )
    .bind(&account)
    .fetch_all(&st.pool)
    .await;
    listing(rows, |r| {
        json!({"id": format!("pay_{}", r.try_get::<i64, _>(0).unwrap_or_default()),
               "idempotency_key": r.try_get::<String, _>(1).unwrap_or_default(),
               "amount": r.try_get::<i64, _>(2).unwrap_or_default(),
               "currency": r.try_get::<String, _>(3).unwrap_or_default(),
               "charge": r.try_get::<String, _>(4).unwrap_or_default()})
    })
}
