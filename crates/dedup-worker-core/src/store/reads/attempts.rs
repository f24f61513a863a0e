//! One event's delivery attempts and the operator's acts on its deliveries (`outbox_attempts`),
//! in the order they were recorded: the event page's timeline and `events show`'s `attempts`.
//! Found by the event's dedup key (`outbox_attempts_event`), so they outlive the outbox rows;
//! the lower bound on `at` prunes the PostgreSQL partitions older than the event.

use super::Reads;
use crate::store::dedup::dedup_key;
use crate::store::{Pool, StoreError};

/// One recorded attempt (or operator act) on one of an event's deliveries.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AttemptRecord {
    /// When it was recorded (the mark's transaction), Unix milliseconds.
    pub at: i64,
    /// The outbox row it was made on (it may be gone since).
    pub outbox_id: i64,
    /// The row's attempt number; 0 for an operator's act.
    pub attempt: i32,
    /// `delivered`, `failed`, `gave_up`, `throttled`, `probe_failed`; an operator's `retry`,
    /// `resend` or `skip`.
    pub kind: String,
    /// The lane (`outbox.sink`).
    pub lane: String,
    /// The lane's destination as shown (no token of a webhook URL).
    pub destination: Option<String>,
    /// The relay's clock when the request left, Unix milliseconds.
    pub started_at: Option<i64>,
    /// How long the answer took.
    pub duration_ms: Option<i32>,
    /// The receiver's HTTP status; `None`: no answer, or not HTTP.
    pub status: Option<i32>,
    /// The sink's error.
    pub error: Option<String>,
    /// The answer's headers as kept (redacted): JSON `[[name, value], …]`; see
    /// [`AttemptRecord::headers`].
    pub response_headers: Option<String>,
    /// The first bytes of the answer's body.
    pub response_body: Option<Vec<u8>>,
    /// Whether the body went on past [`AttemptRecord::response_body`].
    pub body_truncated: bool,
    /// Who acted (operator entries): `console (ops)`, `cli (alice)`.
    pub actor: Option<String>,
}

impl AttemptRecord {
    /// The answer's headers, in the order received.
    pub fn headers(&self) -> Vec<(String, String)> {
        self.response_headers
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default()
    }
}

impl Reads<'_> {
    /// The event's attempts and operator acts recorded at or after `since` (Unix ms: the
    /// event's `processed_at`, or 0), in the order recorded, at most `limit`.
    pub async fn attempts_of(
        self,
        source: &str,
        event_id: &str,
        since: i64,
        limit: i64,
    ) -> Result<Vec<AttemptRecord>, StoreError> {
        let key = dedup_key(source, event_id);
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT floor(extract(epoch FROM at) * 1000)::int8 AS at, outbox_id, attempt,
                            kind, lane, destination,
                            floor(extract(epoch FROM started_at) * 1000)::int8 AS started_at,
                            duration_ms, status::int4 AS status, error, response_headers,
                            response_body, body_truncated, actor
                       FROM outbox_attempts
                      WHERE event_key = $1 AND at >= to_timestamp($2 / 1000.0)
                      ORDER BY at, outbox_id, attempt LIMIT $3",
                )
                .bind(uuid::Uuid::from_bytes(key))
                .bind(since as f64)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(
                    "SELECT at, outbox_id, attempt, kind, lane, destination, started_at,
                            duration_ms, status, error, response_headers, response_body,
                            body_truncated, actor
                       FROM outbox_attempts
                      WHERE event_key = $1 AND at >= $2
                      ORDER BY at, id LIMIT $3",
                )
                .bind(key.as_slice())
                .bind(since)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
        })
    }
}
