//! Kept bodies found by what they are about ([`Reads::search_bodies`]): a customer, an object
//! id, an event id prefix, each served by its own index of `event_bodies`
//! (`event_bodies_customer`, `event_bodies_object`, `event_bodies_event`), newest first in
//! keyset pages by `(kept_at, key)`; and how many match, counted up to a cap
//! ([`Reads::count_bodies`]).
//!
//! On PostgreSQL the table is partitioned by day and each partition has the three indexes, so
//! `ORDER BY kept_at DESC … LIMIT n` is an ordered append over the partitions, newest first,
//! stopping at the page. Dead letters are not searched here: their rows keep no search fields.

use sqlx::Row;

use super::list::query::{prefix_range, Param, Query};
use super::Reads;
use crate::store::{Pool, StoreError};

/// A kept body's place in the search's order: newer first, then by dedup key, both descending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BodyPosition {
    /// `kept_at` in Unix µs (SQLite keeps ms: its values are those times 1,000).
    pub at_us: i64,
    /// The event's dedup key: orders the bodies of one batch (one `kept_at`).
    pub key: [u8; 16],
}

/// Which page of the search: the first, the rows after a position (older) or before it (newer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyPage {
    /// The newest rows.
    #[default]
    First,
    /// Rows older than this one (the "Older →" link: the previous page's last row).
    Older(BodyPosition),
    /// Rows newer than this one (the "← Newer" link: the page's first row), nearest first.
    Newer(BodyPosition),
}

/// What to search: every field set must hold. At least one of `customer`, `object` and
/// `id_prefix` is set by the caller (`inspect::search`), so an index bounds the read.
#[derive(Debug, Clone, Default)]
pub struct BodySearch {
    /// The customer kept beside the body (`search.customer_pointer`), exact.
    pub customer: Option<String>,
    /// The object id kept beside the body (`search.object_pointer`), exact.
    pub object: Option<String>,
    /// Event ids starting with this.
    pub id_prefix: Option<String>,
    /// Types starting with this.
    pub type_prefix: Option<String>,
    /// Only this source's events.
    pub source: Option<String>,
    /// At or after (µs).
    pub since_us: Option<i64>,
    /// Before (µs).
    pub until_us: Option<i64>,
    /// Which page.
    pub page: BodyPage,
}

/// One event found by its kept body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundBody {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub position: BodyPosition,
}

impl Query {
    /// The search's conditions (fields, range, page), as one `WHERE`.
    fn body_conditions(&mut self, search: &BodySearch) -> String {
        let mut conds = Vec::new();
        if let Some(customer) = &search.customer {
            let customer = self.bind(Param::Text(customer.clone()));
            conds.push(format!("customer = {customer}"));
        }
        if let Some(object) = &search.object {
            let object = self.bind(Param::Text(object.clone()));
            conds.push(format!("object_id = {object}"));
        }
        if let Some(prefix) = &search.id_prefix {
            conds.extend(prefix_range(self, "event_id", prefix));
        }
        if let Some(prefix) = &search.type_prefix {
            conds.extend(prefix_range(self, "event_type", prefix));
        }
        if let Some(source) = &search.source {
            let source = self.bind(Param::Text(source.clone()));
            conds.push(format!("source = {source}"));
        }
        if let Some(since) = search.since_us {
            conds.push(format!("kept_at >= {}", self.time(since)));
        }
        if let Some(until) = search.until_us {
            conds.push(format!("kept_at < {}", self.time(until)));
        }
        let (position, op) = match search.page {
            BodyPage::First => (None, ""),
            BodyPage::Older(position) => (Some(position), "<"),
            BodyPage::Newer(position) => (Some(position), ">"),
        };
        if let Some(position) = position {
            let at = self.time(position.at_us);
            let key = self.bind(Param::Key(position.key));
            conds.push(format!("(kept_at, key) {op} ({at}, {key})"));
        }
        if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        }
    }
}

impl Reads<'_> {
    /// Up to `limit` bodies matching `search`, newest first (a [`BodyPage::Newer`] page too:
    /// it is read oldest first, to stop at the page, and turned round here).
    pub async fn search_bodies(
        self,
        search: &BodySearch,
        limit: i64,
    ) -> Result<Vec<FoundBody>, StoreError> {
        let postgres = matches!(self.pool, Pool::Postgres(_));
        let mut query = Query {
            postgres,
            params: Vec::new(),
        };
        let conditions = query.body_conditions(search);
        let at = query.at_us("kept_at");
        let order = match search.page {
            BodyPage::Newer(_) => "ASC",
            _ => "DESC",
        };
        let sql = format!(
            "SELECT source, event_id, event_type, {at} AS at_us, key FROM event_bodies
               {conditions} ORDER BY kept_at {order}, key {order} LIMIT {}",
            limit.max(0)
        );
        let mut found = match self.pool {
            Pool::Postgres(pool) => query
                .postgres_query(&sql)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| {
                    let key = *row.try_get::<uuid::Uuid, _>(4)?.as_bytes();
                    found(&row, key)
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?,
            Pool::Sqlite(pool) => query
                .sqlite_query(&sql)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| {
                    let key: Vec<u8> = row.try_get(4)?;
                    found(&row, key.try_into().unwrap_or([0; 16]))
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?,
        };
        if matches!(search.page, BodyPage::Newer(_)) {
            found.reverse();
        }
        Ok(found)
    }

    /// How many bodies match `search` (its page ignored), counted up to `cap`: the index's
    /// entries are read, never a body, and never more than `cap` of them.
    pub async fn count_bodies(self, search: &BodySearch, cap: i64) -> Result<i64, StoreError> {
        let postgres = matches!(self.pool, Pool::Postgres(_));
        let mut query = Query {
            postgres,
            params: Vec::new(),
        };
        let whole = BodySearch {
            page: BodyPage::First,
            ..search.clone()
        };
        let conditions = query.body_conditions(&whole);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM event_bodies {conditions} LIMIT {}) c",
            cap.max(0)
        );
        let count: i64 = match self.pool {
            Pool::Postgres(pool) => query
                .postgres_query(&sql)
                .fetch_one(pool)
                .await?
                .try_get(0)?,
            Pool::Sqlite(pool) => query.sqlite_query(&sql).fetch_one(pool).await?.try_get(0)?,
        };
        Ok(count)
    }
}

fn found<R: Row>(row: &R, key: [u8; 16]) -> Result<FoundBody, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(FoundBody {
        source: row.try_get(0)?,
        event_id: row.try_get(1)?,
        event_type: row.try_get(2)?,
        position: BodyPosition {
            at_us: row.try_get(3)?,
            key,
        },
    })
}
