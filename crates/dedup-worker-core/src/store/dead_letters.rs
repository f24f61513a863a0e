//! The dead letters (`dead_letters`, and `dead_letter_redrives`, the record of those redriven):
//! [`DeadLetters`], reached as `store.dead_letters()`, and [`insert`] and [`lock`], the batch
//! transaction's writes ([`StoreTx`] calls them). Each statement is here once, or its
//! PostgreSQL and its SQLite form side by side in one `match` where they differ. (The
//! operator's bulk selections are in `bulk/`, `events show`'s reads in `reads/trail.rs`.)

use super::activity::{self, count_cte_from};
use super::postgres::DEAD_LETTER_LOCK_CLASS;
use super::sqlite::begin_immediate;
use super::{
    now_ms, Counts, DeadLetter, NewDeadLetter, Pool, RedriveRecord, Series, Shard, StoreError,
    StoreTx,
};

/// The events not handled: dead letters written in the batch transaction, listed, selected for
/// a redrive, deleted after it (`redrive` records where each went).
#[derive(Debug, Clone, Copy)]
pub struct DeadLetters<'a> {
    pub(super) pool: &'a Pool,
}

/// Writes one dead letter in the batch transaction; with `once`, only if no dead letter of the
/// same event (source and a non-empty id) on the same queue is there already. Returns the rows
/// inserted.
pub(super) async fn insert(
    tx: &mut StoreTx,
    row: &NewDeadLetter,
    once: bool,
) -> Result<u64, StoreError> {
    Ok(match tx {
        StoreTx::Postgres(tx) => {
            if once && !row.event_id.is_empty() {
                // The check below reads committed rows only: two batches moving one event at
                // once (SQS handed its message to two receivers) would each find none and each
                // insert. Locked per event until commit, the second one's check sees the first's
                // row. A hash collision only makes two events wait for each other.
                sqlx::query(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2 || ' ' || $3 || ' ' || $4))",
                )
                .bind(DEAD_LETTER_LOCK_CLASS)
                .bind(&row.source)
                .bind(&row.queue)
                .bind(&row.event_id)
                .execute(&mut **tx)
                .await?;
            }
            sqlx::query(
            "INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts)
             SELECT $1, $2, $3, $4, $5, $6, $7
              WHERE NOT ($8 AND $2 <> '' AND EXISTS (
                    SELECT 1 FROM dead_letters WHERE source = $1 AND event_id = $2 AND queue = $4))",
            )
            .bind(&row.source)
            .bind(&row.event_id)
            .bind(&row.event_type)
            .bind(&row.queue)
            .bind(&row.payload)
            .bind(&row.error)
            .bind(row.attempts)
            .bind(once)
            .execute(&mut **tx)
            .await?
            .rows_affected()
        }
        // No lock of its own: SQLite has one writer at a time.
        StoreTx::Sqlite(tx, _) => sqlx::query(
            "INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts, created_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8
              WHERE NOT ($9 AND $2 <> '' AND EXISTS (
                    SELECT 1 FROM dead_letters WHERE source = $1 AND event_id = $2 AND queue = $4))",
        )
        .bind(&row.source)
        .bind(&row.event_id)
        .bind(&row.event_type)
        .bind(&row.queue)
        .bind(&row.payload)
        .bind(&row.error)
        .bind(row.attempts)
        .bind(now_ms())
        .bind(once)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
    })
}

/// Takes the once-only locks of all of `rows` (as [`insert`] takes one), in the order of the
/// lock keys, whatever order the batch's events failed in: two batches dead-lettering the same
/// events in opposite orders would otherwise each hold one lock and wait for the other's
/// (PostgreSQL ends one with `deadlock detected`). The keys are the ones `insert` computes, so
/// its own lock is then held already. SQLite takes no locks of its own: one writer at a time.
pub(super) async fn lock(tx: &mut StoreTx, rows: &[NewDeadLetter]) -> Result<(), StoreError> {
    let StoreTx::Postgres(tx) = tx else {
        return Ok(());
    };
    let rows: Vec<&NewDeadLetter> = rows.iter().filter(|r| !r.event_id.is_empty()).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let column =
        |f: fn(&NewDeadLetter) -> &str| -> Vec<&str> { rows.iter().map(|r| f(r)).collect() };
    // A volatile function in the select list runs after the ORDER BY sort (PostgreSQL 9.6 and
    // later), so the locks are taken in key order.
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, k)
               FROM (SELECT DISTINCT hashtext(s || ' ' || q || ' ' || e) AS k
                       FROM unnest($2::text[], $3::text[], $4::text[]) AS r(s, q, e)) AS keys
              ORDER BY k",
    )
    .bind(DEAD_LETTER_LOCK_CLASS)
    .bind(column(|r| &r.source))
    .bind(column(|r| &r.queue))
    .bind(column(|r| &r.event_id))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl DeadLetters<'_> {
    /// The first `limit` dead letters, oldest first.
    pub async fn list(self, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
        const SQL: &str = "SELECT id, source, event_id, event_type, queue, payload, error, attempts
                             FROM dead_letters ORDER BY id LIMIT $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }

    /// Up to `limit` dead letters with an id above `after`, in id order: those in `ids`, or
    /// all when `ids` is empty (a redrive pages through them).
    pub async fn selected(
        self,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as::<_, DeadLetter>(
                    "SELECT id, source, event_id, event_type, queue, payload, error, attempts
               FROM dead_letters WHERE ($1 OR id = ANY($2)) AND id > $3 ORDER BY id LIMIT $4",
                )
                .bind(ids.is_empty())
                .bind(ids)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                // The id list travels as one JSON array parameter; an empty list selects
                // everything.
                let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
                sqlx::query_as::<_, DeadLetter>(
                    "SELECT id, source, event_id, event_type, queue, payload, error, attempts
               FROM dead_letters
              WHERE ($1 OR id IN (SELECT value FROM json_each($2))) AND id > $3
              ORDER BY id LIMIT $4",
                )
                .bind(ids.is_empty())
                .bind(&list)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
        })
    }

    /// Deletes one dead letter (after its redrive was published); returns the rows deleted.
    pub async fn delete(self, id: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM dead_letters WHERE id = $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(SQL)
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }

    /// Deletes the dead letter `id` after its redrive was published to `to_queue`, recording in
    /// the same transaction what it was and where it went (`events show` lists it), and
    /// counting it in the minute's `redriven` (`activity_minutes`). Returns the rows deleted
    /// (0: it was gone already, and nothing is recorded or counted).
    pub async fn redrive(self, id: i64, to_queue: &str) -> Result<u64, StoreError> {
        self.leave(id, Leaving::Redriven { to_queue }).await
    }

    /// Deletes the dead letter `id` for good, an operator's decision: recorded as `discarded`
    /// with who decided (its page and `events show` still say what it was), counted in the
    /// minute's `discarded`. Returns the rows deleted (0: gone already; nothing recorded).
    pub async fn discard(self, id: i64, actor: &str) -> Result<u64, StoreError> {
        self.leave(id, Leaving::Discarded { actor }).await
    }

    /// A dead letter's way out: deleted, its record kept, counted, in one transaction.
    async fn leave(self, id: i64, leaving: Leaving<'_>) -> Result<u64, StoreError> {
        const COLUMNS: &str = "dead_letter_id, source, event_id, event_type, queue, redriven_to,
                               error, attempts, dead_lettered_at, redriven_at, outcome, actor";
        // An operator's act, not a worker loop: a shard of its own each time.
        let shard = Shard::random();
        let (to_queue, outcome, actor, series) = match leaving {
            Leaving::Redriven { to_queue } => (to_queue, "redriven", None, Series::Redriven),
            Leaving::Discarded { actor } => ("", "discarded", Some(actor), Series::Discarded),
        };
        let series_name = series.name();
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query(&format!(
                "WITH gone AS (DELETE FROM dead_letters WHERE id = $1 RETURNING *),
                      {}
                 INSERT INTO dead_letter_redrives ({COLUMNS})
                 SELECT id, source, event_id, event_type, queue, $2, error, attempts,
                        created_at, now(), $4, $5
                   FROM gone",
                count_cte_from(
                    "counted",
                    &format!("SELECT '{series_name}', count(*) FROM gone"),
                    3
                )
            ))
            .bind(id)
            .bind(to_queue)
            .bind(shard.number())
            .bind(outcome)
            .bind(actor)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => {
                let mut tx = begin_immediate(pool).await?;
                let began = now_ms();
                sqlx::query(&format!(
                    "INSERT INTO dead_letter_redrives ({COLUMNS})
                     SELECT id, source, event_id, event_type, queue, $2, error, attempts,
                            created_at, $3, $4, $5
                       FROM dead_letters WHERE id = $1"
                ))
                .bind(id)
                .bind(to_queue)
                .bind(began)
                .bind(outcome)
                .bind(actor)
                .execute(&mut *tx)
                .await?;
                let deleted = sqlx::query("DELETE FROM dead_letters WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let counts = Counts::of(series, deleted as usize);
                activity::add_sqlite(&mut tx, began, &counts, shard).await?;
                tx.commit().await?;
                deleted
            }
        })
    }

    /// The record a dead letter left when it was redriven or discarded; `None`: none (it is
    /// still there, was never written, or its record is past retention).
    pub async fn record_of(self, id: i64) -> Result<Option<RedriveRecord>, StoreError> {
        let ms = |column: &str| match self.pool {
            Pool::Postgres(_) => {
                format!("floor(extract(epoch FROM {column}) * 1000)::int8 AS {column}")
            }
            Pool::Sqlite(_) => column.to_owned(),
        };
        let sql = format!(
            "SELECT dead_letter_id, event_type, queue, redriven_to, error, attempts, {}, {},
                    outcome, actor
               FROM dead_letter_redrives WHERE dead_letter_id = $1 ORDER BY id DESC LIMIT 1",
            ms("dead_lettered_at"),
            ms("redriven_at")
        );
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?,
        })
    }
}

/// How a dead letter leaves the table.
enum Leaving<'a> {
    /// Published again to `to_queue`.
    Redriven { to_queue: &'a str },
    /// Deleted for good by `actor`.
    Discarded { actor: &'a str },
}
