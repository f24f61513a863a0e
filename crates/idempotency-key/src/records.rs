//! The records of a key as the store keeps them and the layer reads them: what a claim found
//! ([`Claim`]), the proof of holding one ([`ClaimToken`]), what a write did ([`Ownership`]), the
//! stored response, and the store's errors.
//!
//! A leaf: the single-row store ([`super::store`]) and the grouped writers ([`super::group`])
//! both speak in these types and decode the same row shape, so the types live below both and
//! import neither. Everything here is plain data; which statement produced a row, and how races
//! between requests are decided, is the store's and the group's business.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::Row;
use uuid::Uuid;

use super::fingerprint::Fingerprint;

/// Errors from the PostgreSQL store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or is unreachable.
    #[error("idempotency store: {0}")]
    Database(#[from] sqlx::Error),
    /// The migration failed.
    #[error("idempotency migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The library's tables could not be put in their place (schema `dedup_worker`).
    #[error(transparent)]
    Layout(#[from] dedup_db::schema::LayoutError),
    /// A stored row does not have the expected shape.
    #[error("idempotency store: corrupt row: {0}")]
    Corrupt(&'static str),
    /// The grouped statement carrying this request failed (shared by its whole group).
    #[error("{0} (grouped statement)")]
    Grouped(Arc<StoreError>),
    /// The group writers are gone (the runtime is shutting down).
    #[error("idempotency store: group writer stopped")]
    GroupClosed,
    /// A grouped statement took longer than its timeout.
    #[error("idempotency store: grouped statement took longer than {0:?}")]
    GroupTimedOut(Duration),
}

/// A response as stored and replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// The headers that matter (see `keep_header` in layer/stored.rs), in order.
    pub headers: Vec<(String, String)>,
    /// The full body.
    pub body: Bytes,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the key and must run the request, then `complete` or `release`.
    Acquired(ClaimToken),
    /// Another request holds the key; its lease has `retry_after` left.
    InProgress {
        /// Fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// Time until the lease ends.
        retry_after: Duration,
    },
    /// The key has a stored result.
    Completed {
        /// Fingerprint of the request that produced it.
        fingerprint: Fingerprint,
        /// The stored response.
        response: StoredResponse,
        /// Time until the key expires (for mirroring to Redis with the same TTL).
        ttl: Duration,
    },
}

/// Proof of holding a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimToken(pub Uuid);

/// Result of `complete`, `release` and `extend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The row still held our claim and was updated; for `complete`, `ttl` is the time the
    /// stored result has left.
    Owned {
        /// Remaining lifetime of the key.
        ttl: Duration,
    },
    /// Our lease had been taken over (or the row deleted): nothing was written.
    Lost,
}

pub(super) use dedup_db::backoff::millis;

/// The milliseconds a statement computed, as a duration; the statements clamp at zero already,
/// so a negative value (clock trouble) reads as "none left".
pub(super) fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A row someone else holds or completed: `fingerprint`, `status`, `lease_ms`, `ttl_ms` and the
/// `response_*` columns. The single-row claim and the grouped statement return this same shape,
/// so both decide alike what a found row means.
pub(super) fn decode_existing(row: &PgRow) -> Result<Claim, StoreError> {
    let fp: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint = Fingerprint::from_slice(&fp).ok_or(StoreError::Corrupt("fingerprint"))?;
    let status: String = row.try_get("status")?;
    if status == "in_progress" {
        let lease_ms: Option<i64> = row.try_get("lease_ms")?;
        return Ok(Claim::InProgress {
            fingerprint,
            retry_after: duration_ms(lease_ms.unwrap_or(0)),
        });
    }
    let code: Option<i16> = row.try_get("response_status")?;
    let code = code.ok_or(StoreError::Corrupt("response_status"))?;
    let headers: Option<Json<Vec<(String, String)>>> = row.try_get("response_headers")?;
    let body: Option<Vec<u8>> = row.try_get("response_body")?;
    let ttl_ms: Option<i64> = row.try_get("ttl_ms")?;
    Ok(Claim::Completed {
        fingerprint,
        response: StoredResponse {
            status: u16::try_from(code).map_err(|_| StoreError::Corrupt("response_status"))?,
            headers: headers.map(|h| h.0).unwrap_or_default(),
            body: Bytes::from(body.unwrap_or_default()),
        },
        ttl: duration_ms(ttl_ms.unwrap_or(0)),
    })
}
