//! The operator console: server-rendered pages on the admin listener (`admin.listen`), for the
//! person on call asking what happened to a payment's event and putting failures right.
//!
//! * `/`: the last hour per minute (handled, duplicates, dead letters, stale, outbox), the
//!   queue's depth and oldest message, recent failures;
//! * `/events`: search by id, type prefix, time range and outcome, newest first, keyset pages
//!   ([`crate::inspect::list_events`], what `events list` prints);
//! * `/events/{source}/{id}`: the story `events show` prints, the payload where the store keeps
//!   one (a dead letter's), and the actions that apply (redrive a dead letter, re-send a
//!   delivery);
//! * `/dead-letters/{id}`: one dead letter (error, queue, attempts, payload), also one without
//!   an event id, with its Redrive;
//! * `/dead-letters`, `/outbox/failed`: filterable lists with a bulk action by filter, which
//!   first shows how many rows it would touch (the dry run) and asks for confirmation; every
//!   action is recorded ([`crate::operator`], what the CLI's `dlq redrive`, `outbox retry` and
//!   `outbox resend` run) and listed.
//!
//! Pages are HTML from templates compiled into the binary (maud), readable without JavaScript;
//! one small script of its own (`assets.rs`) adds the browser's local time after each UTC time. `auth.rs` says who may see them and which POSTs are let through;
//! `pages/` renders; `actions.rs` takes the POSTs.

mod actions;
mod assets;
pub mod auth;
mod discard;
mod login;
mod pages;
mod query;
mod style;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::middleware::{from_fn_with_state, map_response};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::queue::Transport;
use crate::store::{Store, Wakeups};
pub use auth::Keys;

/// What the console reads and acts through.
#[derive(Clone)]
pub struct ConsoleState {
    pub store: Store,
    /// Dead letters are redriven through the transport the consumers read.
    pub transport: Arc<dyn Transport>,
    pub keys: Keys,
    /// Woken after a retry or a re-send, so this process's relay starts on the rows at once (on
    /// PostgreSQL every process's relay is also woken by the store's notification).
    pub wakeups: Arc<Wakeups>,
    pub options: Arc<ConsoleOptions>,
}

/// The console's view of the configuration.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// Bounds each read (`database.statement_timeout`).
    pub statement_timeout: Duration,
    /// The sources an id is searched under (Stripe's, Standard Webhooks', the consumer's).
    pub sources: Vec<String>,
    /// `consumer.source`: a queued message without a source is consumed under it.
    pub default_source: String,
    /// Whether the transport is the database queue, whose messages the store holds.
    pub database_queue: bool,
    /// The configured queue (its depth and oldest message on `/`).
    pub queue: String,
    /// `admin.show_payloads`, resolved.
    pub show_payloads: bool,
}

/// The console's routes: the login page open, everything else behind [`auth::require_caller`].
pub fn router(state: ConsoleState) -> Router {
    let guarded = Router::new()
        .route("/", get(pages::dashboard))
        .route("/events", get(pages::events))
        .route("/events/{source}/{id}", get(pages::event))
        .route("/events/{source}/{id}/redrive", post(actions::redrive_one))
        .route("/events/{source}/{id}/resend", post(actions::resend_one))
        .route("/dead-letters", get(pages::dead_letters))
        .route("/dead-letters/redrive", post(actions::redrive_by_filter))
        .route("/dead-letters/discard", post(discard::discard_by_filter))
        .route("/dead-letters/{id}", get(pages::dead_letter))
        .route(
            "/dead-letters/{id}/redrive",
            post(actions::redrive_dead_letter),
        )
        .route("/outbox/failed", get(pages::failed_deliveries))
        .route("/outbox/failed/retry", post(actions::retry_by_filter))
        .route("/logout", post(actions::logout))
        .route_layer(from_fn_with_state(state.clone(), pages::with_caller_token))
        .route_layer(from_fn_with_state(state.clone(), auth::require_caller));
    Router::new()
        .route("/login", get(login::login).post(actions::login))
        .route("/assets/console.js", get(assets::console_js))
        .merge(guarded)
        .layer(map_response(protect))
        .with_state(state)
}

/// Headers on every answer: no other site may frame a page (clickjacking a bulk action's
/// button), nothing is loaded from elsewhere, no script runs but this console's own file
/// (`/assets/console.js`; nothing inline), and pages (which can hold personal data) are not
/// cached or sent on as a referrer.
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
             img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}
