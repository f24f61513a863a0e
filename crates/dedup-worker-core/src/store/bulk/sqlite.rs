//! The SQLite forms of the bulk statements. Times are Unix milliseconds already; the type
//! prefix is a range of the BINARY collation (`event_type >= prefix AND < its end`), which the
//! planner can use where an index leads with the type, and which, unlike LIKE, treats `%` and
//! `_` as themselves and is case-sensitive.

use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, QueryBuilder, Sqlite, SqlitePool};

use super::{list_columns, prefix_end, BulkRows, Requeued, RowFilter, CHUNK};
use crate::store::activity::add_sqlite;
use crate::store::sqlite::begin_immediate;
use crate::store::{dedup_key, now_ms, Counts, DeadLetter, Shard, StoreError};

/// `column` in Unix milliseconds: as it is.
fn ms(column: &str) -> String {
    column.to_owned()
}

/// ` FROM table WHERE …`: the rows of `rows` the filter selects. The one WHERE clause of the
/// counts, the lists and the actions.
fn push_where(qb: &mut QueryBuilder<'_, Sqlite>, rows: BulkRows, filter: &RowFilter) {
    qb.push(format!(" FROM {} WHERE {}", rows.table(), rows.status()));
    if let Some(prefix) = filter.type_prefix.as_deref().filter(|p| !p.is_empty()) {
        qb.push(" AND event_type >= ").push_bind(prefix.to_owned());
        if let Some(end) = prefix_end(prefix) {
            qb.push(" AND event_type < ").push_bind(end);
        }
    }
    let time = rows.time_column();
    if let Some(since) = filter.since_ms {
        qb.push(format!(" AND {time} >= ")).push_bind(since);
    }
    if let Some(until) = filter.until_ms {
        qb.push(format!(" AND {time} < ")).push_bind(until);
    }
    if !filter.ids.is_empty() {
        // The id list travels as one JSON array parameter, whatever its length.
        let list = serde_json::to_string(&filter.ids).unwrap_or_else(|_| "[]".into());
        qb.push(" AND id IN (SELECT value FROM json_each(");
        qb.push_bind(list).push("))");
    }
}

/// ` AND id > after AND id <= through ORDER BY id LIMIT limit`: one page of an action.
fn push_page(qb: &mut QueryBuilder<'_, Sqlite>, after: i64, through: i64, limit: i64) {
    qb.push(" AND id > ").push_bind(after);
    qb.push(" AND id <= ").push_bind(through);
    qb.push(" ORDER BY id LIMIT ").push_bind(limit);
}

pub(super) async fn count_where(
    pool: &SqlitePool,
    rows: BulkRows,
    filter: &RowFilter,
) -> Result<i64, StoreError> {
    let mut qb = QueryBuilder::new("SELECT count(*)");
    push_where(&mut qb, rows, filter);
    Ok(qb.build_query_scalar().fetch_one(pool).await?)
}

pub(super) async fn dead_letters_where(
    pool: &SqlitePool,
    filter: &RowFilter,
    after: i64,
    through: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    let mut qb = QueryBuilder::new(
        "SELECT id, source, event_id, event_type, queue, payload, error, attempts",
    );
    push_where(&mut qb, BulkRows::DeadLetters, filter);
    push_page(&mut qb, after, through, limit);
    Ok(qb.build_query_as().fetch_all(pool).await?)
}

pub(super) async fn list_where<T>(
    pool: &SqlitePool,
    rows: BulkRows,
    filter: &RowFilter,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<T>, StoreError>
where
    T: for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
{
    let mut qb = QueryBuilder::new(list_columns(rows, ms));
    push_where(&mut qb, rows, filter);
    if let Some(before) = before_id {
        qb.push(" AND id < ").push_bind(before);
    }
    qb.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    Ok(qb.build_query_as().fetch_all(pool).await?)
}

/// One transaction (SQLite has one writer: the page cannot change under it): the update, then
/// the act recorded on each row moved. No relay in another process hears of it: they find the
/// rows at their next poll.
pub(super) async fn requeue_chunk(
    pool: &SqlitePool,
    rows: BulkRows,
    filter: &RowFilter,
    after: i64,
    through: i64,
    actor: &str,
) -> Result<Requeued, StoreError> {
    let mut qb = QueryBuilder::new(format!(
        "UPDATE outbox SET {}, next_attempt_at = ",
        rows.requeue_set()
    ));
    qb.push_bind(now_ms()).push(" WHERE id IN (SELECT id");
    push_where(&mut qb, rows, filter);
    push_page(&mut qb, after, through, CHUNK);
    qb.push(") RETURNING id, source, event_id, sink");
    let mut tx = begin_immediate(pool).await?;
    let moved: Vec<(i64, String, String, String)> = qb.build_query_as().fetch_all(&mut *tx).await?;
    let at = now_ms();
    // Seven parameters a row: 80 rows a statement, well within SQLite's bound.
    for chunk in moved.chunks(80) {
        let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO outbox_attempts (at, event_key, outbox_id, attempt, kind, lane, actor) ",
        );
        insert.push_values(chunk, |mut b, (id, source, event_id, sink)| {
            b.push_bind(at)
                .push_bind(dedup_key(source, event_id).to_vec())
                .push_bind(*id)
                .push_bind(0)
                .push_bind(rows.requeue_kind())
                .push_bind(sink.as_str())
                .push_bind(actor);
        });
        insert.build().execute(&mut *tx).await?;
    }
    let counts = Counts::of(rows.requeue_series(), moved.len());
    add_sqlite(&mut tx, at, &counts, Shard::random()).await?;
    tx.commit().await?;
    Ok(Requeued {
        moved: moved.len() as u64,
        last_id: moved.iter().map(|m| m.0).max(),
    })
}
