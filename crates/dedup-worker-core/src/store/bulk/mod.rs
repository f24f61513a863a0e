//! The operator's bulk statements (issue 28): [`Bulk`], reached as `store.bulk()`. Dead letters
//! and outbox rows selected by a [`RowFilter`], counted (the dry run), listed newest first,
//! paged through for a redrive, and put back to `pending` for the relay (a retry of failed
//! deliveries, a re-send of dispatched ones). The statements are built, not written out: each
//! store builds the filter's WHERE clause in one function (`push_where` in `postgres.rs` and
//! `sqlite.rs`, the two forms of each statement beside it), which the count, the list and the
//! action all call: the dry run counts exactly the rows the action takes.
//!
//! Every statement is bounded: lists and pages by `limit`, actions by chunks of [`CHUNK`] rows,
//! each chunk its own short statement. An action also stops at the newest row that existed
//! when it began (`through`): rows written while it runs (a redriven event dead-lettered again,
//! a re-sent row dispatched again) are not taken a second time.

use super::{DeadLetter, Pool, Series, StoreError};

/// Rows an action moves per statement.
pub(crate) const CHUNK: i64 = 1000;

/// What a bulk action or a list applies to. Times are Unix milliseconds, `since` inclusive,
/// `until` exclusive; `type_prefix` matches event types starting with it (an exact type is its
/// own prefix); `ids` non-empty restricts to those row ids. Serialized without its unset parts
/// (`{}` is every row), as `admin_actions.filter` records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<i64>,
}

impl RowFilter {
    /// Whether the filter restricts anything (an empty prefix matches every type).
    pub fn is_empty(&self) -> bool {
        self.type_prefix.as_deref().is_none_or(str::is_empty)
            && self.since_ms.is_none()
            && self.until_ms.is_none()
            && self.ids.is_empty()
    }
}

/// The rows a filter applies to: which table, which status, and which time it bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkRows {
    /// `dead_letters`, by `created_at`.
    DeadLetters,
    /// Outbox rows with status `failed`, by `created_at`.
    FailedDeliveries,
    /// Outbox rows with status `dispatched`, by `dispatched_at`.
    DispatchedDeliveries,
}

impl BulkRows {
    fn table(self) -> &'static str {
        match self {
            BulkRows::DeadLetters => "dead_letters",
            BulkRows::FailedDeliveries | BulkRows::DispatchedDeliveries => "outbox",
        }
    }

    /// The condition every selected row meets, whatever the filter.
    fn status(self) -> &'static str {
        match self {
            BulkRows::DeadLetters => "TRUE",
            BulkRows::FailedDeliveries => "status = 'failed'",
            BulkRows::DispatchedDeliveries => "status = 'dispatched'",
        }
    }

    fn time_column(self) -> &'static str {
        match self {
            BulkRows::DeadLetters | BulkRows::FailedDeliveries => "created_at",
            BulkRows::DispatchedDeliveries => "dispatched_at",
        }
    }

    /// What putting a row back to `pending` sets (besides the status): a first attempt, due
    /// now, under no claim, so a mark retried by a relay under the claim that delivered the row
    /// before (see `mark_dispatched`) cannot mark it again. A retry keeps `last_error` until the
    /// next attempt; a re-send also forgets when the row was dispatched.
    /// The timeline's name of a requeue (`outbox_attempts.kind`).
    fn requeue_kind(self) -> &'static str {
        match self {
            BulkRows::DispatchedDeliveries => "resend",
            BulkRows::DeadLetters | BulkRows::FailedDeliveries => "retry",
        }
    }

    /// What a requeue of these rows counts in the minute's counts (`activity_minutes`).
    fn requeue_series(self) -> Series {
        match self {
            BulkRows::DispatchedDeliveries => Series::Resent,
            BulkRows::DeadLetters | BulkRows::FailedDeliveries => Series::Retried,
        }
    }

    fn requeue_set(self) -> &'static str {
        match self {
            BulkRows::DeadLetters => unreachable!("dead letters are redriven, not requeued"),
            // A retried row holds its key again (an ordered lane's successors wait for it).
            BulkRows::FailedDeliveries => {
                "status = 'pending', attempts = 0, claim_token = NULL, skipped_at = NULL, skipped_by = NULL"
            }
            BulkRows::DispatchedDeliveries => {
                "status = 'pending', attempts = 0, claim_token = NULL, dispatched_at = NULL"
            }
        }
    }
}

/// One dead letter in a list (without its payload).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct DeadLetterListing {
    pub id: i64,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub queue: String,
    pub error: String,
    pub attempts: i32,
    pub created_at_ms: i64,
}

/// One outbox row in a list (without its payload).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct DeliveryListing {
    pub id: i64,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    /// `None`: the configured default sink.
    pub destination: Option<String>,
    pub idempotency_key: String,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub dispatched_at_ms: Option<i64>,
}

/// One chunk of a requeue: the rows moved, and the last id the chunk looked at (the next
/// chunk starts after it; `None`: nothing was left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requeued {
    pub moved: u64,
    pub last_id: Option<i64>,
}

/// The operator's bulk selections of dead letters and outbox rows by a [`RowFilter`]: counted,
/// listed, paged through for a redrive, and put back to `pending` (see the module).
#[derive(Debug, Clone, Copy)]
pub struct Bulk<'a> {
    pub(super) pool: &'a Pool,
}

impl Bulk<'_> {
    /// How many `rows` the filter selects (what the action would take now).
    pub async fn count_where(self, rows: BulkRows, filter: &RowFilter) -> Result<u64, StoreError> {
        let count: i64 = match self.pool {
            Pool::Postgres(pool) => postgres::count_where(pool, rows, filter).await?,
            Pool::Sqlite(pool) => sqlite::count_where(pool, rows, filter).await?,
        };
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// The newest id of `rows`' table (0 when empty): an action takes nothing newer.
    pub async fn newest_id(self, rows: BulkRows) -> Result<i64, StoreError> {
        let sql = format!("SELECT coalesce(max(id), 0) FROM {}", rows.table());
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_scalar(&sql).fetch_one(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_scalar(&sql).fetch_one(pool).await?,
        })
    }

    /// Up to `limit` dead letters the filter selects with an id in `(after, through]`, in id
    /// order, payload included (a redrive pages through them).
    pub async fn dead_letters_where(
        self,
        filter: &RowFilter,
        after: i64,
        through: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                postgres::dead_letters_where(pool, filter, after, through, limit).await
            }
            Pool::Sqlite(pool) => {
                sqlite::dead_letters_where(pool, filter, after, through, limit).await
            }
        }
    }

    /// Up to `limit` dead letters the filter selects, newest first, below `before_id`.
    pub async fn list_dead_letters_where(
        self,
        filter: &RowFilter,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadLetterListing>, StoreError> {
        let rows = BulkRows::DeadLetters;
        match self.pool {
            Pool::Postgres(pool) => {
                postgres::list_where(pool, rows, filter, before_id, limit).await
            }
            Pool::Sqlite(pool) => sqlite::list_where(pool, rows, filter, before_id, limit).await,
        }
    }

    /// Up to `limit` outbox rows of `rows` the filter selects, newest first, below `before_id`.
    pub async fn list_deliveries_where(
        self,
        rows: BulkRows,
        filter: &RowFilter,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryListing>, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                postgres::list_where(pool, rows, filter, before_id, limit).await
            }
            Pool::Sqlite(pool) => sqlite::list_where(pool, rows, filter, before_id, limit).await,
        }
    }

    /// Puts up to `CHUNK` (1,000) outbox rows of `rows` the filter selects with an id in
    /// `(after, through]` back to `pending`, due now, in id order, and records the act on each
    /// in the event's timeline (`outbox_attempts`: `retry` or `resend`, by `actor`), which keeps
    /// every earlier attempt although the row's count starts again; on PostgreSQL the same
    /// statement notifies the relays (`OUTBOX_CHANNEL`), so they deliver them at once.
    pub async fn requeue_chunk(
        self,
        rows: BulkRows,
        filter: &RowFilter,
        after: i64,
        through: i64,
        actor: &str,
    ) -> Result<Requeued, StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                postgres::requeue_chunk(pool, rows, filter, after, through, actor).await
            }
            Pool::Sqlite(pool) => {
                sqlite::requeue_chunk(pool, rows, filter, after, through, actor).await
            }
        }
    }
}

/// The columns of a list of `rows`, each time as Unix milliseconds through `ms` (the stores
/// keep times differently).
fn list_columns(rows: BulkRows, ms: fn(&str) -> String) -> String {
    match rows {
        BulkRows::DeadLetters => format!(
            "SELECT id, source, event_id, event_type, queue, error, attempts, {} AS created_at_ms",
            ms("created_at")
        ),
        BulkRows::FailedDeliveries | BulkRows::DispatchedDeliveries => format!(
            "SELECT id, source, event_id, event_type, destination, idempotency_key, status, \
             attempts, last_error, {} AS created_at_ms, {} AS dispatched_at_ms",
            ms("created_at"),
            ms("dispatched_at")
        ),
    }
}

/// The next string after every string starting with `prefix` in byte order (SQLite's BINARY
/// collation; UTF-8 orders as code points do): `prefix` with its last character incremented,
/// trailing characters that cannot be dropped first. `None`: no upper bound.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The PostgreSQL forms.
mod postgres;

/// The SQLite forms.
mod sqlite;

#[cfg(test)]
mod tests {
    use super::{prefix_end, RowFilter};

    #[test]
    fn the_end_of_a_prefix_is_its_last_character_incremented() {
        assert_eq!(prefix_end("invoice.").as_deref(), Some("invoice/"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }

    #[test]
    fn a_filter_serializes_without_its_unset_parts() {
        let filter = RowFilter {
            type_prefix: Some("invoice.".into()),
            since_ms: Some(5),
            ..RowFilter::default()
        };
        let json = serde_json::to_string(&filter).unwrap();
        assert_eq!(json, r#"{"type_prefix":"invoice.","since_ms":5}"#);
        assert_eq!(serde_json::to_string(&RowFilter::default()).unwrap(), "{}");
    }
}
