//! One event's trail through the store, for `dedup-worker events show`: its dead letters, the
//! redrives of earlier ones (the record `store.dead_letters().redrive` leaves), the stale
//! guard's record, its outbox rows and its messages still in the database queue (its dedup
//! record and duplicates are the ring's: `store.dedup()`).
//!
//! Every read is by an index on the event (migration `20261202000001_event_trail`) and bounded
//! by `limit` rows, except the database queue's, which has no index on the event id: a write per
//! enqueued message on the ingress path, to spare an operator's lookup a scan of a table that is
//! meant to be drained. Callers bound each call by the statement timeout as well
//! ([`crate::store::bounded`]; on PostgreSQL the session's `statement_timeout` applies too).

use super::Reads;
use crate::store::dedup::{self, dedup_key};
use crate::store::{
    DeadLetterRecord, OutboxRecord, Pool, QueuedRecord, RedriveRecord, StaleRecord, StoreError,
};

impl Reads<'_> {
    /// `column` as Unix milliseconds, named `column`: PostgreSQL keeps times as timestamptz,
    /// SQLite as milliseconds already.
    fn ms(self, column: &str) -> String {
        match self.pool {
            Pool::Postgres(_) => {
                format!("floor(extract(epoch FROM {column}) * 1000)::int8 AS {column}")
            }
            Pool::Sqlite(_) => column.to_owned(),
        }
    }

    /// The event's dead letters, oldest first.
    pub async fn dead_letters_of(
        self,
        source: &str,
        event_id: &str,
        limit: i64,
    ) -> Result<Vec<DeadLetterRecord>, StoreError> {
        let sql = format!(
            "SELECT id, event_type, queue, error, attempts, {}
               FROM dead_letters WHERE source = $1 AND event_id = $2 ORDER BY id LIMIT $3",
            self.ms("created_at")
        );
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        })
    }

    /// The event's dead letters that were redriven, oldest first.
    pub async fn redrives_of(
        self,
        source: &str,
        event_id: &str,
        limit: i64,
    ) -> Result<Vec<RedriveRecord>, StoreError> {
        let sql = format!(
            "SELECT dead_letter_id, event_type, queue, redriven_to, error, attempts, {}, {},
                    outcome, actor
               FROM dead_letter_redrives WHERE source = $1 AND event_id = $2
              ORDER BY id LIMIT $3",
            self.ms("dead_lettered_at"),
            self.ms("redriven_at")
        );
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        })
    }

    /// The stale guard's records of holding the event back, oldest first.
    pub async fn stale_records_of(
        self,
        source: &str,
        event_id: &str,
        limit: i64,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let sql = format!(
            "SELECT event_type, object_id, version, newer_event_id, newer_version, {}
               FROM stale_events WHERE source = $1 AND event_id = $2 ORDER BY id LIMIT $3",
            self.ms("recorded_at")
        );
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&sql)
                    .bind(source)
                    .bind(event_id)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        })
    }

    /// The outbox rows of the event's processing: written in the transaction that recorded its
    /// id, so created at its `processed_at` (found through the time index, then the event).
    pub async fn outbox_of(
        self,
        source: &str,
        event_id: &str,
        limit: i64,
    ) -> Result<Vec<OutboxRecord>, StoreError> {
        let columns = format!(
            "id, destination, event_type, status, attempts, last_error, {}, {}, {},
             skipped_at IS NOT NULL AS skipped",
            self.ms("created_at"),
            self.ms("next_attempt_at"),
            self.ms("dispatched_at")
        );
        let key = dedup_key(source, event_id);
        let times = dedup::processed_times();
        Ok(match self.pool {
            // ARRAY(…): the times are computed once, and the index is probed for each.
            Pool::Postgres(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {columns} FROM outbox
                  WHERE created_at = ANY (ARRAY({times})) AND source = $2 AND event_id = $3
                  ORDER BY id LIMIT $4"
                ))
                .bind(uuid::Uuid::from_bytes(key))
                .bind(source)
                .bind(event_id)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {columns} FROM outbox
                  WHERE created_at IN ({times}) AND source = $2 AND event_id = $3
                  ORDER BY id LIMIT $4"
                ))
                .bind(key.to_vec())
                .bind(source)
                .bind(event_id)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
        })
    }

    /// The event's messages in the database queue (any queue of the table), oldest first. A
    /// message without a source is the consumer's `default_source`; one without a message id
    /// (a foreign producer's, its id in the payload) is not found. Scans the table (see the
    /// module docs).
    pub async fn queued_of(
        self,
        source: &str,
        event_id: &str,
        default_source: &str,
        limit: i64,
    ) -> Result<Vec<QueuedRecord>, StoreError> {
        let sql = format!(
            "SELECT id, queue, attempts, {}, {}
               FROM queue_messages WHERE message_id = $1 AND coalesce(source, $3) = $2
              ORDER BY id LIMIT $4",
            self.ms("enqueued_at"),
            self.ms("visible_at")
        );
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&sql)
                    .bind(event_id)
                    .bind(source)
                    .bind(default_source)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&sql)
                    .bind(event_id)
                    .bind(source)
                    .bind(default_source)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
        })
    }
}
