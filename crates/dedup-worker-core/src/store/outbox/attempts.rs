//! What the relay's marks record in `outbox_attempts` (migration `…040_outbox_attempts`): one
//! row per delivery attempt, written by the mark's own statement (PostgreSQL) or transaction
//! (SQLite), so recording costs no round trip of its own. Kept apart from `marks.rs` so the
//! columns are named once for every statement that writes them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::{OutboxClaim, Shard};

/// The most characters of a sink's error kept with an attempt.
pub const ERROR_CHARS: usize = 1024;

/// The table's PostgreSQL partitions' prefix (`outbox_attempts_pYYYYMMDD`, UTC days).
pub const ATTEMPTS_TABLE: &str = "outbox_attempts";

/// One delivery attempt as the relay saw it, recorded with the mark of its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptMark {
    /// The row and the claim that sent it.
    pub claim: OutboxClaim,
    /// `dedup_key(source, event_id)` of the row's event: the event page finds its attempts by
    /// it, after the outbox row is gone.
    pub event_key: [u8; 16],
    /// The row's `attempts` when it was claimed for this attempt.
    pub attempt: i32,
    /// The relay's clock when the request left.
    pub started_at: DateTime<Utc>,
    /// How long the sink took to answer, in milliseconds.
    pub duration_ms: i32,
    /// The receiver's HTTP status; `None`: no answer, or not HTTP.
    pub status: Option<i16>,
    /// The sink's error, printable, at most `ERROR_CHARS` characters; `None` when delivered.
    pub error: Option<String>,
    /// The answer's headers, redacted, as JSON `[[name, value], …]`.
    pub headers: Option<String>,
    /// The first `outbox.response_excerpt_bytes` of the answer's body.
    pub body: Option<Vec<u8>>,
    /// Whether the body went on past [`AttemptMark::body`].
    pub truncated: bool,
}

/// A failed attempt, with what its row's mark needs: when to try again and after how many
/// attempts to give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMark {
    /// The attempt to record.
    pub attempt: AttemptMark,
    /// The row is due again after this (unless it gave up).
    pub delay: Duration,
    /// The row is marked `failed` once its `attempts` reached this.
    pub max_attempts: u32,
}

/// Where a lane's attempts went, recorded with each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptLane<'a> {
    /// The lane (`outbox.sink`).
    pub lane: &'a str,
    /// The lane's destination as shown (`config::shown_destination`): a webhook URL's token
    /// never reaches the table.
    pub destination: Option<&'a str>,
    /// Whether attempts are recorded at all (`retention.payload_days > 0`); the marks are made
    /// and counted either way.
    pub record: bool,
    /// The lane's shard of the per-minute counts (`activity_minutes`) its marks add to, taken
    /// once at its start.
    pub shard: Shard,
}

/// How an attempt ended, as `outbox_attempts.kind` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// The receiver took it.
    Delivered,
    /// It failed; the row is retried.
    Failed,
    /// It failed and the row reached `max_attempts`: marked failed.
    GaveUp,
    /// The receiver asked for time (`Retry-After`); the attempt was given back.
    Throttled,
    /// A probe of an open circuit failed; the attempt was given back.
    ProbeFailed,
}

impl AttemptKind {
    /// The `kind` column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::Delivered => "delivered",
            AttemptKind::Failed => "failed",
            AttemptKind::GaveUp => "gave_up",
            AttemptKind::Throttled => "throttled",
            AttemptKind::ProbeFailed => "probe_failed",
        }
    }
}

/// The columns every attempt insert names, in the order the statements give them.
pub(super) const COLUMNS: &str = "event_key, outbox_id, attempt, kind, lane, destination, \
     started_at, duration_ms, status, error, response_headers, response_body, body_truncated";

/// Unix milliseconds of the last "history not kept" warning, so it is logged at most once a
/// minute (the counter counts every row).
static LAST_NOT_KEPT_WARNING: AtomicI64 = AtomicI64::new(0);

/// `fresh` attempts were to be recorded and `kept` were: the rest found no partition for today
/// (PostgreSQL maintenance has not made it). Counted in `dedup_history_not_kept_total{table}`,
/// warned at most once a minute.
pub(super) fn report_not_kept(lane: &AttemptLane<'_>, fresh: i64, kept: i64) {
    if !lane.record || kept >= fresh {
        return;
    }
    let missing = u64::try_from(fresh - kept).unwrap_or(0);
    metrics::counter!("dedup_history_not_kept_total", "table" => ATTEMPTS_TABLE).increment(missing);
    let now = Utc::now().timestamp_millis();
    let last = LAST_NOT_KEPT_WARNING.load(Ordering::Relaxed);
    if now - last >= 60_000
        && LAST_NOT_KEPT_WARNING
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            table = ATTEMPTS_TABLE,
            rows = missing,
            "today's partition is missing: delivery attempts are not recorded (the marks are); \
             run the retention pass, which makes the coming days' partitions"
        );
    }
}
