//! The PostgreSQL forms of the bulk statements. Times are `timestamptz`: a filter's
//! milliseconds become one exactly (`'epoch' + n milliseconds`), and the type prefix is
//! `starts_with`, which no collation reorders.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Postgres, QueryBuilder};

use super::{list_columns, BulkRows, Requeued, RowFilter, CHUNK};
use crate::store::activity::count_cte_for;
use crate::store::postgres::{PG_DEDUP_KEY, PG_TODAYS_PARTITION};
use crate::store::{DeadLetter, Shard, StoreError, OUTBOX_CHANNEL};

/// `column` as Unix milliseconds.
fn ms(column: &str) -> String {
    format!("floor(extract(epoch FROM {column}) * 1000)::int8")
}

/// ` FROM table WHERE …`: the rows of `rows` the filter selects. The one WHERE clause of the
/// counts, the lists and the actions.
fn push_where(qb: &mut QueryBuilder<'_, Postgres>, rows: BulkRows, filter: &RowFilter) {
    qb.push(format!(" FROM {} WHERE {}", rows.table(), rows.status()));
    if let Some(prefix) = filter.type_prefix.as_deref().filter(|p| !p.is_empty()) {
        qb.push(" AND starts_with(event_type, ");
        qb.push_bind(prefix.to_owned()).push(")");
    }
    let time = rows.time_column();
    if let Some(since) = filter.since_ms {
        qb.push(format!(" AND {time} >= TIMESTAMPTZ 'epoch' + "));
        qb.push_bind(since).push(" * INTERVAL '1 millisecond'");
    }
    if let Some(until) = filter.until_ms {
        qb.push(format!(" AND {time} < TIMESTAMPTZ 'epoch' + "));
        qb.push_bind(until).push(" * INTERVAL '1 millisecond'");
    }
    if !filter.ids.is_empty() {
        qb.push(" AND id = ANY(")
            .push_bind(filter.ids.clone())
            .push(")");
    }
}

/// ` AND id > after AND id <= through ORDER BY id LIMIT limit`: one page of an action.
fn push_page(qb: &mut QueryBuilder<'_, Postgres>, after: i64, through: i64, limit: i64) {
    qb.push(" AND id > ").push_bind(after);
    qb.push(" AND id <= ").push_bind(through);
    qb.push(" ORDER BY id LIMIT ").push_bind(limit);
}

pub(super) async fn count_where(
    pool: &PgPool,
    rows: BulkRows,
    filter: &RowFilter,
) -> Result<i64, StoreError> {
    let mut qb = QueryBuilder::new("SELECT count(*)");
    push_where(&mut qb, rows, filter);
    Ok(qb.build_query_scalar().fetch_one(pool).await?)
}

pub(super) async fn dead_letters_where(
    pool: &PgPool,
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
    pool: &PgPool,
    rows: BulkRows,
    filter: &RowFilter,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<T>, StoreError>
where
    T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    let mut qb = QueryBuilder::new(list_columns(rows, ms));
    push_where(&mut qb, rows, filter);
    if let Some(before) = before_id {
        qb.push(" AND id < ").push_bind(before);
    }
    qb.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    Ok(qb.build_query_as().fetch_all(pool).await?)
}

/// One statement: the page's ids, then those still in the status moved (a row's status is
/// checked again as it is updated, so one a relay changed meanwhile is left alone). Then a
/// notification, which wakes every relay listening (as `insert_outbox`'s does).
pub(super) async fn requeue_chunk(
    pool: &PgPool,
    rows: BulkRows,
    filter: &RowFilter,
    after: i64,
    through: i64,
    actor: &str,
) -> Result<Requeued, StoreError> {
    let mut qb = QueryBuilder::new("WITH page AS (SELECT id");
    push_where(&mut qb, rows, filter);
    push_page(&mut qb, after, through, CHUNK);
    qb.push(format!(
        "), moved AS (UPDATE outbox SET {}, next_attempt_at = now() \
         WHERE {} AND id IN (SELECT id FROM page) RETURNING id, source, event_id, sink), \
         recorded AS (INSERT INTO outbox_attempts (event_key, outbox_id, attempt, kind, lane, actor) \
         SELECT {PG_DEDUP_KEY}, id, 0, '{}', sink, ",
        rows.requeue_set(),
        rows.status(),
        rows.requeue_kind(),
    ));
    qb.push_bind(actor.to_owned());
    let counted = count_cte_for(
        "counted",
        &format!(
            "SELECT '{}', count(*) FROM moved",
            rows.requeue_series().name()
        ),
        Shard::random(),
    );
    qb.push(format!(
        " FROM moved WHERE {PG_TODAYS_PARTITION} RETURNING 1), {counted} \
         SELECT (SELECT count(*) FROM moved), (SELECT max(id) FROM page)"
    ));
    let (moved, last_id): (i64, Option<i64>) = qb.build_query_as().fetch_one(pool).await?;
    if moved > 0 {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(OUTBOX_CHANNEL)
            .execute(pool)
            .await?;
    }
    Ok(Requeued {
        moved: u64::try_from(moved).unwrap_or(0),
        last_id,
    })
}
