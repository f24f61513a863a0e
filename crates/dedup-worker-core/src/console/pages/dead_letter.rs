//! `/dead-letters/{id}`: one dead letter, whatever it holds: a message without an event id (a
//! foreign producer's, not JSON) has no event page, and this is where its error and payload
//! are. Redrive from here unless the event was handled since; Discard (offered first for junk:
//! no event id, or a payload that is not JSON). Once it left, the page shows the record it left
//! (where it was redriven to, or who discarded it, and when).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Extension;
use maud::{html, Markup};

use super::event::pretty;
use super::{csrf, done_banner, event_path, layout, when, PageError};
use crate::console::auth::Caller;
use crate::console::query::FilterForm;
use crate::console::ConsoleState;
use crate::store::{bounded, DeadLetter, RedriveRecord};

/// `GET /dead-letters/{id}`.
pub async fn dead_letter(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<i64>,
    Query(form): Query<FilterForm>,
) -> Result<Markup, PageError> {
    let within = state.options.statement_timeout;
    let unavailable = |e: crate::store::StoreError| PageError::unavailable(&e);
    let ids = [id];
    let read = state.store.dead_letters().selected(&ids, 0, 1);
    let Some(dead) = bounded(within, read).await.map_err(unavailable)?.pop() else {
        let record = state.store.dead_letters().record_of(id);
        if let Some(record) = bounded(within, record).await.map_err(unavailable)? {
            let done = done_banner(&state, &form.done).await;
            let csrf = csrf(&state, &caller);
            let body = html! { (done) (left(&record)) p { a href="/dead-letters" { "All dead letters" } } };
            return Ok(layout(&format!("Dead letter {id}"), &csrf, body));
        }
        return Err(PageError::Page {
            status: StatusCode::NOT_FOUND,
            title: format!("Dead letter {id}"),
            body: html! { p #not-found { "No dead letter " (id) ": redriven, or never written." }
            p { a href="/dead-letters" { "All dead letters" } } },
        });
    };
    let handled_since = match dead.event_id.is_empty() {
        true => false,
        false => {
            let read = state
                .store
                .dedup()
                .processed_record(&dead.source, &dead.event_id);
            bounded(within, read).await.map_err(unavailable)?.is_some()
        }
    };
    let done = done_banner(&state, &form.done).await;
    let csrf = csrf(&state, &caller);
    // Junk cannot be handled by a redrive: no event id to dedup by, or not JSON to decode.
    let junk = dead.event_id.is_empty()
        || serde_json::from_slice::<serde::de::IgnoredAny>(&dead.payload).is_err();
    let discard = html! {
        form.discard method="post" action="/dead-letters/discard" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="row" value=(id);
            button type="submit" { "Discard…" }
            " " span.muted { "(deleted for good, with a record; asks first)" }
        }
    };
    let body = html! {
        (done)
        (facts(&dead))
        @if junk {
            p.muted { "Without an event id or a JSON payload, a redrive cannot be handled: discard it." }
            (discard)
        }
        @if handled_since {
            p.superseded.muted { "The event was handled since: nothing to redrive." }
        } @else {
            form.redrive method="post" action={ "/dead-letters/" (id) "/redrive" } {
                input type="hidden" name="csrf" value=(csrf);
                button type="submit" { "Redrive" }
            }
        }
        @if !junk { (discard) }
        h2 { "Payload" }
        @if state.options.show_payloads {
            pre #payload { (pretty(&dead.payload)) }
        } @else {
            p.muted { "Payloads are hidden here (admin.show_payloads)." }
        }
    };
    Ok(layout(&format!("Dead letter {id}"), &csrf, body))
}

/// The record a dead letter left: where it was redriven to, or who discarded it.
fn left(record: &RedriveRecord) -> Markup {
    html! {
        p #left {
            @if record.discarded() {
                "Discarded by " (record.actor.as_deref().unwrap_or("an operator")) " at " (when(record.redriven_at)) "."
            } @else {
                "Redriven to " code { (record.redriven_to) } " at " (when(record.redriven_at)) "."
            }
        }
        div.scroll { table #facts { tbody {
            tr { th { "Type" } td { (record.event_type) } }
            tr { th { "Queue" } td { code { (record.queue) } } }
            tr { th { "Attempts" } td { (record.attempts) } }
            tr { th { "Dead-lettered" } td { (when(record.dead_lettered_at)) } }
            tr { th { "Error" } td #error { (record.error) } }
        } } }
    }
}

/// What is recorded of it, in a table.
fn facts(dead: &DeadLetter) -> Markup {
    html! {
        div.scroll { table #facts { tbody {
            tr { th { "Event" } td {
                @if dead.event_id.is_empty() { span.muted { "(no id)" } }
                @else { a.event href=(event_path(&dead.source, &dead.event_id)) { (dead.event_id) } }
            } }
            tr { th { "Type" } td { (dead.event_type) } }
            tr { th { "Source" } td { code { (dead.source) } } }
            tr { th { "Queue" } td { code { (dead.queue) } } }
            tr { th { "Attempts" } td { (dead.attempts) } }
            tr { th { "Error" } td #error { (dead.error) } }
        } } }
    }
}
