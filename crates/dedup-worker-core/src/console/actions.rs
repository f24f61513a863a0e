//! The console's POSTs: logging in and out, and the actions ([`crate::operator`], the CLI's
//! own): redrive dead letters and retry failed deliveries by filter (a dry run, then the
//! action once confirmed), and one dead letter or one delivery from its event's page. Each
//! action is recorded with who took it; each ends in a redirect (303) to a page that shows
//! the result, so a reload does not repeat it.
//!
//! The middleware in `auth.rs` has let only this console's own pages through (token or
//! session, same origin, the session's form token).

use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use serde::Deserialize;

use super::auth::{cross_origin, forbidden, now_secs, over_https, Caller};
use super::login;
use super::pages::confirmation;
use super::pages::{self, event_path, PageError};
use super::query::FilterForm;
use super::ConsoleState;
use crate::operator::{self, Actor, RowFilter};

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    next: String,
}

/// `POST /login`: the token typed, a session cookie set. Same-origin only (no other page may
/// log a browser in to a session of its choosing).
pub async fn login(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Some(why) = cross_origin(&headers) {
        return forbidden(why);
    }
    let next = login::safe_next(&form.next);
    if !state.keys.is_token(form.token.trim()) {
        tracing::warn!("console: a login with a wrong token");
        let page = login::login_page(next, Some("That is not the token (admin.token)."));
        return (StatusCode::UNAUTHORIZED, page).into_response();
    }
    let name: String = form
        .name
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    let cookie = state.keys.session(&name, now_secs());
    let mut response = Redirect::to(next).into_response();
    if let Ok(value) = state.keys.set_cookie(&cookie, over_https(&headers)).parse() {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `POST /logout`.
pub async fn logout(State(state): State<ConsoleState>, headers: HeaderMap) -> Response {
    let mut response = Redirect::to("/login").into_response();
    if let Ok(value) = state.keys.set_cookie("", over_https(&headers)).parse() {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

pub(super) fn actor(caller: &Caller) -> Actor {
    match caller {
        Caller::Bearer => Actor::console("bearer token"),
        Caller::Session { name, .. } => Actor::console(name),
    }
}

pub(super) fn unavailable(error: impl std::error::Error) -> Response {
    PageError::unavailable(&error).into_response()
}

/// `POST /dead-letters/redrive`: without `confirm=yes` the dry run (a count and a form to
/// confirm), with it the redrive.
pub async fn redrive_by_filter(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<FilterForm>,
) -> Response {
    let filter = match form.rows() {
        Ok(filter) => filter,
        Err(e) => {
            let list = pages::filter_form("/dead-letters", &form);
            return PageError::bad_filter(e, list).into_response();
        }
    };
    let csrf = pages::csrf(&state, &caller);
    if form.confirm != "yes" {
        return match operator::count_dead_letters(&state.store, &filter).await {
            Ok(count) => confirmation(
                "Redrive dead letters?",
                ("/dead-letters/redrive", "/dead-letters"),
                "Redrive",
                count,
                &form,
                &csrf,
            )
            .into_response(),
            Err(e) => unavailable(e),
        };
    }
    let who = actor(&caller);
    let (store, transport) = (state.store.clone(), state.transport.clone());
    let redrive = detached(async move {
        operator::redrive_dead_letters_recorded(&store, transport.as_ref(), &filter, None, &who)
            .await
    });
    match redrive
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)))
    {
        Ok(done) => Redirect::to(&format!(
            "/dead-letters?{}",
            form.query_string(None, Some(done.action_id))
        ))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /outbox/failed/retry`: the dry run, then the retry, as above.
pub async fn retry_by_filter(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<FilterForm>,
) -> Response {
    let filter = match form.rows() {
        Ok(filter) => filter,
        Err(e) => {
            let list = pages::filter_form("/outbox/failed", &form);
            return PageError::bad_filter(e, list).into_response();
        }
    };
    let csrf = pages::csrf(&state, &caller);
    if form.confirm != "yes" {
        return match operator::count_failed_deliveries(&state.store, &filter).await {
            Ok(count) => confirmation(
                "Retry failed deliveries?",
                ("/outbox/failed/retry", "/outbox/failed"),
                "Retry",
                count,
                &form,
                &csrf,
            )
            .into_response(),
            Err(e) => unavailable(e),
        };
    }
    let (store, who) = (state.store.clone(), actor(&caller));
    let retried =
        detached(
            async move { operator::retry_failed_deliveries_recorded(&store, &filter, &who).await },
        );
    let retried = retried
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)));
    state.wakeups.outbox.notify_waiters();
    match retried {
        Ok(done) => Redirect::to(&format!(
            "/outbox/failed?{}",
            form.query_string(None, Some(done.action_id))
        ))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// Runs an action on a task of its own, and waits for it. A request's future is dropped when
/// it is cut off (`http.request_timeout`, a closed connection, a second click); an action
/// dropped between two rows would be left half done and unrecorded. Detached, it finishes and
/// records what it did even when nobody waits for the answer any more.
pub(super) async fn detached<T: Send + 'static>(
    action: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, PageError> {
    tokio::spawn(action)
        .await
        .map_err(|e| PageError::unavailable(&e))
}

/// The one row an event page's form names.
fn one_row(form: &FilterForm) -> Option<RowFilter> {
    let id = form.row.trim().parse().ok()?;
    Some(RowFilter {
        ids: vec![id],
        ..RowFilter::default()
    })
}

fn bad_row() -> Response {
    (
        StatusCode::BAD_REQUEST,
        "the form names no row of this event",
    )
        .into_response()
}

/// Whether `row` is one of the event's dead letters (`dead_letter`) or outbox rows: an event
/// page's form acts on that event's rows only.
async fn belongs(
    state: &ConsoleState,
    (source, event_id): (&str, &str),
    row: &RowFilter,
    dead_letter: bool,
) -> Result<bool, Response> {
    let store = &state.store;
    let ids: Vec<i64> = if dead_letter {
        store
            .reads()
            .dead_letters_of(source, event_id, 1000)
            .await
            .map(|r| r.into_iter().map(|d| d.id).collect())
    } else {
        store
            .reads()
            .outbox_of(source, event_id, 1000)
            .await
            .map(|r| r.into_iter().map(|o| o.id).collect())
    }
    .map_err(unavailable)?;
    Ok(row.ids.iter().all(|id| ids.contains(id)))
}

/// An action's path under its page's.
fn action_path(page: &str, what: &str) -> String {
    format!("{page}/{what}")
}

/// The redirect (303) to `page` saying what was done, when something was.
fn done_at(page: &str, done: Option<operator::Recorded>) -> Response {
    match done {
        Some(done) => Redirect::to(&format!("{page}?done={}", done.action_id)).into_response(),
        None => Redirect::to(page).into_response(),
    }
}

/// A dead letter of an event handled since: a redrive would only be a duplicate (409).
fn superseded(source: &str, event_id: &str) -> Response {
    let page = event_path(source, event_id);
    let body = maud::html! {
        p.error #problem { "This event was handled after it was dead-lettered: redriving the dead \
            letter would only deliver a duplicate, so nothing was done." }
        p { a href=(page) { "Back to the event" } }
    };
    PageError::Page {
        status: StatusCode::CONFLICT,
        title: "Handled since".into(),
        body,
    }
    .into_response()
}

/// `POST /events/{source}/{id}/redrive`: one dead letter of the event, back to its queue.
pub async fn redrive_one(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path((source, event_id)): Path<(String, String)>,
    Form(form): Form<FilterForm>,
) -> Response {
    let Some(filter) = one_row(&form) else {
        return bad_row();
    };
    match belongs(&state, (&source, &event_id), &filter, true).await {
        Ok(true) => {}
        Ok(false) => return bad_row(),
        Err(response) => return response,
    }
    match state
        .store
        .dedup()
        .processed_record(&source, &event_id)
        .await
    {
        Ok(None) => {}
        Ok(Some(_)) => return superseded(&source, &event_id),
        Err(e) => return unavailable(e),
    }
    let who = actor(&caller);
    let (store, transport) = (state.store.clone(), state.transport.clone());
    let redrive = detached(async move {
        operator::redrive_dead_letters_recorded(&store, transport.as_ref(), &filter, None, &who)
            .await
    });
    match redrive
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)))
    {
        Ok(done) => done_at(&event_path(&source, &event_id), Some(done)),
        Err(e) => e.into_response(),
    }
}

/// `POST /events/{source}/{id}/resend`: one delivery of the event again: a failed one retried,
/// a dispatched one re-sent under its original `Idempotency-Key`.
pub async fn resend_one(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path((source, event_id)): Path<(String, String)>,
    Form(form): Form<FilterForm>,
) -> Response {
    let Some(filter) = one_row(&form) else {
        return bad_row();
    };
    let delivery = match state
        .store
        .reads()
        .outbox_of(&source, &event_id, 1000)
        .await
    {
        Ok(rows) => rows.into_iter().find(|o| filter.ids == [o.id]),
        Err(e) => return unavailable(e),
    };
    let Some(delivery) = delivery else {
        return bad_row();
    };
    // A delivered row is delivered again only once asked twice: a receiver that does not
    // deduplicate on the Idempotency-Key acts on it again. A failed row's retry delivered
    // nothing before, and stays one click.
    if delivery.status == "dispatched" && form.confirm != "yes" {
        let csrf = pages::csrf(&state, &caller);
        let back = event_path(&source, &event_id);
        return pages::resend_confirmation(
            &delivery,
            (&action_path(&back, "resend"), &back),
            &csrf,
        )
        .into_response();
    }
    let who = actor(&caller);
    let store = state.store.clone();
    // A failed row is retried, a dispatched one re-sent; a pending one is left to the relay
    // (nothing done, nothing recorded).
    let done = detached(async move {
        if operator::count_failed_deliveries(&store, &filter).await? == 1 {
            let done = operator::retry_failed_deliveries_recorded(&store, &filter, &who).await?;
            return Ok(Some(done));
        }
        if operator::count_dispatched_deliveries(&store, &filter).await? == 1 {
            let done = operator::resend_dispatched_deliveries_recorded(&store, &filter, &who);
            return Ok(Some(done.await?));
        }
        Ok::<_, crate::store::StoreError>(None)
    });
    let done = done
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)));
    state.wakeups.outbox.notify_waiters();
    match done {
        Ok(done) => done_at(&event_path(&source, &event_id), done),
        Err(e) => e.into_response(),
    }
}

/// `POST /dead-letters/{id}/redrive`: one dead letter from its own page (a message without an
/// event id has no event page), unless its event was handled since.
pub async fn redrive_dead_letter(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
) -> Response {
    let dead = match state.store.dead_letters().selected(&[id], 0, 1).await {
        Ok(mut rows) => rows.pop(),
        Err(e) => return unavailable(e),
    };
    let Some(dead) = dead else {
        return bad_row();
    };
    if !dead.event_id.is_empty() {
        match state
            .store
            .dedup()
            .processed_record(&dead.source, &dead.event_id)
            .await
        {
            Ok(None) => {}
            Ok(Some(_)) => return superseded(&dead.source, &dead.event_id),
            Err(e) => return unavailable(e),
        }
    }
    let filter = RowFilter {
        ids: vec![id],
        ..RowFilter::default()
    };
    let who = actor(&caller);
    let (store, transport) = (state.store.clone(), state.transport.clone());
    let redrive = detached(async move {
        operator::redrive_dead_letters_recorded(&store, transport.as_ref(), &filter, None, &who)
            .await
    });
    match redrive
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)))
    {
        Ok(done) => done_at("/dead-letters", Some(done)),
        Err(e) => e.into_response(),
    }
}
