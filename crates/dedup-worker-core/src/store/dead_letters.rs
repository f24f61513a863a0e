//! The events not handled: dead letters (written in the batch transaction by
//! [`super::StoreTx`], listed, selected for a redrive, deleted after it) and the events the
//! stale-event guard held back. Each statement is here once, or once per store where they
//! differ: the method, then its PostgreSQL and its SQLite form below.

use super::{DeadLetter, Pool, StaleEvent, Store, StoreError};

impl Store {
    /// The newest `limit` events the stale-event guard held back.
    pub async fn stale_events(&self, limit: i64) -> Result<Vec<StaleEvent>, StoreError> {
        const SQL: &str = "SELECT source, event_id, event_type, object_id, version,
                                  newer_event_id, newer_version
                             FROM stale_events ORDER BY id DESC LIMIT $1";
        Ok(match &self.0 {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }

    /// The first `limit` dead letters, oldest first.
    pub async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
        const SQL: &str = "SELECT id, source, event_id, event_type, queue, payload, error, attempts
                             FROM dead_letters ORDER BY id LIMIT $1";
        Ok(match &self.0 {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }

    /// Up to `limit` dead letters with an id above `after`, in id order: those in `ids`, or
    /// all when `ids` is empty (a redrive pages through them).
    pub async fn dead_letters_selected(
        &self,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        on_pool!(self, dead_letters_selected(ids, after, limit))
    }

    /// Deletes one dead letter (after its redrive was published); returns the rows deleted.
    pub async fn delete_dead_letter(&self, id: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM dead_letters WHERE id = $1";
        Ok(match &self.0 {
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
}

/// The PostgreSQL forms.
pub(super) mod postgres {
    use sqlx::{PgConnection, PgPool};

    use crate::store::postgres::DEAD_LETTER_LOCK_CLASS;
    use crate::store::{DeadLetter, NewDeadLetter, StoreError};

    /// Takes the once-only locks of all of `rows` (as [`insert_dead_letter`] takes one), in
    /// the order of the lock keys, whatever order the batch's events failed in: two batches
    /// dead-lettering the same events in opposite orders would otherwise each hold one lock
    /// and wait for the other's (PostgreSQL ends one with `deadlock detected`). The keys are
    /// the ones `insert_dead_letter` computes, so its own lock is then held already.
    pub(in crate::store) async fn lock_dead_letters(
        tx: &mut PgConnection,
        rows: &[NewDeadLetter],
    ) -> Result<(), StoreError> {
        let rows: Vec<&NewDeadLetter> = rows.iter().filter(|r| !r.event_id.is_empty()).collect();
        if rows.is_empty() {
            return Ok(());
        }
        let column =
            |f: fn(&NewDeadLetter) -> &str| -> Vec<&str> { rows.iter().map(|r| f(r)).collect() };
        // A volatile function in the select list runs after the ORDER BY sort (PostgreSQL
        // 9.6 and later), so the locks are taken in key order.
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
        .execute(tx)
        .await?;
        Ok(())
    }

    pub(in crate::store) async fn insert_dead_letter(
        tx: &mut PgConnection,
        row: &NewDeadLetter,
        once: bool,
    ) -> Result<u64, StoreError> {
        if once && !row.event_id.is_empty() {
            // The check below reads committed rows only: two batches moving one event at once (SQS
            // handed its message to two receivers) would each find none and each insert. Locked
            // per event until commit, the second one's check sees the first's row. A hash collision
            // only makes two events wait for each other.
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2 || ' ' || $3 || ' ' || $4))")
                .bind(DEAD_LETTER_LOCK_CLASS)
                .bind(&row.source)
                .bind(&row.queue)
                .bind(&row.event_id)
                .execute(&mut *tx)
                .await?;
        }
        Ok(sqlx::query(
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
        .execute(tx)
        .await?
        .rows_affected())
    }

    pub(super) async fn dead_letters_selected(
        pool: &PgPool,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(sqlx::query_as::<_, DeadLetter>(
            "SELECT id, source, event_id, event_type, queue, payload, error, attempts
               FROM dead_letters WHERE ($1 OR id = ANY($2)) AND id > $3 ORDER BY id LIMIT $4",
        )
        .bind(ids.is_empty())
        .bind(ids)
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }
}

/// The SQLite forms.
pub(super) mod sqlite {
    use sqlx::{SqliteConnection, SqlitePool};

    use crate::store::{now_ms, DeadLetter, NewDeadLetter, StoreError};

    pub(in crate::store) async fn insert_dead_letter(
        tx: &mut SqliteConnection,
        row: &NewDeadLetter,
        once: bool,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
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
        .execute(tx)
        .await?
        .rows_affected())
    }

    pub(super) async fn dead_letters_selected(
        pool: &SqlitePool,
        ids: &[i64],
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        // The id list travels as one JSON array parameter; an empty list selects everything.
        let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
        Ok(sqlx::query_as::<_, DeadLetter>(
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
        .await?)
    }
}
