//! The database queue's rows (`queue_messages`): [`Queue`], reached as `store.queue()`. Each
//! statement is here once, its PostgreSQL and its SQLite form side by side in one `match`.

use std::time::Duration;

use sqlx::{QueryBuilder, Row, Sqlite};

use super::postgres::secs;
use super::sqlite::{begin_immediate, execute_for_ids, update_claimed, CHUNK};
use super::{
    count, millis, new_claim_token, now_ms, NewQueueMessage, Pool, QueuedMessage, StoreError,
    QUEUE_CHANNEL,
};

/// The database queue's messages (`queue_messages`): enqueued by the ingress and the
/// backfill, leased, acked and released by the consumer, counted by the gauges.
#[derive(Debug, Clone, Copy)]
pub struct Queue<'a> {
    pub(super) pool: &'a Pool,
}

impl Queue<'_> {
    /// Writes all messages in one transaction (one commit for the whole group).
    pub async fn enqueue(
        self,
        queue: &str,
        messages: &[NewQueueMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        match self.pool {
            Pool::Postgres(pool) => {
                let sources: Vec<Option<&str>> =
                    messages.iter().map(|m| m.source.as_deref()).collect();
                let ids: Vec<Option<&str>> =
                    messages.iter().map(|m| m.message_id.as_deref()).collect();
                let types: Vec<Option<&str>> =
                    messages.iter().map(|m| m.message_type.as_deref()).collect();
                let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
                let traces: Vec<Option<&str>> =
                    messages.iter().map(|m| m.traceparent.as_deref()).collect();
                let signatures: Vec<Option<&str>> = messages
                    .iter()
                    .map(|m| m.stripe_signature.as_deref())
                    .collect();
                let headers: Vec<Option<&str>> = messages
                    .iter()
                    .map(|m| m.sender_headers.as_deref())
                    .collect();
                // One statement, one commit: the insert and the notification (delivered on
                // commit).
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
            }
            Pool::Sqlite(pool) => {
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
            }
        }
        Ok(())
    }

    /// Leases up to `max` visible messages for `lease`, under a fresh claim token.
    pub async fn claim(
        self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        let claim_token = new_claim_token();
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as::<_, QueuedMessage>(
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
                .await?
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query_as::<_, QueuedMessage>(
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
                .await?
            }
        })
    }

    /// Deletes acknowledged messages, whoever holds their lease now. Unlike a release this
    /// needs no claim token: a consumer acks only after committing the event's outcome (its
    /// processed id, or its dead letter), so the event is safe whatever becomes of the message.
    /// A consumer that re-claimed it after this one's lease expired would find the processed id
    /// (its dedup insert waits for, then yields to, this one's) and ack it as a duplicate, or
    /// dead-letter it a second time; deleting it under that consumer loses nothing and spares
    /// that work.
    pub async fn ack(self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query("DELETE FROM queue_messages WHERE id = ANY($1)")
                    .bind(ids)
                    .execute(pool)
                    .await?;
                Ok(())
            }
            Pool::Sqlite(pool) => {
                execute_for_ids(pool, "DELETE FROM queue_messages WHERE id IN (", ids).await
            }
        }
    }

    /// Makes a message visible again after `delay` (redelivery with backoff), if it is still
    /// under the claim `claim_token`. Returns the rows released: 0 when another consumer has
    /// claimed the message since (it holds the lease now; moving its visibility would let a
    /// third consumer take it early, or delay it by a backoff it did not earn), or it was acked.
    pub async fn release(
        self,
        id: i64,
        claim_token: i64,
        delay: Duration,
    ) -> Result<u64, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $2)
              WHERE id = $1 AND claim_token = $3",
            )
            .bind(id)
            .bind(secs(delay))
            .bind(claim_token)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(
                "UPDATE queue_messages SET visible_at = $1 WHERE id = $2 AND claim_token = $3",
            )
            .bind(now_ms() + millis(delay))
            .bind(id)
            .bind(claim_token)
            .execute(pool)
            .await?
            .rows_affected(),
        })
    }

    /// Extends the lease of messages `ids` still under the claim `claim_token` to `lease` from
    /// now (the consumer's heartbeat while it works on them). Returns the ids extended: one
    /// missing was claimed by another consumer since (its lease had run out), or was acked.
    pub async fn extend_leases(
        self,
        claim_token: i64,
        ids: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        match self.pool {
            Pool::Postgres(pool) => Ok(sqlx::query_scalar(
                "UPDATE queue_messages SET visible_at = now() + make_interval(secs => $3)
              WHERE id = ANY($1) AND claim_token = $2
          RETURNING id",
            )
            .bind(ids)
            .bind(claim_token)
            .bind(secs(lease))
            .fetch_all(pool)
            .await?),
            Pool::Sqlite(pool) => {
                let set = format!(
                    "UPDATE queue_messages SET visible_at = {}",
                    now_ms() + millis(lease)
                );
                update_claimed(pool, &set, "", claim_token, ids).await
            }
        }
    }

    /// Messages on `queue`, leased or not.
    pub async fn depth(self, queue: &str) -> Result<i64, StoreError> {
        const SQL: &str = "SELECT count(*) FROM queue_messages WHERE queue = $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_scalar(SQL).bind(queue).fetch_one(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_scalar(SQL).bind(queue).fetch_one(pool).await?,
        })
    }

    /// Messages on `queue`, leased or not, and how long the oldest has been there (`None` when
    /// the queue is empty): what the gauges of `/metrics` sample. One statement, over the
    /// queue's `(queue, visible_at, id)` index.
    pub async fn backlog(self, queue: &str) -> Result<(u64, Option<Duration>), StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                // The server's clock on both sides: `enqueued_at` is its `now()` at the insert.
                let row = sqlx::query(
                    "SELECT count(*), extract(epoch FROM now() - min(enqueued_at))::float8
                       FROM queue_messages WHERE queue = $1",
                )
                .bind(queue)
                .fetch_one(pool)
                .await?;
                let age: Option<f64> = row.try_get(1)?;
                Ok((
                    count(row.try_get(0)?),
                    // A clock stepped back makes the age negative: say 0, never panic.
                    age.and_then(|secs| Duration::try_from_secs_f64(secs.max(0.0)).ok()),
                ))
            }
            Pool::Sqlite(pool) => {
                let row = sqlx::query(
                    "SELECT count(*), min(enqueued_at) FROM queue_messages WHERE queue = $1",
                )
                .bind(queue)
                .fetch_one(pool)
                .await?;
                let oldest: Option<i64> = row.try_get(1)?;
                Ok((
                    count(row.try_get(0)?),
                    oldest.map(|ms| Duration::from_millis(count(now_ms().saturating_sub(ms)))),
                ))
            }
        }
    }
}
