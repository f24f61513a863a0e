//! The console's pages: each handler reads what its page shows, then renders it (maud
//! templates, compiled in; every value escaped, none marked pre-escaped). Shared here: the
//! layout, the login page, and how a failed read or a bad filter is shown.

mod dashboard;
mod event;
mod events;
mod failures;
mod timeline;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use super::auth::Caller;
use super::query::BadFilter;
use super::style::STYLE;
use super::ConsoleState;
pub use dashboard::dashboard;
pub use event::event;
pub use events::events;
pub use failures::{confirmation, dead_letters, failed_deliveries};

/// A whole page: header with the navigation, then `body`. `csrf` is the session's form token
/// (empty for a Bearer caller, who needs none).
pub fn layout(title: &str, csrf: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · dedup-worker" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "dedup-worker" }
                    nav {
                        a href="/" { "Overview" } " · "
                        a href="/events" { "Events" } " · "
                        a href="/dead-letters" { "Dead letters" } " · "
                        a href="/outbox/failed" { "Failed deliveries" }
                    }
                    form method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The session's CSRF token for the forms of a page.
pub fn csrf(state: &ConsoleState, caller: &Caller) -> String {
    match caller {
        Caller::Session { cookie, .. } => state.keys.csrf(cookie),
        Caller::Bearer => String::new(),
    }
}

/// Why a page cannot be shown.
#[derive(Debug)]
pub enum PageError {
    /// The filter is wrong: 400 with what to fix.
    Filter(BadFilter),
    /// A read failed or took too long: 503, try again.
    Unavailable(String),
}

impl PageError {
    pub fn unavailable(error: &dyn std::error::Error) -> Self {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        tracing::warn!(error = %text, "console: a read failed");
        PageError::Unavailable(text)
    }
}

impl From<BadFilter> for PageError {
    fn from(e: BadFilter) -> Self {
        PageError::Filter(e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, title, detail) = match self {
            PageError::Filter(e) => (StatusCode::BAD_REQUEST, "Check the filter", e.to_string()),
            PageError::Unavailable(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "The store did not answer",
                format!("{e}. Try again in a moment."),
            ),
        };
        let page = layout(title, "", html! { p.error { (detail) } });
        let mut response = (status, page).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
        }
        response
    }
}

/// Unix milliseconds as `2026-12-04 10:00:00.123 UTC`.
pub fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// The path of an event's page.
pub fn event_path(source: &str, event_id: &str) -> String {
    let segment = |s: &str| {
        form_urlencoded::byte_serialize(s.as_bytes())
            .collect::<String>()
            .replace('+', "%20")
    };
    format!("/events/{}/{}", segment(source), segment(event_id))
}
