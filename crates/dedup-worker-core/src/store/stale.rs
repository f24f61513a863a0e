//! The stale-event guard's rows (`object_versions`, the newest version handled per object, and
//! `stale_events`, the events it held back): [`StaleEvents`], reached as
//! `store.stale_events()`, and the batch transaction's statements ([`StoreTx`] calls
//! [`lock_objects`], [`record_version`] and [`insert`]). Both stores take the same SQL, run on
//! whichever connection the transaction or the pool holds.

use super::postgres::OBJECT_LOCK_CLASS;
use super::{Pool, StaleEvent, StoreError, StoreTx};

/// The events the stale-event guard held back, as it recorded them.
#[derive(Debug, Clone, Copy)]
pub struct StaleEvents<'a> {
    pub(super) pool: &'a Pool,
}

impl StaleEvents<'_> {
    /// The newest `limit` events the stale-event guard held back.
    pub async fn list(self, limit: i64) -> Result<Vec<StaleEvent>, StoreError> {
        const SQL: &str = "SELECT source, event_id, event_type, object_id, version,
                                  newer_event_id, newer_version
                             FROM stale_events ORDER BY id DESC LIMIT $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }
}

/// Locks each `(source, object id)` whose version the guard may record in this transaction, in
/// one canonical order (the lock keys'), before any is recorded (see
/// [`StoreTx::lock_objects`]). SQLite: nothing to do (one writer at a time).
pub(super) async fn lock_objects(
    tx: &mut StoreTx,
    objects: &[(&str, &str)],
) -> Result<(), StoreError> {
    let StoreTx::Postgres(tx) = tx else {
        return Ok(());
    };
    if objects.is_empty() {
        return Ok(());
    }
    let sources: Vec<&str> = objects.iter().map(|(s, _)| *s).collect();
    let ids: Vec<&str> = objects.iter().map(|(_, o)| *o).collect();
    // A volatile function in the select list runs after the ORDER BY sort (PostgreSQL 9.6
    // and later), so the locks are taken in key order.
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, k)
               FROM (SELECT DISTINCT hashtext(s || ' ' || o) AS k
                       FROM unnest($2::text[], $3::text[]) AS r(s, o)) AS keys
              ORDER BY k",
    )
    .bind(OBJECT_LOCK_CLASS)
    .bind(sources)
    .bind(ids)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records `version` as the newest handled for `(source, object_id)` unless a strictly newer
/// one is recorded; returns that newer one (version, event id) when there is one (see
/// [`StoreTx::record_object_version`]).
pub(super) async fn record_version(
    tx: &mut StoreTx,
    source: &str,
    object_id: &str,
    version: i64,
    event_id: &str,
) -> Result<Option<(i64, String)>, StoreError> {
    const UPSERT: &str = "INSERT INTO object_versions (source, object_id, version, event_id)
                              VALUES ($1, $2, $3, $4)
                              ON CONFLICT (source, object_id) DO UPDATE
                                 SET version = excluded.version, event_id = excluded.event_id
                               WHERE object_versions.version <= excluded.version
                              RETURNING version";
    const NEWER: &str =
        "SELECT version, event_id FROM object_versions WHERE source = $1 AND object_id = $2";
    let recorded: Option<i64> = match tx {
        StoreTx::Postgres(tx) => {
            sqlx::query_scalar(UPSERT)
                .bind(source)
                .bind(object_id)
                .bind(version)
                .bind(event_id)
                .fetch_optional(&mut **tx)
                .await?
        }
        StoreTx::Sqlite(tx, _) => {
            sqlx::query_scalar(UPSERT)
                .bind(source)
                .bind(object_id)
                .bind(version)
                .bind(event_id)
                .fetch_optional(&mut **tx)
                .await?
        }
    };
    if recorded.is_some() {
        return Ok(None);
    }
    Ok(match tx {
        StoreTx::Postgres(tx) => {
            sqlx::query_as(NEWER)
                .bind(source)
                .bind(object_id)
                .fetch_optional(&mut **tx)
                .await?
        }
        StoreTx::Sqlite(tx, _) => {
            sqlx::query_as(NEWER)
                .bind(source)
                .bind(object_id)
                .fetch_optional(&mut **tx)
                .await?
        }
    })
}

/// Lists `event` as held back by the guard, in the batch transaction.
pub(super) async fn insert(tx: &mut StoreTx, event: &StaleEvent) -> Result<(), StoreError> {
    const SQL: &str = "INSERT INTO stale_events (source, event_id, event_type, object_id,
                                                     version, newer_event_id, newer_version)
                           VALUES ($1, $2, $3, $4, $5, $6, $7)";
    match tx {
        StoreTx::Postgres(tx) => sqlx::query(SQL)
            .bind(&event.source)
            .bind(&event.event_id)
            .bind(&event.event_type)
            .bind(&event.object_id)
            .bind(event.version)
            .bind(&event.newer_event_id)
            .bind(event.newer_version)
            .execute(&mut **tx)
            .await
            .map(drop)?,
        StoreTx::Sqlite(tx, _) => sqlx::query(SQL)
            .bind(&event.source)
            .bind(&event.event_id)
            .bind(&event.event_type)
            .bind(&event.object_id)
            .bind(event.version)
            .bind(&event.newer_event_id)
            .bind(event.newer_version)
            .execute(&mut **tx)
            .await
            .map(drop)?,
    }
    Ok(())
}
