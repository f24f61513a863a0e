//! PostgreSQL storage of idempotency keys: the source of truth.
//!
//! Guarantees:
//! - a claim is one statement (`INSERT … ON CONFLICT … DO UPDATE … WHERE <takeover> RETURNING`
//!   plus a read of the existing row in the same statement): a new key, an expired key or an
//!   in-progress key whose lease ended (same fingerprint) is claimed by exactly one caller, since
//!   PostgreSQL serialises the conflicting statements on the primary key and re-checks the
//!   takeover condition on the newest row version;
//! - completion and release only touch a row still holding the caller's claim token, so a request
//!   whose lease was taken over cannot overwrite the new holder's result;
//! - expired rows are deleted in bounded batches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::types::Json;
use sqlx::{PgPool, Row};
use uuid::Uuid;

mod kept;
mod phases;
mod request_tx;

use kept::KeptConnections;
pub(crate) use request_tx::RequestTx;

use super::fingerprint::Fingerprint;
use super::group::{Completed, GroupOptions, Groups, NewClaim, NewCompletion};
use super::records::{
    decode_existing, duration_ms, millis, Claim, ClaimToken, Ownership, StoreError, StoredResponse,
};

/// The PostgreSQL idempotency key store.
#[derive(Debug, Clone)]
pub struct PgIdempotencyStore {
    pool: PgPool,
    /// Statements sent, for tests and the load harness (see `query_count`).
    queries: Arc<AtomicU64>,
    /// How first claims and completions are grouped; `None` writes each on its own.
    grouping: Option<GroupOptions>,
    /// The group writers, started on first use (inside the runtime that uses the store).
    groups: Arc<OnceLock<Groups>>,
    /// Connections kept between the layer's request transactions (no ping between them).
    kept: Arc<KeptConnections>,
}

const CLAIM_SQL: &str = r#"
WITH claimed AS (
    INSERT INTO dedup_worker.idempotency_keys AS k
        (account, key, fingerprint, status, claim_token, locked_until, created_at, expires_at)
    VALUES ($1, $2, $3, 'in_progress', $4::uuid,
            now() + $5::bigint * interval '1 millisecond', now(),
            now() + $6::bigint * interval '1 millisecond')
    ON CONFLICT (account, key) DO UPDATE
        SET fingerprint = EXCLUDED.fingerprint,
            status = 'in_progress',
            claim_token = EXCLUDED.claim_token,
            locked_until = EXCLUDED.locked_until,
            response_status = NULL,
            response_headers = NULL,
            response_body = NULL,
            -- The same request taking over its own running (or released) claim resumes at its
            -- recovery point; anything else starts from none.
            recovery_point = CASE WHEN k.status = 'in_progress'
                                   AND k.fingerprint = EXCLUDED.fingerprint
                                   AND k.expires_at > now()
                                  THEN k.recovery_point END,
            phase_data = CASE WHEN k.status = 'in_progress'
                               AND k.fingerprint = EXCLUDED.fingerprint
                               AND k.expires_at > now()
                              THEN k.phase_data END,
            created_at = EXCLUDED.created_at,
            expires_at = EXCLUDED.expires_at
        -- A completed key is taken over only once expired; a running one only once its lease
        -- ended (never while it runs, even past its TTL), by the same request or, past the
        -- TTL, by any.
        WHERE (k.status = 'completed' AND k.expires_at <= now())
           OR (k.status = 'in_progress' AND k.locked_until <= now()
               AND (k.fingerprint = EXCLUDED.fingerprint OR k.expires_at <= now()))
    RETURNING 1
)
SELECT true AS claimed, NULL::bytea AS fingerprint, NULL::text AS status,
       NULL::bigint AS lease_ms, NULL::bigint AS ttl_ms, NULL::int2 AS response_status,
       NULL::jsonb AS response_headers, NULL::bytea AS response_body
FROM claimed
UNION ALL
SELECT false, k.fingerprint, k.status,
       GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::bigint,
       GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint,
       k.response_status, k.response_headers, k.response_body
FROM dedup_worker.idempotency_keys k
WHERE k.account = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
  -- An expired result seen in this statement's snapshot may already have been taken over by
  -- a transaction we waited on; leave it to the fresh read below rather than replay it.
  AND NOT (k.status = 'completed' AND k.expires_at <= now())
"#;

// Used only when the claim statement's snapshot could not see a row that a concurrent
// statement committed while we waited on it (READ COMMITTED): a fresh statement sees it.
const READ_SQL: &str = r#"
SELECT false AS claimed, k.fingerprint, k.status,
       GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::bigint AS lease_ms,
       GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint AS ttl_ms,
       k.response_status, k.response_headers, k.response_body
FROM dedup_worker.idempotency_keys k
WHERE k.account = $1 AND k.key = $2 AND NOT (k.status = 'completed' AND k.expires_at <= now())
"#;

impl PgIdempotencyStore {
    /// Wraps a pool, grouping concurrent first claims and completions with the default
    /// [`GroupOptions`]. The table must exist (see [`migrate`](Self::migrate)).
    pub fn new(pool: PgPool) -> Self {
        Self {
            kept: Arc::new(KeptConnections::for_pool(&pool)),
            pool,
            queries: Arc::new(AtomicU64::new(0)),
            grouping: Some(GroupOptions::default()),
            groups: Arc::new(OnceLock::new()),
        }
    }

    /// Sets how statements are grouped (`None`: one statement per claim and completion).
    pub fn with_grouping(mut self, grouping: Option<GroupOptions>) -> Self {
        self.grouping = grouping;
        self.groups = Arc::new(OnceLock::new());
        self
    }

    /// The group writers, for a request whose account can be written with others. PostgreSQL
    /// text cannot hold NUL, so such an account (from a custom extractor) would fail the whole
    /// statement: it goes on its own and fails alone.
    fn groups_for(&self, account: &str) -> Option<&Groups> {
        if account.contains('\0') {
            return None;
        }
        let options = self.grouping?;
        Some(self.groups.get_or_init(|| {
            let queries = self.queries.clone();
            let on_statement = Arc::new(move || count_statement(&queries));
            Groups::start(&self.pool, options, on_statement)
        }))
    }

    /// Applies this crate's PostgreSQL migrations on a connection of `pool`, into schema
    /// `dedup_worker`, beside the pipeline's if the database has them (`dedup_db::schema`).
    /// The pool is the application's: its tables and its
    /// own migration history stay where its `search_path` puts them (`public` by default),
    /// which is why this module's SQL names `dedup_worker.idempotency_keys` in full.
    pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        use dedup_db::schema::SchemaError;
        dedup_db::schema::migrate(pool, sqlx::migrate!("migrations/postgres"))
            .await
            .map_err(|e| match e {
                SchemaError::Database(e) => StoreError::Database(e),
                SchemaError::Migrate(e) => StoreError::Migrate(e),
                SchemaError::Layout(e) => StoreError::Layout(e),
                // `SchemaError` is non-exhaustive: a later kind is still a failed migration.
                other => StoreError::Database(sqlx::Error::Protocol(other.to_string())),
            })
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A transaction for a request's handler or phase, on a connection the store keeps between
    /// such transactions (see `request_tx`).
    pub(crate) async fn begin_request_tx(&self) -> Result<RequestTx, sqlx::Error> {
        RequestTx::begin(&self.pool, &self.kept).await
    }

    /// How many statements this store has sent to PostgreSQL (lets the tests and the load
    /// harness show that Redis replays do not touch PostgreSQL; see `test_util`).
    #[cfg(feature = "test-util")]
    pub(crate) fn query_count(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    fn count(&self) {
        count_statement(&self.queries);
    }

    /// Claims `(account, key)` for a request with `fingerprint`, or reports what holds it; and
    /// whether the claim created the key's row: a new key has no recorded phases, so the layer
    /// need not read them. `false` whenever it cannot tell
    /// (a takeover, or the single-row statement).
    pub(crate) async fn claim_noting_new(
        &self,
        account: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<(Claim, bool), StoreError> {
        // The common cases, a key never seen (created) and a key with a stored result or a
        // running claim (read), are decided by the grouped statement. Anything else (a lease
        // to take over, an expired key, a key another statement was writing) is decided
        // below, one statement per request.
        if let Some(groups) = self.groups_for(account) {
            let decided = groups
                .claim(NewClaim {
                    account: account.to_owned(),
                    key: key.to_owned(),
                    fingerprint: *fingerprint,
                    token: Uuid::new_v4(),
                    lease_ms: millis(lease),
                    ttl_ms: millis(ttl),
                })
                .await;
            match decided {
                // The grouped statement acquires only keys it inserted.
                Ok(Some(claim @ Claim::Acquired(_))) => return Ok((claim, true)),
                Ok(Some(claim)) => return Ok((claim, false)),
                // Undecided, or the writer is gone: one statement of our own decides.
                Ok(None) | Err(StoreError::GroupClosed) => {}
                Err(error) => return Err(error),
            }
        }
        // Bounded: each loop means a concurrent statement changed the row under us, which
        // cannot keep happening to one caller.
        for _ in 0..5 {
            let token = Uuid::new_v4();
            self.count();
            let row = sqlx::query(CLAIM_SQL)
                .bind(account)
                .bind(key)
                .bind(&fingerprint.0[..])
                .bind(token.to_string())
                .bind(millis(lease))
                .bind(millis(ttl))
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                return decode(&row, token).map(|claim| (claim, false));
            }
            self.count();
            let row = sqlx::query(READ_SQL)
                .bind(account)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                return decode(&row, token).map(|claim| (claim, false));
            }
            // The row was deleted (expired and collected) in between: claim again.
        }
        Err(StoreError::Corrupt("claim did not converge"))
    }

    /// Stores the response of a claimed request.
    pub(crate) async fn complete(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        response: &StoredResponse,
    ) -> Result<Ownership, StoreError> {
        if let Some(groups) = self.groups_for(account) {
            let stored = groups
                .complete(NewCompletion {
                    account: account.to_owned(),
                    key: key.to_owned(),
                    token: token.0,
                    response: response.clone(),
                })
                .await;
            match stored {
                Ok(Completed::Stored { ttl_ms }) => {
                    return Ok(Ownership::Owned {
                        ttl: duration_ms(ttl_ms),
                    })
                }
                Ok(Completed::Lost) => return Ok(Ownership::Lost),
                // The group's statement was refused, or the writer is gone: our own statement
                // stores it (guarded by the token, so it cannot write twice).
                Ok(Completed::Alone) | Err(StoreError::GroupClosed) => {}
                Err(error) => return Err(error),
            }
        }
        self.count();
        let row = complete_query(account, key, token, response)
            .fetch_optional(&self.pool)
            .await?;
        decode_completion(row)
    }

    /// Stores the response of a claimed request inside `tx`, the transaction the handler wrote
    /// in (see [`IdempotentTx`](super::IdempotentTx)): it becomes visible, with the handler's
    /// rows, when `tx` commits. `Lost` if the claim was taken over meanwhile; the caller then
    /// rolls back.
    pub(crate) async fn complete_in(
        &self,
        tx: &mut sqlx::PgConnection,
        account: &str,
        key: &str,
        token: ClaimToken,
        response: &StoredResponse,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let row = complete_query(account, key, token, response)
            .fetch_optional(tx)
            .await?;
        decode_completion(row)
    }

    /// Gives the key up so that a retry executes again (5xx results, panics). A request that
    /// has recorded a phase keeps its progress: its row stays, unclaimed and with its lease
    /// ended, so the retry (the same request) takes it over at once and resumes there.
    pub(crate) async fn release(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let released: i64 = sqlx::query_scalar(
            r#"WITH forgotten AS (
                   DELETE FROM dedup_worker.idempotency_keys
                   WHERE account = $1 AND key = $2 AND claim_token = $3::uuid
                     AND status = 'in_progress' AND recovery_point IS NULL
                   RETURNING 1),
               kept AS (
                   UPDATE dedup_worker.idempotency_keys SET claim_token = NULL, locked_until = now()
                   WHERE account = $1 AND key = $2 AND claim_token = $3::uuid
                     AND status = 'in_progress' AND recovery_point IS NOT NULL
                   RETURNING 1)
               SELECT (SELECT count(*) FROM forgotten) + (SELECT count(*) FROM kept)"#,
        )
        .bind(account)
        .bind(key)
        .bind(token.0.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(if released == 1 {
            Ownership::Owned {
                ttl: Duration::ZERO,
            }
        } else {
            Ownership::Lost
        })
    }

    /// Extends the lease of a claim still held (a heartbeat for handlers slower than the lease).
    pub(crate) async fn extend(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let done = sqlx::query(
            r#"UPDATE dedup_worker.idempotency_keys SET locked_until = now() + $4::bigint * interval '1 millisecond',
                      expires_at = GREATEST(expires_at, now() + $4::bigint * interval '1 millisecond')
               WHERE account = $1 AND key = $2 AND claim_token = $3::uuid AND status = 'in_progress'"#,
        )
        .bind(account)
        .bind(key)
        .bind(token.0.to_string())
        .bind(millis(lease))
        .execute(&self.pool)
        .await?;
        Ok(if done.rows_affected() == 1 {
            Ownership::Owned { ttl: lease }
        } else {
            Ownership::Lost
        })
    }

    /// Deletes at most `batch` expired keys; returns how many were deleted.
    pub async fn delete_expired_batch(&self, batch: i64) -> Result<u64, StoreError> {
        self.count();
        // SKIP LOCKED: a row being taken over right now is left for the next pass, and several
        // collectors never block each other.
        let done = sqlx::query(
            r#"DELETE FROM dedup_worker.idempotency_keys
               WHERE (account, key) IN (
                   SELECT account, key FROM dedup_worker.idempotency_keys
                   WHERE expires_at <= now()
                     AND (status = 'completed' OR locked_until <= now())
                   LIMIT $1
                   FOR UPDATE SKIP LOCKED)"#,
        )
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Deletes all expired keys, `batch` rows per statement; returns the total.
    pub async fn delete_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let n = self.delete_expired_batch(batch).await?;
            total += n;
            if n < batch.max(1) as u64 {
                return Ok(total);
            }
        }
    }

    /// Spawns a task that deletes expired keys every `every`. Abort the handle to stop it.
    pub fn spawn_expiry_task(&self, every: Duration, batch: i64) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match store.delete_expired(batch).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(deleted = n, "expired idempotency keys deleted"),
                    Err(e) => {
                        tracing::warn!(error = %e, "deleting expired idempotency keys failed")
                    }
                }
            }
        })
    }
}

const COMPLETE_SQL: &str = r#"
UPDATE dedup_worker.idempotency_keys
   SET status = 'completed', claim_token = NULL, locked_until = NULL,
       response_status = $4, response_headers = $5, response_body = $6
 WHERE account = $1 AND key = $2 AND claim_token = $3::uuid AND status = 'in_progress'
RETURNING GREATEST(0, floor(extract(epoch FROM (expires_at - now())) * 1000))::bigint
"#;

/// The token-guarded completion of one key (the grouped statement does the same for many).
fn complete_query<'q>(
    account: &'q str,
    key: &'q str,
    token: ClaimToken,
    response: &'q StoredResponse,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(COMPLETE_SQL)
        .bind(account)
        .bind(key)
        .bind(token.0.to_string())
        .bind(response.status as i16)
        .bind(Json(&response.headers))
        .bind(&response.body[..])
}

/// A completion's row: the key's remaining TTL, or no row when the token no longer holds it.
fn decode_completion(row: Option<sqlx::postgres::PgRow>) -> Result<Ownership, StoreError> {
    Ok(match row {
        Some(row) => Ownership::Owned {
            ttl: duration_ms(row.try_get::<i64, _>(0)?),
        },
        None => Ownership::Lost,
    })
}

fn count_statement(queries: &AtomicU64) {
    queries.fetch_add(1, Ordering::Relaxed);
    metrics::counter!("idempotency_pg_queries_total").increment(1);
}

fn decode(row: &sqlx::postgres::PgRow, token: Uuid) -> Result<Claim, StoreError> {
    if row.try_get::<bool, _>("claimed")? {
        return Ok(Claim::Acquired(ClaimToken(token)));
    }
    decode_existing(row)
}
