//! `/dead-letters` and `/outbox/failed`: what failed, filterable, with the bulk action by
//! filter (a dry run first, then a confirmation) and the record of actions taken.

use axum::extract::{Query, State};
use axum::Extension;
use maud::{html, Markup};

use super::{csrf, done_banner, event_path, layout, when, PageError};
use crate::config::shown_destination;
use crate::console::auth::Caller;
use crate::console::query::{FilterForm, PAGE};
use crate::console::ConsoleState;
use crate::operator::{self, AdminAction};
use crate::store::{bounded, OutboxRecord};

/// Recorded actions listed under each list.
const ACTIONS_SHOWN: i64 = 20;

/// The filter form of a list (GET, to `path`).
pub fn filter_form(path: &str, form: &FilterForm) -> Markup {
    html! {
        form #filter method="get" action=(path) {
            fieldset {
                label { "Type " input type="text" name="type" value=(form.type_prefix) placeholder="invoice." size="20"; }
                label { "Since " input type="text" name="since" value=(form.since) placeholder="2026-12-04T10:00" size="18"; }
                label { "Until " input type="text" name="until" value=(form.until) placeholder="UTC, or RFC 3339" size="18"; }
                button type="submit" { "Filter" }
            }
        }
    }
}

/// The filter as hidden fields of a bulk form.
pub fn hidden_filter(form: &FilterForm, csrf: &str) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(csrf);
        input type="hidden" name="type" value=(form.type_prefix);
        input type="hidden" name="since" value=(form.since);
        input type="hidden" name="until" value=(form.until);
        // One row's action (a dead letter's page): the confirmation acts on that row alone.
        @if !form.row.is_empty() { input type="hidden" name="row" value=(form.row); }
    }
}

/// The bulk action's first step: a dry run of `what` for the filter shown.
fn bulk_form(action: &str, what: &str, form: &FilterForm, csrf: &str) -> Markup {
    html! {
        form #bulk method="post" action=(action) {
            (hidden_filter(form, csrf))
            button #dry-run type="submit" { (what) " everything this filter selects…" }
            " " span.muted { "(shows how many first, and asks)" }
        }
    }
}

pub fn actions_table(actions: &[AdminAction]) -> Markup {
    html! {
        h2 { "Actions taken" }
        @if actions.is_empty() { p.muted { "None recorded yet." } } @else {
            div.scroll { table #actions {
                thead { tr { th { "When" } th { "Who" } th { "Action" } th { "Filter" } th { "Rows" } } }
                tbody { @for a in actions { tr {
                    td { (when(a.at_ms)) } td { (a.actor) } td { (a.action) } td { code { (a.filter) } } td.count { (a.count) }
                } } }
            } }
        }
    }
}

async fn recent_actions(state: &ConsoleState, action: &str) -> Result<Vec<AdminAction>, PageError> {
    let actions = bounded(
        state.options.statement_timeout,
        operator::recent_actions(&state.store, ACTIONS_SHOWN * 3),
    )
    .await
    .map_err(|e| PageError::unavailable(&e))?;
    Ok(actions
        .into_iter()
        .filter(|a| a.action.starts_with(action))
        .take(ACTIONS_SHOWN as usize)
        .collect())
}

/// `GET /dead-letters`.
pub async fn dead_letters(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(form): Query<FilterForm>,
) -> Result<Markup, PageError> {
    let filter = form
        .rows()
        .map_err(|e| PageError::bad_filter(e, filter_form("/dead-letters", &form)))?;
    let read = operator::list_dead_letters(&state.store, &filter, form.before_id(), PAGE + 1);
    let mut rows = bounded(state.options.statement_timeout, read)
        .await
        .map_err(|e| PageError::unavailable(&e))?;
    let more = rows.len() as i64 > PAGE;
    rows.truncate(PAGE as usize);
    let actions = recent_actions(&state, "dlq").await?;
    let done = done_banner(&state, &form.done).await;
    let csrf = csrf(&state, &caller);
    let body = html! {
        (done)
        (filter_form("/dead-letters", &form))
        @if rows.is_empty() { p.muted { "No dead letter matches." } } @else {
            (bulk_form("/dead-letters/redrive", "Redrive", &form, &csrf))
            form #bulk-discard method="post" action="/dead-letters/discard" {
                (hidden_filter(&form, &csrf))
                button #dry-run-discard type="submit" { "Discard everything this filter selects…" }
                " " span.muted { "(deleted for good, each with a record; shows how many first)" }
            }
            div.scroll { table #dead-letters {
                thead { tr { th { "Dead letter" } th { "When" } th { "Event" } th { "Type" } th { "Queue" } th { "Attempts" } th { "Error" } } }
                tbody { @for d in &rows { tr {
                    td { a.dead-letter href={ "/dead-letters/" (d.id) } { (d.id) } }
                    td { (when(d.created_at_ms)) }
                    td { @if d.event_id.is_empty() { span.muted { "(no id)" } } @else { a.event href=(event_path(&d.source, &d.event_id)) { (d.event_id) } } }
                    td { (d.event_type) } td { code { (d.queue) } } td { (d.attempts) } td { (d.error) }
                } } }
            } }
            @if more { @if let Some(last) = rows.last() {
                p { a #next href={ "/dead-letters?" (form.query_string(Some(&last.id.to_string()), None)) } { "Older →" } }
            } }
        }
        (actions_table(&actions))
    };
    Ok(layout("Dead letters", &csrf, body))
}

/// `GET /outbox/failed`.
pub async fn failed_deliveries(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(form): Query<FilterForm>,
) -> Result<Markup, PageError> {
    let filter = form
        .rows()
        .map_err(|e| PageError::bad_filter(e, filter_form("/outbox/failed", &form)))?;
    let read = operator::list_failed_deliveries(&state.store, &filter, form.before_id(), PAGE + 1);
    let mut rows = bounded(state.options.statement_timeout, read)
        .await
        .map_err(|e| PageError::unavailable(&e))?;
    let more = rows.len() as i64 > PAGE;
    rows.truncate(PAGE as usize);
    let actions = recent_actions(&state, "outbox").await?;
    let done = done_banner(&state, &form.done).await;
    let csrf = csrf(&state, &caller);
    let body = html! {
        (done)
        (filter_form("/outbox/failed", &form))
        @if rows.is_empty() { p.muted { "No failed delivery matches." } } @else {
            (bulk_form("/outbox/failed/retry", "Retry", &form, &csrf))
            div.scroll { table #deliveries {
                thead { tr { th { "Written" } th { "Event" } th { "Type" } th { "Destination" } th { "Status" } th { "Attempts" } th { "Last error" } } }
                tbody { @for o in &rows { tr {
                    td { (when(o.created_at_ms)) }
                    td { a.event href=(event_path(&o.source, &o.event_id)) { (o.event_id) } }
                    td { (o.event_type) }
                    td.destination { code { (o.destination.as_deref().map(shown_destination).unwrap_or_else(|| "default sink".into())) } }
                    td.status.(o.status) { (o.status) } td { (o.attempts) } td { (o.last_error.as_deref().unwrap_or("")) }
                } } }
            } }
            @if more { @if let Some(last) = rows.last() {
                p { a #next href={ "/outbox/failed?" (form.query_string(Some(&last.id.to_string()), None)) } { "Older →" } }
            } }
        }
        (actions_table(&actions))
    };
    Ok(layout("Failed deliveries", &csrf, body))
}

/// The confirmation of a bulk action: how many rows the filter selects now, and a form that
/// performs it.
pub fn confirmation(
    title: &str,
    (action, back): (&str, &str),
    verb: &str,
    count: u64,
    form: &FilterForm,
    csrf: &str,
) -> Markup {
    let described = form
        .pairs()
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    layout(
        title,
        csrf,
        html! {
            p { "The filter (" @if described.is_empty() { "everything" } @else { (described) } ") selects "
                strong #dry-run-count { (count) } " row(s) now. Nothing has changed yet." }
            @if count > 0 {
                form #confirm method="post" action=(action) {
                    (hidden_filter(form, csrf))
                    input type="hidden" name="confirm" value="yes";
                    button #confirm type="submit" { (verb) " " (count) " row(s)" }
                }
            }
            p { a href={ (back) "?" (form.query_string(None, None)) } { "Cancel" } }
        },
    )
}

/// The question before a delivered row is re-sent: what it was, where it went, when.
pub fn resend_confirmation(
    delivery: &OutboxRecord,
    (action, back): (&str, &str),
    csrf: &str,
) -> Markup {
    let destination = delivery
        .destination
        .as_deref()
        .map(shown_destination)
        .unwrap_or_else(|| "the default sink".into());
    let title = format!("Re-send delivery {}?", delivery.id);
    layout(
        &title,
        csrf,
        html! {
            p #question { "Delivery " (delivery.id) " was delivered"
                @if let Some(at) = delivery.dispatched_at { " at " (when(at)) }
                " to " code { (destination) }
                "; re-send it with the same Idempotency-Key? Nothing has changed yet." }
            form #confirm method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="row" value=(delivery.id);
                input type="hidden" name="confirm" value="yes";
                button #confirm type="submit" { "Re-send delivery " (delivery.id) }
            }
            p { a #cancel href=(back) { "Cancel" } }
        },
    )
}
