//! Ordering by key on an ordered sink's lane (`[outbox.sinks.NAME] ordered = true`): rows with
//! the same `ordering_key` in one lane reach the receiver in the order their transactions
//! committed, one at a time.
//!
//! * **Commit order is id order.** On PostgreSQL ids come from a sequence when a row is
//!   inserted, not when it commits, so two transactions writing rows of one key could commit
//!   in the other order than their ids. [`lock_ordering_keys`] takes a transaction-scoped
//!   advisory lock per (lane, key) before the insert, held to commit: the later transaction
//!   allocates its ids only after the earlier one committed. Locks are taken in ascending order
//!   in one statement, and the outbox insert is the batch transaction's last write, so two
//!   batches cannot wait on each other in a circle. Only ordered rows pay for it. SQLite has
//!   one writer at a time: ids already are commit order.
//! * **One at a time.** The claim of an ordered lane takes a row only when no earlier row of its
//!   key is pending (leased, backing off, deferred by the breaker or a `Retry-After`) or
//!   failed and not skipped ([`FIRST_IN_ITS_KEY`]). A leased row is pending, so its
//!   successors are in no batch and no other relay's claim until it is settled.
//! * **A row failed for good holds its key**: its successors wait, listed by
//!   [`Outbox::held_keys`] (the console's overview, `dedup-worker outbox held`), until an
//!   operator retries it (`outbox retry --failed`, which makes it pending again) or skips it
//!   ([`Outbox::skip`], `dedup-worker outbox skip ID`: it stays failed, recorded as skipped,
//!   and stops holding the key). Nothing skips on its own: breaking the order is the
//!   operator's choice.

use sha2::Digest;

use super::dedup::dedup_key;
use super::postgres::{PG_DEDUP_KEY, PG_TODAYS_PARTITION};
use super::sqlite::begin_immediate;
use super::{now_ms, NewOutboxRow, Outbox, Pool, StoreError};

/// The claim's condition on an ordered lane, both stores (`c` is the candidate row). Its terms
/// repeat the partial index `outbox_lane_key`'s predicate as written, so SQLite's planner sees
/// that the index applies.
pub(super) const FIRST_IN_ITS_KEY: &str = "AND (c.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM outbox e
         WHERE e.sink = c.sink AND e.ordering_key = c.ordering_key AND e.id < c.id
           AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'failed')
           AND e.skipped_at IS NULL))";

/// Takes, on PostgreSQL, the transaction-scoped advisory lock of each (lane, ordering key) of
/// `rows` (see the module docs). Nothing for rows without a key.
pub(super) async fn lock_ordering_keys(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    rows: &[NewOutboxRow],
) -> Result<(), StoreError> {
    let mut locks: Vec<i64> = rows
        .iter()
        .filter_map(|r| Some(advisory_key(r.lane(), r.ordering_key.as_deref()?)))
        .collect();
    if locks.is_empty() {
        return Ok(());
    }
    locks.sort_unstable();
    locks.dedup();
    // `unnest` yields the sorted array in order; one statement, so one round trip.
    sqlx::query("SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k")
        .bind(&locks)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The advisory lock of a key in a lane: the first 8 bytes of SHA-256(lane ‖ 0 ‖ key). A
/// collision only makes two keys' writers take turns.
fn advisory_key(lane: &str, key: &str) -> i64 {
    let mut digest = sha2::Sha256::new();
    digest.update(lane.as_bytes());
    digest.update([0]);
    digest.update(key.as_bytes());
    let digest = digest.finalize();
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes of 32"))
}

/// A key an ordered lane holds: its earliest undelivered row failed for good.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct HeldKey {
    /// The row that failed (what `outbox skip` or `outbox retry --failed` names).
    pub id: i64,
    pub sink: String,
    pub ordering_key: String,
    /// The event whose handler wrote the row.
    pub source: String,
    pub event_id: String,
    pub last_error: Option<String>,
    /// Rows of the key waiting behind it.
    pub waiting: i64,
}

impl Outbox<'_> {
    /// Up to `limit` keys held by a failed row, oldest first (see the module docs).
    pub async fn held_keys(self, limit: i64) -> Result<Vec<HeldKey>, StoreError> {
        const SQL: &str = "SELECT f.id, f.sink, f.ordering_key, f.source, f.event_id, f.last_error,
                (SELECT count(*) FROM outbox w
                  WHERE w.sink = f.sink AND w.ordering_key = f.ordering_key AND w.id > f.id
                    AND w.ordering_key IS NOT NULL AND w.status IN ('pending', 'failed')
                    AND w.skipped_at IS NULL) AS waiting
           FROM outbox f
          WHERE f.status = 'failed' AND f.ordering_key IS NOT NULL AND f.skipped_at IS NULL
          ORDER BY f.id
          LIMIT $1";
        Ok(match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
            Pool::Sqlite(pool) => sqlx::query_as(SQL).bind(limit).fetch_all(pool).await?,
        })
    }

    /// Skips failed row `id`: it stays failed (listed as not delivered) but no longer holds its
    /// ordering key, so the next row of the key may go. Returns the row's lane and key, or
    /// `None` if `id` is no failed row not skipped yet.
    pub async fn skip(
        self,
        id: i64,
        actor: &str,
    ) -> Result<Option<(String, Option<String>)>, StoreError> {
        Ok(match self.pool {
            // The skip is recorded in the event's timeline (`outbox_attempts`) too.
            Pool::Postgres(pool) => {
                let sql = format!(
                    "WITH skipped AS (UPDATE outbox SET skipped_at = now(), skipped_by = $2
                      WHERE id = $1 AND status = 'failed' AND skipped_at IS NULL
                  RETURNING id, source, event_id, sink, ordering_key),
                     recorded AS (INSERT INTO outbox_attempts
                                         (event_key, outbox_id, attempt, kind, lane, actor)
                  SELECT {PG_DEDUP_KEY}, id, 0, 'skip', sink, $2 FROM skipped
                   WHERE {PG_TODAYS_PARTITION} RETURNING 1)
                SELECT sink, ordering_key FROM skipped"
                );
                sqlx::query_as(&sql)
                    .bind(id)
                    .bind(actor)
                    .fetch_optional(pool)
                    .await?
            }
            Pool::Sqlite(pool) => {
                let mut tx = begin_immediate(pool).await?;
                let skipped: Option<(String, String, String, Option<String>)> = sqlx::query_as(
                    "UPDATE outbox SET skipped_at = $3, skipped_by = $2
                      WHERE id = $1 AND status = 'failed' AND skipped_at IS NULL
                  RETURNING source, event_id, sink, ordering_key",
                )
                .bind(id)
                .bind(actor)
                .bind(now_ms())
                .fetch_optional(&mut *tx)
                .await?;
                if let Some((source, event_id, sink, _)) = &skipped {
                    sqlx::query(
                        "INSERT INTO outbox_attempts (at, event_key, outbox_id, attempt, kind, lane, actor)
                         VALUES ($1, $2, $3, 0, 'skip', $4, $5)",
                    )
                    .bind(now_ms())
                    .bind(dedup_key(source, event_id).to_vec())
                    .bind(id)
                    .bind(sink)
                    .bind(actor)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                skipped.map(|(_, _, sink, key)| (sink, key))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::advisory_key;

    #[test]
    fn the_lock_of_a_key_depends_on_its_lane_and_key_alone() {
        assert_eq!(
            advisory_key("billing", "in_1"),
            advisory_key("billing", "in_1")
        );
        assert_ne!(
            advisory_key("billing", "in_1"),
            advisory_key("billing", "in_2")
        );
        assert_ne!(advisory_key("billing", "in_1"), advisory_key("crm", "in_1"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(advisory_key("ab", "c"), advisory_key("a", "bc"));
    }
}
