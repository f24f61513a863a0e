//! `/events`: the search form (by id or id prefix, type, source, time, outcome, customer,
//! object) and one page of results, with links to the newer and the older page.

use axum::extract::{Query, State};
use axum::Extension;
use maud::{html, Markup};

use super::{csrf, event_path, layout, when, PageError};
use crate::console::auth::Caller;
use crate::console::query::BadFilter;
use crate::console::query::FilterForm;
use crate::console::ConsoleState;
use crate::inspect::{search_events, ListOptions, OutcomeFilter, SearchError};

pub fn list_options(state: &ConsoleState) -> ListOptions {
    let options = &state.options;
    ListOptions {
        statement_timeout: options.statement_timeout,
        sources: options.sources.clone(),
        default_source: options.default_source.clone(),
        database_queue: options.database_queue,
    }
}

/// The search form, filled with `form` as it was typed (also on an error page and on an
/// unknown event's page).
pub fn search_form(state: &ConsoleState, form: &FilterForm) -> Markup {
    let sources = &state.options.sources;
    let outcome =
        OutcomeFilter::parse(form.outcome.trim()).map_or(form.outcome.as_str(), |o| o.name());
    html! {
        form #search method="get" action="/events" {
            fieldset {
                label { "Id " input type="search" name="id" value=(form.id) placeholder="evt_… or evt_1ab*" size="28"; }
                label { "Type " input type="text" name="type" value=(form.type_prefix) placeholder="invoice." size="20"; }
                label { "Customer " input type="search" name="customer" value=(form.customer) placeholder="cus_…" size="20"; }
                label { "Object " input type="search" name="object" value=(form.object) placeholder="in_…, ch_…" size="20"; }
                label { "Source "
                    select name="source" {
                        option value="" selected[form.source.is_empty()] { "any" }
                        @for name in sources {
                            option value=(name) selected[*name == form.source] { (name) }
                        }
                        // What was typed into the query string stays what it was.
                        @if !form.source.is_empty() && !sources.contains(&form.source) {
                            option value=(form.source) selected { (form.source) }
                        }
                    }
                }
                label { "Since " input type="text" name="since" value=(form.since) placeholder="2026-12-04T10:00" size="18"; }
                label { "Until " input type="text" name="until" value=(form.until) placeholder="UTC, or RFC 3339" size="18"; }
                label { "Outcome "
                    select name="outcome" {
                        @for name in OutcomeFilter::NAMES {
                            option value=(name) selected[name == outcome] { (name) }
                        }
                        @if !OutcomeFilter::NAMES.contains(&outcome) {
                            option value=(outcome) selected { (outcome) }
                        }
                    }
                }
                button type="submit" { "Search" }
            }
        }
    }
}

/// `GET /events`.
pub async fn events(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(form): Query<FilterForm>,
) -> Result<Markup, PageError> {
    let query = form
        .events()
        .map_err(|e| PageError::bad_filter(e, search_form(&state, &form)))?;
    let page = search_events(&state.store, &query, &list_options(&state))
        .await
        .map_err(|e| match e {
            SearchError::Field { field, reason } => {
                PageError::bad_filter(BadFilter { field, reason }, search_form(&state, &form))
            }
            SearchError::Cursor(_) => {
                let field = if form.before.is_empty() {
                    "after"
                } else {
                    "before"
                };
                let reason = e.to_string();
                PageError::bad_filter(BadFilter { field, reason }, search_form(&state, &form))
            }
            other => PageError::unavailable(&other),
        })?;
    let body = html! {
        (search_form(&state, &form))
        @if let Some(total) = page.total {
            p #total { (total.shown()) " found" }
        }
        @if page.events.is_empty() {
            p.muted { "No event matches." }
        } @else {
            div.scroll { table #events {
                thead { tr { th { "When" } th { "Outcome" } th { "Type" } th { "Event" } th { "Source" } } }
                tbody {
                    @for e in &page.events {
                        tr {
                            td { (when(e.at_ms)) }
                            td.outcome.(e.story.class()) { (e.story.label()) }
                            td { (e.event_type) }
                            td { @if e.event_id.is_empty() { span.muted { "(id in the payload)" } } @else { a.event href=(event_path(&e.source, &e.event_id)) { (e.event_id) } } }
                            td { (e.source) }
                        }
                    }
                }
            } }
        }
        @if page.previous.is_some() || page.next.is_some() {
            p.pages {
                @if let Some(previous) = &page.previous {
                    a #previous href={ "/events?" (form.page_query_string(Some(("before", previous)), None)) } { "← Newer" }
                    " "
                }
                @if let Some(next) = &page.next {
                    a #next href={ "/events?" (form.page_query_string(Some(("after", next)), None)) } { "Older →" }
                }
            }
        }
    };
    Ok(layout("Events", &csrf(&state, &caller), body))
}
