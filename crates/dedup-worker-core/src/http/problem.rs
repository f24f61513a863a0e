//! RFC 9457 `application/problem+json` answers: the one place where ingress errors become HTTP.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// A problem document. `check` names the failed verification step for machines.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<&'static str>,
    /// Seconds the client should wait before retrying (also sent as `Retry-After`).
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl Problem {
    /// `type_uri` is a `urn:dedup-worker:problem:…` name, stable for clients to match on.
    pub fn new(
        status: StatusCode,
        type_uri: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            type_uri,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            check: None,
            retry_after: None,
        }
    }

    pub fn with_check(mut self, check: &'static str) -> Self {
        self.check = Some(check);
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
