//! The grouped statement: one round trip that creates new keys, stores completions and reads
//! the keys it could not create, and the session settings that keep its plan good.
//!
//! One statement for both kinds, because the point of grouping is to pay PostgreSQL's
//! per-statement cost once. Its plan is pinned (nested loop of primary-key probes, made once):
//! the planner, left alone, caches a plan made while the table was small and keeps reading the
//! whole table after it has grown. Everything it decides is re-checked by the primary key and
//! the claim token, so a row it does not decide goes back to the single-row statements.

use std::time::Duration;

use sqlx::types::Json;

use super::{ClaimEntry, CompletionEntry};

// `$1..$6`: the claims, inserted in `(account, key)` order: whatever this statement waits on
// (another statement's uncommitted row for one of its keys), it waits for in a fixed order.
const CLAIMS_CTE: &str = r#"
claimed AS (
    INSERT INTO dedup_worker.idempotency_keys AS k
        (account, key, fingerprint, status, claim_token, locked_until, created_at, expires_at)
    SELECT u.account, u.key, u.fingerprint, 'in_progress', u.token,
           now() + u.lease_ms * interval '1 millisecond', now(),
           now() + u.ttl_ms * interval '1 millisecond'
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], $5::int8[], $6::int8[])
         AS u(account, key, fingerprint, token, lease_ms, ttl_ms)
    ORDER BY u.account, u.key
    ON CONFLICT (account, key) DO NOTHING
    RETURNING k.claim_token
)"#;

// `$7..$12`: the completions.
const COMPLETIONS_CTE: &str = r#"
completed AS (
    UPDATE dedup_worker.idempotency_keys AS k
       SET status = 'completed', claim_token = NULL, locked_until = NULL,
           response_status = u.status, response_headers = u.headers, response_body = u.body
      FROM unnest($7::text[], $8::text[], $9::uuid[], $10::int2[], $11::jsonb[], $12::bytea[])
           AS u(account, key, token, status, headers, body)
     WHERE k.account = u.account AND k.key = u.key AND k.claim_token = u.token
       AND k.status = 'in_progress'
    RETURNING u.token,
              GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint AS ttl_ms
)"#;

// `$1, $2, $4`: the claimed keys that existed when the statement started and can be answered
// without a takeover: a stored result that has not expired, a claim whose lease runs.
const FOUND_CTE: &str = r#"
found AS (
    SELECT u.token, k.fingerprint, k.status,
           GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::bigint AS lease_ms,
           GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint AS ttl_ms,
           k.response_status, k.response_headers, k.response_body
      FROM unnest($1::text[], $2::text[], $4::uuid[]) AS u(account, key, token)
      JOIN dedup_worker.idempotency_keys AS k ON k.account = u.account AND k.key = u.key
     WHERE (k.status = 'completed' AND k.expires_at > now())
        OR (k.status = 'in_progress' AND k.locked_until > now())
)"#;

/// One statement for both kinds; either array set may be empty. Rows, by `kind`: `created`
/// (a claim's token), `completed` (a completion's token and `ttl_ms`), `found` (a claim's
/// token and the row it found).
pub(super) fn group_sql() -> String {
    format!(
        "WITH {CLAIMS_CTE},{COMPLETIONS_CTE},{FOUND_CTE}\n\
         SELECT 'created' AS kind, claim_token AS token, NULL::bigint AS ttl_ms,\n\
                NULL::bytea AS fingerprint, NULL::text AS status, NULL::bigint AS lease_ms,\n\
                NULL::int2 AS response_status, NULL::jsonb AS response_headers,\n\
                NULL::bytea AS response_body\n\
           FROM claimed\n\
         UNION ALL SELECT 'completed', token, ttl_ms, NULL, NULL, NULL, NULL, NULL, NULL\n\
           FROM completed\n\
         UNION ALL SELECT 'found', token, ttl_ms, fingerprint, status, lease_ms,\n\
                response_status, response_headers, response_body\n\
           FROM found"
    )
}

/// Session settings of a writer's connection, set once after it connects (see the module's
/// guarantees): the only plan left is a nested loop of primary-key probes, made once and
/// reused; the statement runs at READ COMMITTED whatever the server's default (the `found`
/// read and `DO NOTHING` rely on it). [`writer_settings`] adds the statement timeout.
const WRITER_SETTINGS: &str = "SET plan_cache_mode = force_generic_plan; \
     SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; \
     SET default_transaction_isolation = 'read committed'";

/// [`WRITER_SETTINGS`], and PostgreSQL's own `statement_timeout` at the writer's: the server
/// gives up a statement the writer has stopped waiting for.
pub(super) fn writer_settings(statement_timeout: Duration) -> String {
    format!(
        "{WRITER_SETTINGS}; SET statement_timeout = {}",
        statement_timeout.as_millis().max(1)
    )
}

/// The grouped statement with its arrays bound.
pub(super) fn group_query<'q>(
    sql: &'q str,
    claims: &'q [ClaimEntry],
    completions: &'q [CompletionEntry],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let claims = claims.iter().map(|(c, _)| c);
    let completions = completions.iter().map(|(c, _)| c);
    sqlx::query(sql)
        .bind(
            claims
                .clone()
                .map(|c| c.account.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(claims.clone().map(|c| c.key.as_str()).collect::<Vec<_>>())
        .bind(
            claims
                .clone()
                .map(|c| &c.fingerprint.0[..])
                .collect::<Vec<_>>(),
        )
        .bind(claims.clone().map(|c| c.token).collect::<Vec<_>>())
        .bind(claims.clone().map(|c| c.lease_ms).collect::<Vec<_>>())
        .bind(claims.map(|c| c.ttl_ms).collect::<Vec<_>>())
        .bind(
            completions
                .clone()
                .map(|c| c.account.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .clone()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(completions.clone().map(|c| c.token).collect::<Vec<_>>())
        .bind(
            completions
                .clone()
                .map(|c| c.response.status as i16)
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .clone()
                .map(|c| Json(&c.response.headers))
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .map(|c| &c.response.body[..])
                .collect::<Vec<_>>(),
        )
}
