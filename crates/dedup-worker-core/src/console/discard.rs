//! `POST /dead-letters/discard`: dead letters deleted for good (junk: no event id, not JSON, or
//! simply not wanted), by the list's filter or one by its own page (`row`). Without
//! `confirm=yes` the dry run (a count and a form to confirm), with it the discard
//! ([`operator::discard_dead_letters`]: each leaves a record of what it was and who discarded
//! it, and the action is recorded), ending on a page whose banner says what it did.

use axum::extract::{Form, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;

use super::actions::{actor, detached, unavailable};
use super::auth::Caller;
use super::pages::{self, confirmation, PageError};
use super::query::{BadFilter, FilterForm};
use super::ConsoleState;
use crate::operator::{self, RowFilter};

/// `POST /dead-letters/discard`.
pub async fn discard_by_filter(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<FilterForm>,
) -> Response {
    let filter = match discard_filter(&form) {
        Ok(filter) => filter,
        Err(e) => {
            let list = pages::filter_form("/dead-letters", &form);
            return PageError::bad_filter(e, list).into_response();
        }
    };
    let csrf = pages::csrf(&state, &caller);
    // One dead letter's page asked: back there, where its record then shows.
    let back = match filter.ids.first() {
        Some(id) => format!("/dead-letters/{id}"),
        None => "/dead-letters".to_owned(),
    };
    if form.confirm != "yes" {
        return match operator::count_dead_letters(&state.store, &filter).await {
            Ok(count) => confirmation(
                "Discard dead letters?",
                ("/dead-letters/discard", &back),
                "Discard",
                count,
                &form,
                &csrf,
            )
            .into_response(),
            Err(e) => unavailable(e),
        };
    }
    let (store, who) = (state.store.clone(), actor(&caller));
    let discard =
        detached(async move { operator::discard_dead_letters(&store, &filter, &who).await });
    match discard
        .await
        .and_then(|done| done.map_err(|e| PageError::unavailable(&e)))
    {
        Ok(done) => Redirect::to(&format!(
            "{back}?{}",
            form.query_string(None, Some(done.action_id))
        ))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// The list's filter, narrowed to the one dead letter `row` names when it names one (a row that
/// is not an id is refused: read as no row, it would discard everything the filter selects).
fn discard_filter(form: &FilterForm) -> Result<RowFilter, BadFilter> {
    let mut filter = form.rows()?;
    let row = form.row.trim();
    if !row.is_empty() {
        let id = row.parse::<i64>().map_err(|_| BadFilter {
            field: "row",
            reason: format!("{row:?} is not a dead letter's id"),
        })?;
        filter.ids = vec![id];
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_narrows_the_discard_to_it_and_a_bad_one_is_refused() {
        let form = |row: &str| FilterForm {
            type_prefix: "invoice.".into(),
            row: row.into(),
            ..FilterForm::default()
        };
        let one = discard_filter(&form(" 42 ")).expect("an id");
        assert_eq!(one.ids, [42]);
        assert_eq!(one.type_prefix.as_deref(), Some("invoice."));
        assert!(discard_filter(&form("")).expect("no row").ids.is_empty());
        let refused = discard_filter(&form("42 OR 1=1")).expect_err("not an id");
        assert_eq!(refused.field, "row");
    }
}
