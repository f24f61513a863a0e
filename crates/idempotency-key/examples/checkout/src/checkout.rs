//! The checkout service: `POST /v1/payments` behind the layer, in three phases with recovery
//! points (see [`Phases`]):
//! 1. `create_payment` (local): the payment row, pending, committed with the phase's record;
//! 2. `charge_provider` (foreign): the provider's charge, with the caller's key (charged or
//!    declined: both final), recorded by the final commit;
//! 3. the final phase: the payment's outcome, written through the request's transaction, which
//!    the layer commits with the stored response.
//!
//! A crash between any two phases, or a 5xx, leaves the finished phases recorded; the retry
//! resumes after them with what they stored, so there is one payment row whatever happens.
//! Passing the caller's key downstream is what makes the foreign phase safe to run again (a
//! crash after the provider answered and before the final commit): the provider replays its
//! charge instead of making a second one.
//!
//! What a first payment costs, in commits of its own: three. The payment row with its record
//! (it must be durable before the provider is called, so that a charge never exists without
//! its pending payment), the provider's charge with its stored response (the provider's own),
//! and the final update with the stored response (the charge's outcome rides it: a commit
//! between them would buy nothing, as nothing leaves the database in between). Both keys' claims
//! share grouped commits with other requests' claims.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{PgPool, Row};

use super::{
    bearer, error, idem_key, listing, missing_bearer_or_key, require_bearer, PaymentRequest,
};
use idempotency_key::{
    IdempotencyKey, IdempotencyLayer, IdempotentClient, Phase, PhaseError, Phases,
};

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

/// What the provider phase recorded: the outcome of the charge, final either way.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum Charge {
    Succeeded { id: String },
    Declined,
}

/// `POST /v1/payments`, in three phases (see the module): the payment row, the provider's
/// charge, and the final update committed with the stored response.
async fn create_payment(
    State(st): State<CheckoutState>,
    phases: Phases,
    headers: HeaderMap,
    Json(req): Json<PaymentRequest>,
) -> Result<Response, PhaseError> {
    let (Some(account), Some(key)) = (bearer(&headers), idem_key(&headers)) else {
        return Ok(missing_bearer_or_key());
    };
    if req.amount <= 0 || req.currency.len() != 3 {
        return Ok(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "parameter_invalid",
            "amount must be positive and currency a 3-letter code",
        ));
    }
    // Phase 1, local: the payment row, pending, committed with the phase's record.
    let payment: i64 = match phases.phase("create_payment")? {
        Phase::Done(id) => id,
        Phase::Run(mut run) => {
            let id = sqlx::query_scalar(
                r#"INSERT INTO checkout_payments (account, idempotency_key, amount, currency, status)
                   VALUES ($1, $2, $3, $4, 'pending') RETURNING id"#,
            )
            .bind(&account)
            .bind(key.as_str())
            .bind(req.amount)
            .bind(&req.currency)
            .fetch_one(run.tx().await?)
            .await
            .map_err(PhaseError::handler)?;
            run.finish(id).await?
        }
    };
    // Phase 2, foreign: the charge, with the same key, so that running this phase again replays
    // the provider's charge instead of making a second one. Its outcome is recorded by the final
    // commit: nothing leaves the database between this phase and that one, so a commit of its
    // own would save only a provider call on the rare retry after the final commit failed.
    let charge = match phases.phase("charge_provider")? {
        Phase::Done(charge) => charge,
        Phase::Run(run) => match charge_provider(&st, &account, &key, &req).await {
            Ok(charge) => run.finish_with_response(charge).await?,
            // A 502 gives our key back with its progress: the retry resumes here.
            Err(answer) => return Ok(answer),
        },
    };
    // The final phase: the payment's outcome, committed by the layer with the response.
    let mut tx = phases.transaction().await?;
    let (status, charge_id) = match &charge {
        Charge::Succeeded { id } => ("succeeded", Some(id.as_str())),
        Charge::Declined => ("declined", None),
    };
    sqlx::query("UPDATE checkout_payments SET status = $2, charge_id = $3 WHERE id = $1")
        .bind(payment)
        .bind(status)
        .bind(charge_id)
        .execute(&mut *tx)
        .await
        .map_err(PhaseError::handler)?;
    let id = format!("pay_{payment}");
    Ok(match charge {
        Charge::Succeeded { id: charge } => (
            StatusCode::CREATED,
            [(header::LOCATION, format!("/v1/payments/{id}"))],
            Json(
                json!({"id": id, "amount": req.amount, "currency": req.currency,
                        "charge": charge, "status": "succeeded"}),
            ),
        )
            .into_response(),
        Charge::Declined => error(
            StatusCode::PAYMENT_REQUIRED,
            "card_error",
            "card_declined",
            "Your card was declined.",
        ),
    })
}

/// The provider call: its final outcome, or the 502 to answer when it gave none.
async fn charge_provider(
    st: &CheckoutState,
    account: &str,
    key: &IdempotencyKey,
    req: &PaymentRequest,
) -> Result<Charge, Response> {
    let url = format!("{}/v1/charges", st.provider_url);
    let charge = match st
        .client
        .post_json_with_key(&url, Some(account), req, key)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "provider unreachable");
            return Err(error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "provider_unreachable",
                "payment provider unreachable; retry with the same key",
            ));
        }
    };
    match charge.status {
        StatusCode::OK => Ok(Charge::Succeeded {
            id: charge
                .json::<serde_json::Value>()
                .ok()
                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
                .unwrap_or_default(),
        }),
        StatusCode::PAYMENT_REQUIRED => Ok(Charge::Declined),
        other => {
            tracing::warn!(status = %other, "provider refused");
            Err(error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "provider_error",
                "payment provider failed; retry with the same key",
            ))
        }
    }
}

async fn list_payments(State(st): State<CheckoutState>, headers: HeaderMap) -> Response {
    let account = bearer(&headers).unwrap_or_default();
    let rows = sqlx::query(
        "SELECT id, idempotency_key, amount, currency, charge_id, status FROM checkout_payments WHERE account = $1 ORDER BY id",
    )
    .bind(&account)
    .fetch_all(&st.pool)
    .await;
    listing(rows, |r| {
        json!({"id": format!("pay_{}", r.try_get::<i64, _>(0).unwrap_or_default()),
               "idempotency_key": r.try_get::<String, _>(1).unwrap_or_default(),
               "amount": r.try_get::<i64, _>(2).unwrap_or_default(),
               "currency": r.try_get::<String, _>(3).unwrap_or_default(),
               "charge": r.try_get::<Option<String>, _>(4).unwrap_or_default(),
               "status": r.try_get::<String, _>(5).unwrap_or_default()})
    })
}
