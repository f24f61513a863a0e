//! The database queue's rows (`queue_messages`): enqueue, claim, ack, release, extend leases,
//! depth. Each statement is here once per store: the method, then its PostgreSQL and its
//! SQLite form below.

use std::time::Duration;

use super::{new_claim_token, NewQueueMessage, Pool, QueuedMessage, Store, StoreError};

impl Store {
    /// Writes all messages in one transaction (one commit for the whole group).
    pub async fn enqueue(
        &self,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        on_pool!(self, enqueue(queue, messages))
    }

    /// Leases up to `max` visible messages for `lease`, under a fresh claim token.
    pub async fn claim_messages(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        on_pool!(self, claim_messages(queue, max, lease, new_claim_token()))
    }

    /// Deletes acknowledged messages, whoever holds their lease now. Unlike a release this
    /// needs no claim token: a consumer acks only after committing the event's outcome (its
    /// processed id, or its dead letter), so the event is safe whatever becomes of the message.
    /// A consumer that re-claimed it after this one's lease expired would find the processed id
    /// (its dedup insert waits for, then yields to, this one's) and ack it as a duplicate, or
    /// dead-letter it a second time; deleting it under that consumer loses nothing and spares
    /// that work.
    pub async fn ack_messages(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        on_pool!(self, ack_messages(ids))
    }

    /// Makes a message visible again after `delay` (redelivery with backoff), if it is still
    /// under the claim `claim_token`. Returns the rows released: 0 when another consumer has
    /// claimed the message since (it holds the lease now; moving its visibility would let a
    /// third consumer take it early, or delay it by a backoff it did not earn), or it was acked.
    pub async fn release_message(
        &self,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        on_pool!(self, release_message(id, claim_token, delay))
    }

    /// Extends the lease of messages `ids` still under the claim `claim_token` to `lease` from
    /// now (the consumer's heartbeat while it works on them). Returns the ids extended: one
    /// missing was claimed by another consumer since (its lease had run out), or was acked.
    pub async fn extend_message_leases(
        &self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        on_pool!(self, extend_message_leases(claim_token, ids, lease))
    }

    /// Messages on `queue`, leased or not.
    pub async fn queue_depth(&self, queue: &str) -> Result<i64, StoreError> {
        const SQL: &str = "SELECT count(*) FROM queue_messages WHERE queue = $1";
        Ok(match &self.0 {
            Pool::Postgres(pool) => sqlx::query_scalar(SQL).bind(queue).fetch_one(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_scalar(SQL).bind(queue).fetch_one(pool).await?,
        })
    }
}

/// The PostgreSQL forms.
pub(super) mod postgres {
    use std::time::Duration;

    use sqlx::PgPool;

    use crate::store::postgres::secs;
    use crate::store::{NewQueueMessage, QueuedMessage, StoreError, QUEUE_CHANNEL};

    pub(super) async fn enqueue(
        pool: &PgPool,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        let sources: Vec<Option<&str>> = messages.iter().map(|m| m.source.as_deref()).collect();
        let ids: Vec<Option<&str>> = messages.iter().map(|m| m.message_id.as_deref()).collect();
        let types: Vec<Option<&str>> = messages.iter().map(|m| m.message_type.as_deref()).collect();
        let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
        let traces: Vec<Option<&str>> = messages.iter().map(|m| m.traceparent.as_deref()).collect();
        let signatures: Vec<Option<&str>> = messages
            .iter()
            .map(|m| m.stripe_signature.as_deref())
            .collect();
        let headers: Vec<Option<&str>> = messages
            .iter()
            .map(|m| m.sender_headers.as_deref())
            .collect();
        // One statement, one commit: the insert and the notification (delivered on commit).
        sqlx::query(
            "WITH inserted AS (
                 INSERT INTO queue_messages (queue, message_id, message_type, payload, source,
                                             traceparent, stripe_signature, sender_headers)
                 SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::bytea[], $6::text[], $7::text[],
                                          $8::text[], $9::text[])
                 RETURNING 1
             )
             SELECT pg_notify($5, $1), (SELECT count(*) FROM inserted)",
        )
        .bind(queue)
        .bind(&ids)
        .bind(&types)
        .bind(&payloads)
        .bind(QUEUE_CHANNEL)
        .bind(&sources)
        .bind(&traces)
        .bind(&signatures)
        .bind(&headers)
        .execute(pool)
        .await?;
        Ok(())
    }

    pub(super) async fn claim_messages(
        pool: &PgPool,
        queue: &str,
        max: usize,
        lease: Duration,
        claim_token: i64,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        let rows = sqlx::query_as::<_, QueuedMessage>(
            "UPDATE queue_messages q
                SET visible_at = now() + make_interval(secs => $3), attempts = q.attempts + 1,
                    claim_token = $4
               FROM (SELECT id FROM queue_messages
                      WHERE queue = $1 AND visible_at <= now()
                      ORDER BY visible_at, id
                      LIMIT $2
                      FOR UPDATE SKIP LOCKED) c
              WHERE q.id = c.id
          RETURNING q.id, q.source, q.message_id, q.message_type, q.payload, q.attempts,
                    floor(extract(epoch FROM q.enqueued_at) * 1000)::int8 AS enqueued_at,
                    q.traceparent, q.stripe_signature, q.sender_headers, q.claim_token",
        )
        .bind(queue)
        .bind(max as i64)
        .bind(secs(lease))
        .bind(claim_token)
        .fetch_all(pool)
        .await?;
        Ok(rows)
    }

    pub(super) async fn ack_messages(pool: &PgPool, ids: &[i64]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM queue_messages WHERE id = ANY($1)")
            .bind(ids)
            .execute(pool)
            .await?;
        Ok(())
    }

    pub(super) async fn release_message(
        pool: &PgPool,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $2)
              WHERE id = $1 AND claim_token = $3",
        )
        .bind(id)
        .bind(secs(delay))
        .bind(claim_token)
        .execute(pool)
        .await?
        .rows_affected())
    }

    pub(super) async fn extend_message_leases(
        pool: &PgPool,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $3)
              WHERE id = ANY($1) AND claim_token = $2
          RETURNING id",
        )
        .bind(ids)
        .bind(claim_token)
        .bind(secs(lease))
        .fetch_all(pool)
        .await?)
    }
}

/// The SQLite forms.
pub(super) mod sqlite {
    use std::time::Duration;

    use sqlx::{QueryBuilder, Sqlite, SqlitePool};

    use crate::store::sqlite::{begin_immediate, execute_for_ids, update_claimed, CHUNK};
    use crate::store::{millis, now_ms, NewQueueMessage, QueuedMessage, StoreError};

    pub(super) async fn enqueue(
        pool: &SqlitePool,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let mut tx = begin_immediate(pool).await?;
        for chunk in messages.chunks(CHUNK) {
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO queue_messages (queue, source, message_id, message_type, payload, visible_at, enqueued_at, traceparent, stripe_signature, sender_headers) ",
            );
            qb.push_values(chunk, |mut b, m| {
                b.push_bind(queue)
                    .push_bind(m.source.as_deref())
                    .push_bind(m.message_id.as_deref())
                    .push_bind(m.message_type.as_deref())
                    .push_bind(m.payload.as_slice())
                    .push_bind(now)
                    .push_bind(now)
                    .push_bind(m.traceparent.as_deref())
                    .push_bind(m.stripe_signature.as_deref())
                    .push_bind(m.sender_headers.as_deref());
            });
            qb.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn claim_messages(
        pool: &SqlitePool,
        queue: &str,
        max: usize,
        lease: Duration,
        claim_token: i64,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        let now = now_ms();
        let rows = sqlx::query_as::<_, QueuedMessage>(
            "UPDATE queue_messages SET visible_at = $1, attempts = attempts + 1, claim_token = $5
              WHERE id IN (SELECT id FROM queue_messages
                            WHERE queue = $2 AND visible_at <= $3
                            ORDER BY visible_at, id LIMIT $4)
          RETURNING id, source, message_id, message_type, payload, attempts, enqueued_at,
                    traceparent, stripe_signature, sender_headers, claim_token",
        )
        .bind(now + millis(lease))
        .bind(queue)
        .bind(now)
        .bind(max as i64)
        .bind(claim_token)
        .fetch_all(pool)
        .await?;
        Ok(rows)
    }

    pub(super) async fn ack_messages(pool: &SqlitePool, ids: &[i64]) -> Result<(), StoreError> {
        execute_for_ids(pool, "DELETE FROM queue_messages WHERE id IN (", ids).await
    }

    pub(super) async fn release_message(
        pool: &SqlitePool,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "UPDATE queue_messages SET visible_at = $1 WHERE id = $2 AND claim_token = $3",
        )
        .bind(now_ms() + millis(delay))
        .bind(id)
        .bind(claim_token)
        .execute(pool)
        .await?
        .rows_affected())
    }

    pub(super) async fn extend_message_leases(
        pool: &SqlitePool,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let set = format!(
            "UPDATE queue_messages SET visible_at = {}",
            now_ms() + millis(lease)
        );
        update_claimed(pool, &set, "", claim_token, ids).await
    }
}
