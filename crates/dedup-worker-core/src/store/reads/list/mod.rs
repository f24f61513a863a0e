//! Events by outcome, type prefix and time, newest first, in keyset pages
//! ([`Reads::list_events`]): what the console's `/events` and `dedup-worker events list` read.
//!
//! Each outcome is its own table, so one outcome is one query: handled ids in the generation
//! tables (by `processed_at`, ties by key), duplicate deliveries (by `seen_at`, with their event
//! from the generation that holds its id), dead letters (`created_at`, ties by id), the stale
//! guard's records (`recorded_at`) and the database queue's messages (`enqueued_at`). Every one
//! has an index on its time (migrations `20261230…_console*`), so a page reads about as many
//! index entries as it shows, plus what a type filter skips. The caller merges outcomes.
//!
//! Times here are Unix microseconds: PostgreSQL keeps microseconds, and a cursor rounded to
//! milliseconds would skip or repeat rows of one batch (one transaction, one `now()`). SQLite
//! keeps milliseconds; its values are those times 1,000.
//!
//! The legacy table of processed ids (before the ring) is not listed: it only drains, and
//! `events show` still finds its ids.

use sqlx::Row;

pub(super) mod query;

use query::{direction, generations, where_clause, Param, Query};

use super::Reads;
use crate::store::dedup::RING_SLOTS;
use crate::store::{Pool, StoreError};

/// What a listed row is, in the order rows of one time are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ListedKind {
    Handled,
    Duplicate,
    DeadLetter,
    Stale,
    Pending,
}

/// What orders rows of one kind and one time: the dedup key, or the row's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tie {
    Key([u8; 16]),
    Id(i64),
}

/// A row's place in a listing: newer first, then by kind, then by tie, each descending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListPosition {
    pub at_us: i64,
    pub kind: ListedKind,
    pub tie: Tie,
}

/// One listed row.
#[derive(Debug, Clone)]
pub struct ListedRow {
    pub kind: ListedKind,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub position: ListPosition,
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only these events, as `(dedup key, source, event id)`: a search by id, one per source.
    pub events: Vec<([u8; 16], String, String)>,
    /// Types starting with this.
    pub type_prefix: Option<String>,
    /// Only events of this source (a named source's name, `stripe`, …).
    pub source: Option<String>,
    /// At or after (µs).
    pub since_us: Option<i64>,
    /// Before (µs).
    pub until_us: Option<i64>,
    /// Rows after this one in the listing's order (the previous page's last).
    pub after: Option<ListPosition>,
    /// Rows before this one in the listing's order (the next page's first), read nearest it
    /// first (ascending); ignored with `after`.
    pub before: Option<ListPosition>,
    /// The source of a queued message that names none (`consumer.source`).
    pub default_source: String,
}

impl Query {
    fn handled(&mut self, filter: &ListFilter, limit: i64) -> String {
        let dir = direction(filter);
        let at = self.at_us("processed_at");
        let mut branches = Vec::new();
        for slot in 0..RING_SLOTS {
            let mut conds = self.conditions(
                filter,
                ListedKind::Handled,
                ("processed_at", "key", "event_type"),
            );
            conds.extend(self.events_by_key(filter, "key"));
            conds.extend(self.of_source(filter, "source"));
            // Each branch ordered and limited by its own index; the outer sort merges them.
            branches.push(format!(
                "SELECT * FROM (SELECT source, event_id, event_type, {at} AS at_us, key
                   FROM processed_events_{slot} {} ORDER BY processed_at {dir}, key {dir} LIMIT {limit}) b{slot}",
                where_clause(&conds)
            ));
        }
        format!(
            "SELECT * FROM ({}) u ORDER BY at_us {dir}, key {dir} LIMIT {limit}",
            branches.join(" UNION ALL ")
        )
    }

    /// A page of duplicate deliveries, chosen by their own time and type, then each one's
    /// event looked up (a primary-key probe per generation, for the page's rows only). A
    /// duplicate whose id has left the window keeps its place, with an empty id.
    fn duplicates(&mut self, filter: &ListFilter, limit: i64) -> String {
        let dir = direction(filter);
        let mut conds = self.conditions(
            filter,
            ListedKind::Duplicate,
            ("d.seen_at", "d.key", "d.event_type"),
        );
        conds.extend(self.events_by_key(filter, "d.key"));
        conds.extend(self.duplicate_of_source(filter));
        let at = self.at_us("d.seen_at");
        let deliveries = if self.postgres {
            "duplicate_deliveries".to_owned()
        } else {
            let all = (0..RING_SLOTS)
                .map(|slot| {
                    format!("SELECT key, seen_at, event_type FROM duplicate_deliveries_{slot}")
                })
                .collect::<Vec<_>>()
                .join(" UNION ALL ");
            format!("({all})")
        };
        let page = format!(
            "SELECT key, seen_at, event_type FROM {deliveries} d {}
              ORDER BY seen_at {dir}, key {dir} LIMIT {limit}",
            where_clause(&conds)
        );
        let columns = "key, source, event_id, event_type";
        let joined = if self.postgres {
            let lookups = (0..RING_SLOTS)
                .map(|slot| {
                    format!("SELECT {columns} FROM processed_events_{slot} WHERE key = d.key")
                })
                .collect::<Vec<_>>()
                .join(" UNION ALL ");
            format!("({page}) d LEFT JOIN LATERAL ({lookups} LIMIT 1) p ON true")
        } else {
            format!(
                "({page}) d LEFT JOIN ({}) p ON p.key = d.key",
                generations(columns)
            )
        };
        format!(
            "SELECT coalesce(p.source, '') AS source, coalesce(p.event_id, '') AS event_id,
                    coalesce(d.event_type, p.event_type, '') AS event_type, {at} AS at_us, d.key
               FROM {joined} ORDER BY d.seen_at {dir}, d.key {dir}"
        )
    }

    /// Dead letters or stale records: a table with an id, a source, an event id and a type.
    fn by_id(
        &mut self,
        filter: &ListFilter,
        limit: i64,
        kind: ListedKind,
        (table, time): (&str, &str),
    ) -> String {
        let dir = direction(filter);
        let mut conds = self.conditions(filter, kind, (time, "id", "event_type"));
        conds.extend(self.events_by_id(filter, "event_id", Some("source")));
        conds.extend(self.of_source(filter, "source"));
        let at = self.at_us(time);
        format!(
            "SELECT source, event_id, event_type, {at} AS at_us, id FROM {table}
               {} ORDER BY {time} {dir}, id {dir} LIMIT {limit}",
            where_clause(&conds)
        )
    }

    fn pending(&mut self, filter: &ListFilter, limit: i64) -> String {
        let dir = direction(filter);
        let source = self.bind(Param::Text(filter.default_source.clone()));
        let mut conds = self.conditions(
            filter,
            ListedKind::Pending,
            ("enqueued_at", "id", "coalesce(message_type, '')"),
        );
        conds.extend(self.events_by_id(filter, "message_id", None));
        let of_source = format!("coalesce(source, {source})");
        conds.extend(self.of_source(filter, &of_source));
        let at = self.at_us("enqueued_at");
        format!(
            "SELECT coalesce(source, {source}) AS source, coalesce(message_id, '') AS event_id,
                    coalesce(message_type, '') AS event_type, {at} AS at_us, id
               FROM queue_messages {} ORDER BY enqueued_at {dir}, id {dir} LIMIT {limit}",
            where_clause(&conds)
        )
    }
}

impl Reads<'_> {
    /// Up to `limit` rows of `kind` matching `filter`, in the listing's order.
    pub async fn list_events(
        self,
        kind: ListedKind,
        filter: &ListFilter,
        limit: i64,
    ) -> Result<Vec<ListedRow>, StoreError> {
        let postgres = matches!(self.pool, Pool::Postgres(_));
        let mut query = Query {
            postgres,
            params: Vec::new(),
        };
        let limit = limit.max(0);
        let sql = match kind {
            ListedKind::Handled => query.handled(filter, limit),
            ListedKind::Duplicate => query.duplicates(filter, limit),
            ListedKind::DeadLetter => {
                query.by_id(filter, limit, kind, ("dead_letters", "created_at"))
            }
            ListedKind::Stale => query.by_id(filter, limit, kind, ("stale_events", "recorded_at")),
            ListedKind::Pending => query.pending(filter, limit),
        };
        let keyed = matches!(kind, ListedKind::Handled | ListedKind::Duplicate);
        let rows = match self.pool {
            Pool::Postgres(pool) => query
                .postgres_query(&sql)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| {
                    let tie = if keyed {
                        Tie::Key(*row.try_get::<uuid::Uuid, _>(4)?.as_bytes())
                    } else {
                        Tie::Id(row.try_get(4)?)
                    };
                    listed(
                        kind,
                        tie,
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                    )
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?,
            Pool::Sqlite(pool) => query
                .sqlite_query(&sql)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| {
                    let tie = if keyed {
                        let key: Vec<u8> = row.try_get(4)?;
                        Tie::Key(key.try_into().unwrap_or([0; 16]))
                    } else {
                        Tie::Id(row.try_get(4)?)
                    };
                    listed(
                        kind,
                        tie,
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                    )
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?,
        };
        Ok(rows)
    }
}

fn listed(
    kind: ListedKind,
    tie: Tie,
    source: String,
    event_id: String,
    event_type: String,
    at_us: i64,
) -> Result<ListedRow, sqlx::Error> {
    Ok(ListedRow {
        kind,
        source,
        event_id,
        event_type,
        position: ListPosition { at_us, kind, tie },
    })
}
