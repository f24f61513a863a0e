//! `/events/{source}/{id}`: one event's story (what `events show` prints) as a timeline, the
//! payload where the store keeps one, and the actions that apply.
//!
//! The store keeps no copy of a handled event's body (the dedup record is an id, kept small on
//! purpose); a dead letter keeps its payload, which is shown, capped, unless
//! `admin.show_payloads` hides payloads.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Extension;
use maud::{html, Markup};

use super::events::search_form;
use super::{csrf, done_banner, event_path, layout, when, PageError};
use crate::config::shown_destination;
use crate::console::auth::Caller;
use crate::console::query::FilterForm;
use crate::console::ConsoleState;
use crate::event::{check_event_field, EventField};
use crate::inspect::{event_report, EventReport, ShowOptions};
use crate::store::bounded;

/// The most of a payload a page shows.
const PAYLOAD_CAP: usize = 64 * 1024;

/// The most entries of each kind read.
const LIMIT: i64 = 100;

/// `GET /events/{source}/{id}`.
pub async fn event(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path((source, event_id)): Path<(String, String)>,
    Query(form): Query<FilterForm>,
) -> Result<Markup, PageError> {
    check_path(&state, &source, &event_id)?;
    let options = ShowOptions {
        statement_timeout: state.options.statement_timeout,
        database_queue: state.options.database_queue,
        default_source: state.options.default_source.clone(),
        limit: LIMIT,
    };
    let report = event_report(&state.store, &source, &event_id, &options)
        .await
        .map_err(|e| PageError::unavailable(&e))?;
    if !report.found() {
        return Err(not_found(&state, &source, &event_id));
    }
    let payload = match report.dead_letters.first() {
        Some(dead) if state.options.show_payloads => {
            let ids = [dead.id];
            let read = state.store.dead_letters().selected(&ids, 0, 1);
            bounded(state.options.statement_timeout, read)
                .await
                .map_err(|e| PageError::unavailable(&e))?
                .into_iter()
                .next()
                .map(|d| pretty(&d.payload))
        }
        _ => None,
    };
    let done = done_banner(&state, &form.done).await;
    let kept_body = super::body::kept_body(&state, &report).await;
    let csrf = csrf(&state, &caller);
    let action = |what: &str| format!("{}/{what}", event_path(&source, &event_id));
    let story = report.story();
    let body = html! {
        (done)
        p {
            "Outcome: " strong #outcome .(story.class()) { (story.label()) }
            " · type " strong { (report.event_type().unwrap_or("unknown")) }
            " · source " code { (source) }
        }
        ol #timeline {
            @for (_, entry) in timeline(&report, &csrf, &action) { (entry) }
        }
        (super::timeline::attempts(&report.attempts, state.options.show_payloads))
        h2 { "Payload" }
        @match (&payload, state.options.show_payloads) {
            (Some(text), _) => pre #payload { (text) },
            (None, false) => p.muted { "Payloads are hidden here (admin.show_payloads)." },
            (None, true) => p.muted { "No dead letter of this event keeps a payload." },
        }
        (kept_body)
    };
    Ok(layout(&format!("Event {event_id}"), &csrf, body))
}

/// A path no event can have (an id or a source over 255 bytes or with a control character,
/// which the ingress refuses) is a 400, with the search form to try again.
fn check_path(state: &ConsoleState, source: &str, event_id: &str) -> Result<(), PageError> {
    for (field, value) in [(EventField::Source, source), (EventField::Id, event_id)] {
        if let Err(error) = check_event_field(field, value) {
            let body = html! {
                p.error #problem { "No event can have this path: " (error) "." }
                (search_form(state, &FilterForm::default()))
            };
            return Err(PageError::Page {
                status: StatusCode::BAD_REQUEST,
                title: "Not an event's page".into(),
                body,
            });
        }
    }
    Ok(())
}

/// An event nothing is recorded of: 404, with the search form filled with its id.
fn not_found(state: &ConsoleState, source: &str, event_id: &str) -> PageError {
    let form = FilterForm {
        id: event_id.to_owned(),
        source: source.to_owned(),
        ..FilterForm::default()
    };
    let body = html! {
        p #not-found { "Nothing recorded of " code { (event_id) } " from " code { (source) }
            ": not received, or past the dedup window." }
        (search_form(state, &form))
    };
    PageError::Page {
        status: StatusCode::NOT_FOUND,
        title: format!("Event {event_id}"),
        body,
    }
}

/// The report's entries, oldest first.
fn timeline(
    report: &EventReport,
    csrf: &str,
    action: &dyn Fn(&str) -> String,
) -> Vec<(i64, Markup)> {
    let mut entries = Vec::new();
    if let Some(p) = &report.processed {
        if let Some(received) = p.received_at {
            entries.push((
                received,
                html! { li.received { (when(received)) " received by the transport" } },
            ));
        }
        let attempt = p
            .delivery_attempt
            .map(|a| format!(" on delivery {a}"))
            .unwrap_or_default();
        let what = if report.stale.is_empty() {
            "handled"
        } else {
            "recorded, held back as stale"
        };
        entries.push((
            p.processed_at,
            html! { li.handled { (when(p.processed_at)) " " strong { (what) } (attempt) } },
        ));
    }
    let d = &report.duplicates;
    if d.count > 0 {
        let at = d.first_at.unwrap_or(0);
        entries.push((at, html! {
            li.duplicate {
                (when(at)) " " strong { (d.count) " duplicate deliver" (if d.count == 1 { "y" } else { "ies" }) }
                " recognised and dropped"
                @if let Some(last) = d.last_at { @if d.count > 1 { " (last " (when(last)) ")" } }
            }
        }));
    }
    for s in &report.stale {
        entries.push((s.recorded_at, html! {
            li.stale { (when(s.recorded_at)) " stale: object " code { (s.object_id) } " version " (s.version)
                " is older than " code { (s.newer_event_id) } " (version " (s.newer_version) ")" }
        }));
    }
    // Superseded: the event was processed (since), so a redrive would only be a duplicate.
    let superseded = report.processed.is_some();
    for dead in &report.dead_letters {
        entries.push((dead.created_at, html! {
            li.dead_letter {
                (when(dead.created_at)) " " strong { "dead-lettered" } " after " (dead.attempts) " attempt(s) on " code { (dead.queue) } ": " (dead.error)
                @if superseded {
                    " " span.superseded.muted { "(handled since: nothing to redrive)" }
                } @else {
                    form.redrive.inline method="post" action=(action("redrive")) {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="row" value=(dead.id);
                        " " button type="submit" { "Redrive" }
                    }
                }
            }
        }));
    }
    for r in &report.redrives {
        entries.push((r.redriven_at, html! {
            @if r.discarded() {
                li.discarded { (when(r.redriven_at)) " discarded by " (r.actor.as_deref().unwrap_or("an operator")) " (dead letter " a href={ "/dead-letters/" (r.dead_letter_id) } { (r.dead_letter_id) } ": " (r.error) ")" }
            } @else {
                li.redrive { (when(r.redriven_at)) " redriven to " code { (r.redriven_to) } " (dead letter " (r.dead_letter_id) ": " (r.error) ")" }
            }
        }));
    }
    for o in &report.outbox {
        let at = o.dispatched_at.unwrap_or(o.created_at);
        let destination = o
            .destination
            .as_deref()
            .map(shown_destination)
            .unwrap_or_else(|| "the default sink".into());
        entries.push((at, html! {
            li.outbox {
                (when(at)) " outbox delivery " (o.id) " to " code { (destination) } ": "
                strong.(o.status) { (o.status) } " after " (o.attempts) " attempt(s)"
                @if let Some(error) = &o.last_error { " · last error: " (error) }
                @if o.status != "pending" {
                    form.resend.inline method="post" action=(action("resend")) {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="row" value=(o.id);
                        " " button type="submit" { @if o.status == "failed" { "Retry" } @else { "Re-send" } }
                    }
                }
            }
        }));
    }
    for q in report.queued.iter().flatten() {
        entries.push((q.enqueued_at, html! {
            li.queued { (when(q.enqueued_at)) " waiting in queue " code { (q.queue) } " (attempts " (q.attempts) ", visible " (when(q.visible_at)) ")" }
        }));
    }
    entries.sort_by_key(|(at, _)| *at);
    entries
}

/// A payload as indented JSON (as it is when it is not JSON), cut at [`PAYLOAD_CAP`].
pub(super) fn pretty(payload: &[u8]) -> String {
    let text = serde_json::from_slice::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| String::from_utf8_lossy(payload).into_owned());
    if text.len() <= PAYLOAD_CAP {
        return text;
    }
    let mut cut = PAYLOAD_CAP;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}\n… ({} bytes more)", &text[..cut], text.len() - cut)
}
