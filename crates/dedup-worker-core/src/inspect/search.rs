//! Search by what an event is about: its customer, the object it carries, an id prefix
//! (`evt_1ab*`). [`search_events`] plans one query for an [`EventQuery`]: with any of those
//! fields it reads the kept bodies' indexes (`store::reads::bodies`), newest first in keyset
//! pages both ways, with a total counted up to [`TOTAL_CAP`] for a customer or an object;
//! without them it is the listing by outcome ([`list_events`]).
//!
//! Found this way: events whose body is kept (handled or held back as stale, within
//! `retention.payload_days`). Dead letters keep no search fields and are not found by them.

use super::list::{kind_name, OutcomeFilter, Total, MAX_PAGE};
use super::list::{list_events, EventPage, EventQuery, ListError, ListOptions, ListedEvent};
use super::Story;
use crate::store::{
    bounded, BodyPage, BodyPosition, BodySearch, FoundBody, ListedKind, Store, StoreError,
};

/// The fewest characters before an id's `*`: a shorter prefix (`evt_*`) matches nearly every
/// event and would read the whole index to count a page.
pub const MIN_ID_PREFIX: usize = 4;

/// A search's total is counted up to this many; more is shown as "1,000+".
pub const TOTAL_CAP: i64 = 1000;

/// How an id is matched: exactly (under each source), or as a prefix of kept bodies' ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMatch {
    /// `evt_1abc`: that event.
    Exact(String),
    /// `evt_1ab*`: the ids starting with `evt_1ab`.
    Prefix(String),
}

impl IdMatch {
    /// The id as typed (trimmed); `None` when empty. A `*` is allowed at the end only, after at
    /// least [`MIN_ID_PREFIX`] characters; the refusal says why.
    pub fn parse(typed: &str) -> Result<Option<IdMatch>, String> {
        let typed = typed.trim();
        if typed.is_empty() {
            return Ok(None);
        }
        let Some(prefix) = typed.strip_suffix('*') else {
            if typed.contains('*') {
                return Err(format!(
                    "{typed:?}: a `*` may only end an id (a prefix: evt_1ab*)"
                ));
            }
            return Ok(Some(IdMatch::Exact(typed.to_owned())));
        };
        if prefix.contains('*') {
            return Err(format!("{typed:?}: one `*`, at the end (evt_1ab*)"));
        }
        if prefix.chars().count() < MIN_ID_PREFIX {
            return Err(format!(
                "{typed:?}: at least {MIN_ID_PREFIX} characters before the `*` (evt_1ab*)"
            ));
        }
        Ok(Some(IdMatch::Prefix(prefix.to_owned())))
    }
}

/// Why a search has no page.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// A field cannot be searched as typed (a 400 naming it).
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("the cursor {0:?} is not one this search gave")]
    Cursor(String),
    #[error("listing events")]
    List(#[source] ListError),
    #[error("searching the kept bodies")]
    Store(#[source] StoreError),
}

/// What [`search_events`] reads: the listing by outcome, or the kept bodies.
#[derive(Debug, Clone)]
pub enum Plan {
    /// No body field: events by outcome, type and time (`list.rs`).
    List,
    /// A customer, object or id prefix: the kept bodies' indexes.
    Bodies(BodySearch),
}

/// The plan for `query`: the kept bodies when it names a customer, an object or an id prefix.
pub fn plan(query: &EventQuery) -> Result<Plan, SearchError> {
    let field = |field, reason| SearchError::Field { field, reason };
    let id = IdMatch::parse(query.id.as_deref().unwrap_or("")).map_err(|e| field("id", e))?;
    let id_prefix = match &id {
        Some(IdMatch::Prefix(prefix)) => Some(prefix.clone()),
        _ => None,
    };
    let customer = trimmed(&query.customer);
    let object = trimmed(&query.object);
    if customer.is_none() && object.is_none() && id_prefix.is_none() {
        return Ok(Plan::List);
    }
    if matches!(id, Some(IdMatch::Exact(_))) {
        // An exact id is one event: its page says everything; with a customer it is ambiguous.
        return Err(field(
            "id",
            "an exact id is searched alone; end it with `*` to search a prefix with a customer or object".into(),
        ));
    }
    if !matches!(
        query.outcome,
        OutcomeFilter::Any | OutcomeFilter::Only(ListedKind::Handled)
    ) {
        return Err(field(
            "outcome",
            format!(
                "a search by customer, object or id prefix finds handled events (their kept \
                 bodies): choose any or handled, not {}",
                query.outcome.name()
            ),
        ));
    }
    let page = match (nonempty(&query.cursor), nonempty(&query.before)) {
        (Some(_), Some(_)) => {
            return Err(field(
                "before",
                "either an older page (after) or a newer one (before), not both".into(),
            ))
        }
        (Some(after), None) => BodyPage::Older(parse_cursor(after)?),
        (None, Some(before)) => BodyPage::Newer(parse_cursor(before)?),
        (None, None) => BodyPage::First,
    };
    Ok(Plan::Bodies(BodySearch {
        customer,
        object,
        id_prefix,
        type_prefix: trimmed(&query.type_prefix),
        source: trimmed(&query.source),
        since_us: query.since_ms.map(|ms| ms.saturating_mul(1000)),
        until_us: query.until_ms.map(|ms| ms.saturating_mul(1000)),
        page,
    }))
}

fn trimmed(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// One page of the events `query` finds (see the module).
pub async fn search_events(
    store: &Store,
    query: &EventQuery,
    options: &ListOptions,
) -> Result<EventPage, SearchError> {
    let search = match plan(query)? {
        Plan::List => {
            return list_events(store, query, options)
                .await
                .map_err(SearchError::List)
        }
        Plan::Bodies(search) => search,
    };
    let limit = query.limit.clamp(1, MAX_PAGE);
    let reads = store.reads();
    let mut rows = bounded(
        options.statement_timeout,
        reads.search_bodies(&search, limit + 1),
    )
    .await
    .map_err(SearchError::Store)?;
    let more = rows.len() as i64 > limit;
    let (next, previous) = match search.page {
        BodyPage::Newer(_) => {
            // Read nearest first and turned round: the row past the page is the newest.
            if more {
                rows.remove(0);
            }
            let next = rows.last().map(|row| cursor(&row.position));
            let previous = more
                .then(|| rows.first().map(|row| cursor(&row.position)))
                .flatten();
            (next, previous)
        }
        page => {
            rows.truncate(limit as usize);
            let next = more
                .then(|| rows.last().map(|row| cursor(&row.position)))
                .flatten();
            let previous = matches!(page, BodyPage::Older(_))
                .then(|| rows.first().map(|row| cursor(&row.position)))
                .flatten();
            (next, previous)
        }
    };
    let total = if search.customer.is_some() || search.object.is_some() {
        let counted = bounded(
            options.statement_timeout,
            reads.count_bodies(&search, TOTAL_CAP + 1),
        )
        .await
        .map_err(SearchError::Store)?;
        Some(if counted > TOTAL_CAP {
            Total::AtLeast(TOTAL_CAP)
        } else {
            Total::Exactly(counted)
        })
    } else {
        None
    };
    Ok(EventPage {
        events: rows.into_iter().map(listed).collect(),
        next,
        previous,
        total,
    })
}

fn listed(row: FoundBody) -> ListedEvent {
    ListedEvent {
        source: row.source,
        event_id: row.event_id,
        event_type: row.event_type,
        at_ms: row.position.at_us.div_euclid(1000),
        outcome: kind_name(ListedKind::Handled),
        story: Story::of_listed(ListedKind::Handled),
    }
}

/// A kept body's position as an opaque, URL-safe string: `TIME.body.KEY`.
fn cursor(position: &BodyPosition) -> String {
    format!("{}.body.{}", position.at_us, hex::encode(position.key))
}

fn parse_cursor(text: &str) -> Result<BodyPosition, SearchError> {
    let parse = || {
        let (at_us, key) = text.split_once(".body.")?;
        Some(BodyPosition {
            at_us: at_us.parse().ok()?,
            key: hex::decode(key).ok()?.try_into().ok()?,
        })
    };
    parse().ok_or_else(|| SearchError::Cursor(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_exact_or_a_prefix_of_at_least_four_characters() {
        assert_eq!(IdMatch::parse(" "), Ok(None));
        assert_eq!(
            IdMatch::parse("evt_1"),
            Ok(Some(IdMatch::Exact("evt_1".into())))
        );
        assert_eq!(
            IdMatch::parse("evt_1ab*"),
            Ok(Some(IdMatch::Prefix("evt_1ab".into())))
        );
        assert_eq!(
            IdMatch::parse("evt_*"),
            Ok(Some(IdMatch::Prefix("evt_".into())))
        );
        for bad in ["evt*", "*", "ev*t", "evt_1**", "e*vt_1*"] {
            assert!(IdMatch::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_body_cursor_reads_back_and_junk_is_refused() {
        let position = BodyPosition {
            at_us: 1_796_119_200_123_456,
            key: [9; 16],
        };
        assert_eq!(parse_cursor(&cursor(&position)).unwrap(), position);
        for bad in ["", "1.body.zz", "x.body.09", "1.handled.k00", "1.body."] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn totals_read_as_people_write_numbers() {
        assert_eq!(Total::Exactly(7).shown(), "7");
        assert_eq!(Total::Exactly(1000).shown(), "1,000");
        assert_eq!(Total::AtLeast(1000).shown(), "1,000+");
        assert_eq!(Total::Exactly(1_234_567).shown(), "1,234,567");
    }

    #[test]
    fn only_a_customer_object_or_id_prefix_reads_the_bodies() {
        let query = |customer: &str, id: &str| EventQuery {
            customer: Some(customer.into()),
            id: Some(id.into()),
            limit: 10,
            ..EventQuery::default()
        };
        assert!(matches!(plan(&query("", "")), Ok(Plan::List)));
        assert!(matches!(plan(&query("", "evt_1")), Ok(Plan::List)));
        assert!(
            matches!(plan(&query("cus_A", "")), Ok(Plan::Bodies(s)) if s.customer.as_deref() == Some("cus_A"))
        );
        assert!(
            matches!(plan(&query("", "evt_1ab*")), Ok(Plan::Bodies(s)) if s.id_prefix.as_deref() == Some("evt_1ab"))
        );
        assert!(matches!(
            plan(&query("cus_A", "evt_1")),
            Err(SearchError::Field { field: "id", .. })
        ));
        let dead = EventQuery {
            outcome: OutcomeFilter::Only(ListedKind::DeadLetter),
            ..query("cus_A", "")
        };
        assert!(matches!(
            plan(&dead),
            Err(SearchError::Field {
                field: "outcome",
                ..
            })
        ));
    }
}
