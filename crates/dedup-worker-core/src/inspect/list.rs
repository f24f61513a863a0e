//! `dedup-worker events list` and the console's `/events`: events by id, type prefix, time
//! range and outcome, newest first, a page at a time.
//!
//! An outcome is one table (see `store::event_list`); "any" asks each for a page and merges
//! them. A page ends with a cursor, the position of its last row (time, outcome, tie), which
//! the next page starts after: rows that arrive meanwhile never shift a page, as an offset
//! would, and reading page 1,000 costs what page 1 does.

use std::time::Duration;

use serde_json::{json, Value};

use super::{time, Story};
use crate::config::{Settings, TransportKind};
use crate::store::{
    bounded, dedup_key, ListFilter, ListPosition, ListedKind, ListedRow, Store, StoreError, Tie,
};

/// Which outcome to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutcomeFilter {
    #[default]
    Any,
    Only(ListedKind),
}

impl OutcomeFilter {
    /// Every value, with the name forms and the CLI take.
    pub const NAMES: [&'static str; 6] = [
        "any",
        "handled",
        "duplicate",
        "dead_letter",
        "stale",
        "pending",
    ];

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "" | "any" => OutcomeFilter::Any,
            other => OutcomeFilter::Only(kind_by_name(other)?),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            OutcomeFilter::Any => "any",
            OutcomeFilter::Only(kind) => kind_name(kind),
        }
    }
}

/// The outcome a listed row shows.
pub fn kind_name(kind: ListedKind) -> &'static str {
    match kind {
        ListedKind::Handled => "handled",
        ListedKind::Duplicate => "duplicate",
        ListedKind::DeadLetter => "dead_letter",
        ListedKind::Stale => "stale",
        ListedKind::Pending => "pending",
    }
}

fn kind_by_name(name: &str) -> Option<ListedKind> {
    Some(match name {
        "handled" => ListedKind::Handled,
        "duplicate" => ListedKind::Duplicate,
        "dead_letter" => ListedKind::DeadLetter,
        "stale" => ListedKind::Stale,
        "pending" => ListedKind::Pending,
        _ => return None,
    })
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// One event id, exact (under each of `ListOptions::sources`), or a prefix ending in `*`
    /// (`search.rs`: the kept bodies).
    pub id: Option<String>,
    /// Events of this customer (`search.customer_pointer`'s value; `search.rs`).
    pub customer: Option<String>,
    /// Events about this object (`search.object_pointer`'s value; `search.rs`).
    pub object: Option<String>,
    /// Types starting with this.
    pub type_prefix: Option<String>,
    /// Only this source's events (a named source's name, `stripe`, …).
    pub source: Option<String>,
    /// At or after, Unix milliseconds.
    pub since_ms: Option<i64>,
    /// Before, Unix milliseconds.
    pub until_ms: Option<i64>,
    pub outcome: OutcomeFilter,
    /// The previous page's `next`.
    pub cursor: Option<String>,
    /// The next page's `previous`: the page of newer rows before it.
    pub before: Option<String>,
    /// Rows per page.
    pub limit: i64,
}

/// What the listing needs of the configuration.
#[derive(Debug, Clone)]
pub struct ListOptions {
    /// Each read's bound (`database.statement_timeout`).
    pub statement_timeout: Duration,
    /// The sources an id is looked up under (Stripe's, Standard Webhooks', the consumer's, each
    /// `[sources.NAME]`).
    pub sources: Vec<String>,
    /// The source of a queued message that names none (`consumer.source`).
    pub default_source: String,
    /// Whether the transport is the database queue (the only one whose pending messages the
    /// store holds).
    pub database_queue: bool,
}

impl ListOptions {
    /// From the configuration: ids are looked up under every source an event can have here.
    pub fn from_settings(settings: &Settings) -> Self {
        let mut sources = vec![
            crate::stripe::SOURCE.to_owned(),
            settings.standard_webhooks.source.clone(),
            settings.consumer.source.clone(),
        ];
        sources.extend(settings.sources.keys().cloned());
        sources.sort();
        sources.dedup();
        ListOptions {
            statement_timeout: settings.database.statement_timeout,
            sources,
            default_source: settings.consumer.source.clone(),
            database_queue: settings.transport.kind == TransportKind::Database,
        }
    }
}

/// One listed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEvent {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    /// When it reached this outcome (processed, seen again, dead-lettered, held back,
    /// enqueued), Unix milliseconds.
    pub at_ms: i64,
    /// The kind's name, as `--outcome` takes it and `--json` prints it (scripts read it).
    pub outcome: &'static str,
    /// What the row shows people (a handled row's from its deliveries; `--json`'s `"story"`).
    pub story: Story,
}

impl ListedEvent {
    pub fn to_json(&self) -> Value {
        json!({
            "source": self.source, "event_id": self.event_id, "event_type": self.event_type,
            "at": time(self.at_ms), "outcome": self.outcome, "story": self.story.name(),
        })
    }
}

/// One page.
#[derive(Debug, Clone, Default)]
pub struct EventPage {
    pub events: Vec<ListedEvent>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
    /// The cursor of the page of newer rows (`before`); `None` on the first.
    pub previous: Option<String>,
    /// How many match, where that is cheap to count (`search.rs`).
    pub total: Option<Total>,
}

/// How many events a search matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Total {
    /// Exactly this many.
    Exactly(i64),
    /// More than the cap: at least this many.
    AtLeast(i64),
}

impl Total {
    /// As people read it: `12`, `1,000+`.
    pub fn shown(self) -> String {
        match self {
            Total::Exactly(n) => thousands(n),
            Total::AtLeast(n) => format!("{}+", thousands(n)),
        }
    }

    /// As `--json` prints it: `{"total": 12}` or `{"total_at_least": 1000}`.
    pub fn to_json(self) -> Value {
        match self {
            Total::Exactly(n) => json!({ "total": n }),
            Total::AtLeast(n) => json!({ "total_at_least": n }),
        }
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("the cursor {0:?} is not one this listing gave")]
    Cursor(String),
    #[error("reading the {} events", kind_name(*.kind))]
    Store {
        kind: ListedKind,
        #[source]
        source: StoreError,
    },
}

/// The most rows a page shows.
pub const MAX_PAGE: i64 = 500;

/// One page of events matching `query`.
pub async fn list_events(
    store: &Store,
    query: &EventQuery,
    options: &ListOptions,
) -> Result<EventPage, ListError> {
    let limit = query.limit.clamp(1, MAX_PAGE);
    let position = |cursor: Option<&str>| match cursor.filter(|c| !c.is_empty()) {
        Some(cursor) => parse_cursor(cursor)
            .map(Some)
            .ok_or_else(|| ListError::Cursor(cursor.into())),
        None => Ok(None),
    };
    let after = position(query.cursor.as_deref())?;
    // A page of newer rows: read nearest the cursor first, turned round below.
    let before = match after {
        Some(_) => None,
        None => position(query.before.as_deref())?,
    };
    let events = match query
        .id
        .as_deref()
        .map(str::trim)
        .filter(|id| !id.is_empty())
    {
        Some(id) => options
            .sources
            .iter()
            .map(|source| (dedup_key(source, id), source.clone(), id.to_owned()))
            .collect(),
        None => Vec::new(),
    };
    let filter = ListFilter {
        events,
        type_prefix: query.type_prefix.clone().filter(|p| !p.is_empty()),
        source: query.source.clone().filter(|s| !s.is_empty()),
        since_us: query.since_ms.map(|ms| ms.saturating_mul(1000)),
        until_us: query.until_ms.map(|ms| ms.saturating_mul(1000)),
        after,
        before,
        default_source: options.default_source.clone(),
    };
    let kinds: Vec<ListedKind> = match query.outcome {
        OutcomeFilter::Only(kind) => vec![kind],
        OutcomeFilter::Any => [
            ListedKind::Handled,
            ListedKind::Duplicate,
            ListedKind::DeadLetter,
            ListedKind::Stale,
            ListedKind::Pending,
        ]
        .into_iter()
        .filter(|kind| *kind != ListedKind::Pending || options.database_queue)
        .collect(),
    };
    let reads = kinds.iter().map(|&kind| {
        let filter = &filter;
        async move {
            bounded(
                options.statement_timeout,
                store.reads().list_events(kind, filter, limit + 1),
            )
            .await
            .map_err(|source| ListError::Store { kind, source })
        }
    });
    let mut rows: Vec<ListedRow> = futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let more = rows.len() as i64 > limit;
    let (next, previous) = if before.is_some() {
        rows.sort_by_key(|row| row.position);
        rows.truncate(limit as usize);
        rows.reverse();
        // Older rows exist (the cursor's own); newer ones if the page was cut.
        let next = rows.last().map(|row| cursor(&row.position));
        let previous = more
            .then(|| rows.first().map(|row| cursor(&row.position)))
            .flatten();
        (next, previous)
    } else {
        rows.sort_by_key(|row| std::cmp::Reverse(row.position));
        rows.truncate(limit as usize);
        let next = more
            .then(|| rows.last().map(|row| cursor(&row.position)))
            .flatten();
        let previous = after
            .and_then(|_| rows.first())
            .map(|row| cursor(&row.position));
        (next, previous)
    };
    let stories = super::story::stories_of_rows(store, &rows, options.statement_timeout).await?;
    Ok(EventPage {
        events: rows
            .into_iter()
            .zip(stories)
            .map(|(row, story)| ListedEvent {
                source: row.source,
                event_id: row.event_id,
                event_type: row.event_type,
                at_ms: row.position.at_us.div_euclid(1000),
                outcome: kind_name(row.kind),
                story,
            })
            .collect(),
        next,
        previous,
        total: None,
    })
}

/// A position as an opaque, URL-safe string: `TIME.KIND.TIE`.
fn cursor(position: &ListPosition) -> String {
    let tie = match position.tie {
        Tie::Key(key) => format!("k{}", hex::encode(key)),
        Tie::Id(id) => format!("i{id}"),
    };
    format!("{}.{}.{tie}", position.at_us, kind_name(position.kind))
}

fn parse_cursor(text: &str) -> Option<ListPosition> {
    let mut parts = text.splitn(3, '.');
    let at_us = parts.next()?.parse().ok()?;
    let kind = kind_by_name(parts.next()?)?;
    let tie = parts.next()?;
    // Handled ids and duplicates are ordered by their key, the other kinds by their row id.
    let tie = match kind {
        ListedKind::Handled | ListedKind::Duplicate => {
            Tie::Key(hex::decode(tie.strip_prefix('k')?).ok()?.try_into().ok()?)
        }
        _ => Tie::Id(tie.strip_prefix('i')?.parse().ok()?),
    };
    Some(ListPosition { at_us, kind, tie })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_the_position_it_was_made_of() {
        for position in [
            ListPosition {
                at_us: 1_796_119_200_123_456,
                kind: ListedKind::Handled,
                tie: Tie::Key([7; 16]),
            },
            ListPosition {
                at_us: -5,
                kind: ListedKind::DeadLetter,
                tie: Tie::Id(42),
            },
        ] {
            assert_eq!(parse_cursor(&cursor(&position)), Some(position));
        }
        for bad in [
            "",
            "1.handled",
            "x.handled.i1",
            "1.nope.i1",
            "1.handled.kzz",
            "1.stale.q1",
            "1.handled.i5",
            "1.stale.k00000000000000000000000000000000",
        ] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
    }

    #[test]
    fn outcome_names_parse_back() {
        for name in OutcomeFilter::NAMES {
            assert_eq!(
                OutcomeFilter::parse(name).map(OutcomeFilter::name),
                Some(name)
            );
        }
        assert_eq!(OutcomeFilter::parse("handed"), None);
    }
}
