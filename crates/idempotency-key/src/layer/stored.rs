//! What of a handler's result is kept under its key, and how a retry gets it back. Both the
//! flow (which stores after the handler) and the transactional mode (which stores inside the
//! handler's own transaction) decide with [`releases_key`], so the promise is one rule.

use axum::body::Body;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::IDEMPOTENT_REPLAYED;
use crate::records::StoredResponse;

/// Results a client is expected to retry are not stored: 5xx (unless `keep_5xx`), and 408,
/// 409, 425 and 429, which say "not now" rather than "this is the outcome".
pub(super) fn releases_key(status: StatusCode, keep_5xx: bool) -> bool {
    (status.is_server_error() && !keep_5xx) || matches!(status.as_u16(), 408 | 409 | 425 | 429)
}

/// Whether a response header is stored and replayed. Connection-level and per-response
/// headers (date, length, framing) are regenerated; cookies are not replayed to whoever
/// retries.
pub fn keep_header(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "date"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-connection"
            | "proxy-authenticate"
            | "set-cookie"
            | "idempotent-replayed"
    )
}

/// A stored result as the response a retry gets, marked `Idempotent-Replayed: true`.
pub(super) fn replay(stored: &StoredResponse) -> Response<Body> {
    let mut resp = Response::new(Body::from(stored.body.clone()));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = resp.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    resp
}
