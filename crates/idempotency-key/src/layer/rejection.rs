//! The answers the layer gives itself (missing or invalid key, reuse, a request in progress,
//! an unavailable store, …), in the IETF draft's problem+json style or Stripe's.
//!
//! Each status tells the client what to do next, because nothing else does: a 4xx other than
//! 409 means nothing ran and retrying the same request cannot help; 409 and 503 mean "retry
//! with the same key" and carry `Retry-After` (at least one second: `Retry-After: 0` invites a
//! tight loop); 500 means the handler failed and the key was released, so the same key runs it
//! again.

use std::time::Duration;

use axum::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::key::KeyError;

/// How error responses produced by the layer look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorStyle {
    /// `application/problem+json` (RFC 9457) with the IETF draft's titles.
    #[default]
    Problem,
    /// Stripe-compatible `{"error":{"type":"idempotency_error",...}}`.
    Stripe,
}

/// Errors the layer answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// 400: no key where one is required.
    Missing,
    /// 400: the key is malformed.
    Invalid(KeyError),
    /// 422: the key was used with another request.
    Reused,
    /// 409: a request with this key is still running; retry after the duration.
    InProgress(Duration),
    /// 413: body larger than the buffering limit.
    TooLarge,
    /// 503: the PostgreSQL store is unavailable.
    Unavailable,
    /// 500: the handler panicked or its body failed.
    Internal,
    /// 401: the account extractor found no account to scope the key.
    NoAccount,
    /// 400: the request body could not be read (the client went away mid-body).
    UnreadableBody,
    /// 408: the request body did not arrive in time.
    BodyTimeout,
    /// 401: the account is not one a key can be scoped by (longer than 255 bytes, or with a
    /// control character).
    InvalidAccount,
}

const PROBLEM_TYPE: &str =
    "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-06#section-2.7";

impl Rejection {
    fn status(&self) -> StatusCode {
        match self {
            Rejection::Missing | Rejection::Invalid(_) => StatusCode::BAD_REQUEST,
            Rejection::Reused => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::InProgress(_) => StatusCode::CONFLICT,
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Rejection::NoAccount => StatusCode::UNAUTHORIZED,
            Rejection::UnreadableBody => StatusCode::BAD_REQUEST,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::InvalidAccount => StatusCode::UNAUTHORIZED,
        }
    }

    /// (title, detail, stripe code)
    fn text(&self) -> (&'static str, String, &'static str) {
        match self {
            Rejection::Missing => (
                "Idempotency-Key is missing",
                "This operation is idempotent and requires an Idempotency-Key header.".into(),
                "idempotency_key_missing",
            ),
            Rejection::Invalid(e) => (
                "Idempotency-Key is invalid",
                format!("{e}; use 1 to 255 visible ASCII characters."),
                "idempotency_key_invalid",
            ),
            Rejection::Reused => (
                "Idempotency-Key is already used",
                "This Idempotency-Key was used with a different request; use a new key for a different request.".into(),
                "idempotency_key_reused",
            ),
            Rejection::InProgress(_) => (
                "A request is outstanding for this Idempotency-Key",
                "Another request with this Idempotency-Key is still being processed; retry later.".into(),
                "idempotency_key_in_use",
            ),
            Rejection::TooLarge => (
                "Request body too large",
                "The request body exceeds the limit for idempotent requests.".into(),
                "request_too_large",
            ),
            Rejection::Unavailable => (
                "Idempotency store unavailable",
                "The request was not executed; retry with the same Idempotency-Key.".into(),
                "idempotency_store_unavailable",
            ),
            Rejection::Internal => (
                "Internal error",
                "The request failed; retry with the same Idempotency-Key.".into(),
                "internal_error",
            ),
            Rejection::UnreadableBody => (
                "Unreadable request body",
                "The request body could not be read; nothing was executed.".into(),
                "request_body_unreadable",
            ),
            Rejection::BodyTimeout => (
                "Request body timed out",
                "The request body did not arrive in time; nothing was executed.".into(),
                "request_body_timeout",
            ),
            Rejection::InvalidAccount => (
                "Account cannot scope an Idempotency-Key",
                "The account this request names is longer than 255 bytes or contains a control character.".into(),
                "account_invalid",
            ),
            Rejection::NoAccount => (
                "No account for this request",
                "Idempotency keys are scoped by account, and this request names none.".into(),
                "account_missing",
            ),
        }
    }

    /// Renders the rejection in the given style.
    pub fn into_response(self, style: ErrorStyle) -> Response<Body> {
        let status = self.status();
        let (title, detail, code) = self.text();
        let (content_type, body) = match style {
            ErrorStyle::Problem => (
                "application/problem+json",
                serde_json::json!({
                    "type": PROBLEM_TYPE,
                    "title": title,
                    "status": status.as_u16(),
                    "detail": detail,
                }),
            ),
            ErrorStyle::Stripe => (
                "application/json",
                serde_json::json!({
                    "error": {
                        "type": "idempotency_error",
                        "code": code,
                        "message": format!("{title}. {detail}"),
                    }
                }),
            ),
        };
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let retry_after = match &self {
            Rejection::InProgress(d) => Some(d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            Rejection::Unavailable => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            // At least one second: `Retry-After: 0` invites a tight retry loop.
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        resp
    }
}
