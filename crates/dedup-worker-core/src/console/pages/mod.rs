//! The console's pages: each handler reads what its page shows, then renders it (maud
//! templates, compiled in; every value escaped, none marked pre-escaped). Shared here: the
//! layout, the login page, and how a failed read or a bad filter is shown.

mod body;
mod dashboard;
mod dead_letter;
mod done;
mod event;
mod events;
mod failures;
mod timeline;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use super::auth::Caller;
use super::query::BadFilter;
use super::style::STYLE;
use super::ConsoleState;
pub use dashboard::dashboard;
pub use dead_letter::dead_letter;
pub use done::done_banner;
pub use event::event;
pub use events::events;
pub use failures::{
    confirmation, dead_letters, failed_deliveries, filter_form, resend_confirmation,
};

/// A whole page: header with the navigation, then `body`. `csrf` is the session's form token
/// (empty for a Bearer caller, who needs none).
pub fn layout(title: &str, csrf: &str, body: Markup) -> Markup {
    layout_with_head(title, csrf, html! {}, body)
}

/// [`layout`], with `head` added to the page's `<head>` (the overview's refresh).
pub fn layout_with_head(title: &str, csrf: &str, head: Markup, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                (head)
                title { (title) " · dedup-worker" }
                style { (maud::PreEscaped(STYLE)) }
                script src="/assets/console.js" defer {}
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

/// Why a page cannot be shown. Rendered by [`IntoResponse`] into a page without the caller's
/// form token, then again by [`with_caller_token`] with it (so "Log out" works from an error
/// page too).
#[derive(Debug)]
pub enum PageError {
    /// The filter is wrong: 400 with what to fix, above the page's own form as it was typed.
    Filter {
        /// Which field, and why.
        error: BadFilter,
        /// The page's filter form, filled with what was typed (empty: the page has none).
        form: Markup,
    },
    /// A page of its own with a status other than 200 (an unknown event's 404).
    Page {
        /// The answer's status.
        status: StatusCode,
        /// The page's heading.
        title: String,
        /// What the page says.
        body: Markup,
    },
    /// A read failed or took too long: 503, try again. The page says a fixed sentence and the
    /// reference the log has the error under; the error's text (an SQL error can quote the
    /// data, and sqlx repeats its source) goes to the log only.
    Unavailable {
        /// Logged with the error.
        reference: String,
    },
}

/// A rendered error page's parts, kept on the response for [`with_caller_token`].
#[derive(Debug, Clone)]
struct ErrorPage {
    title: String,
    body: Markup,
}

impl PageError {
    /// Logs `error` with its whole chain under a new reference.
    pub fn unavailable(error: &dyn std::error::Error) -> Self {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        let reference = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        tracing::warn!(error = %text, %reference, "console: a read failed");
        PageError::Unavailable { reference }
    }

    /// A bad filter shown above `form`, the page's own form as it was typed.
    pub fn bad_filter(error: BadFilter, form: Markup) -> Self {
        PageError::Filter { error, form }
    }
}

impl From<BadFilter> for PageError {
    fn from(error: BadFilter) -> Self {
        PageError::Filter {
            error,
            form: html! {},
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, page) = match self {
            PageError::Filter { error, form } => (
                StatusCode::BAD_REQUEST,
                ErrorPage {
                    title: "Check the filter".into(),
                    body: html! { p.error #problem { (error) } (form) },
                },
            ),
            PageError::Page {
                status,
                title,
                body,
            } => (status, ErrorPage { title, body }),
            PageError::Unavailable { reference } => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorPage {
                    title: "The store did not answer".into(),
                    body: html! {
                        p.error #problem {
                            "The store did not answer in time, or refused the read. Try again in \
                             a moment; if it goes on, the log has the cause under reference "
                            code #reference { (reference) } "."
                        }
                    },
                },
            ),
        };
        let mut response = (status, layout(&page.title, "", page.body.clone())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
        }
        response.extensions_mut().insert(page);
        response
    }
}

/// Middleware inside [`super::auth::require_caller`]: an error page rendered again with the
/// caller's form token, which [`PageError`] cannot know.
pub async fn with_caller_token(
    State(state): State<ConsoleState>,
    request: Request,
    next: Next,
) -> Response {
    let caller = request.extensions().get::<Caller>().cloned();
    let response = next.run(request).await;
    let (Some(caller), Some(page)) = (caller, response.extensions().get::<ErrorPage>()) else {
        return response;
    };
    let page = layout(&page.title, &csrf(&state, &caller), page.body.clone());
    let (parts, _) = response.into_parts();
    (parts, page).into_response()
}

/// Unix milliseconds as `2026-12-04 10:00:00.123 UTC`.
pub fn when_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// Unix milliseconds as `<time datetime="2026-12-04T10:00:00.123Z">2026-12-04 10:00:00.123
/// UTC</time>`: UTC for everyone (and without script), the machine-readable form for
/// `/assets/console.js` to add the browser's local time after it.
pub fn when(ms: i64) -> Markup {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(at) => html! {
            time datetime=(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)) { (when_text(ms)) }
        },
        None => html! { (ms) },
    }
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
