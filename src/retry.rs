//! Retry decisions: backoff delays for redeliveries (consumer) and delivery attempts (outbox
//! relay), and which database errors no retry can cure.
//!
//! The delay is stored with the message or row rather than slept in memory, so it survives
//! restarts; this module only computes it, with `backon`'s exponential builder and jitter.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The delay before attempt `attempt + 1`, after `attempt` failures (1-based): exponential from
/// `base`, capped at `max`, with jitter so many failures do not retry in lock-step.
pub fn backoff_delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    let n = attempt.clamp(1, 64) as usize;
    ExponentialBuilder::default()
        .with_min_delay(base)
        .with_max_delay(max)
        .with_max_times(n)
        .with_jitter()
        .build()
        .nth(n - 1)
        .unwrap_or(max)
}

/// Whether the database refused a statement for the values it carried: PostgreSQL's SQLSTATE
/// classes 22 (data exception: a NUL in text, an invalid byte sequence, a value out of range)
/// and 54 (program limit exceeded: an index row larger than a B-tree page allows), SQLite's
/// `SQLITE_TOOBIG`. The same values fail again however often they are retried, so a statement
/// shared by several rows must be split and the offending row given its own, permanent error;
/// any other failure (connection lost, deadlock, timeout) is worth retrying as a whole.
pub fn refused_for_its_data(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    let Some(code) = db.code() else {
        return false;
    };
    code.starts_with("22") || code.starts_with("54") || code == "18"
}

/// A duration as the `bigint` milliseconds SQL statements bind; one too long for that saturates
/// (a TTL or lease of centuries means "never", not an error). Shared by the pipeline's store and
/// the idempotency store.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_is_capped() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let first = backoff_delay(base, max, 1);
        assert!(first >= base && first <= base * 2, "{first:?}");
        let fourth = backoff_delay(base, max, 4);
        assert!(fourth >= base * 8, "{fourth:?}");
        assert!(backoff_delay(base, max, 40) <= max * 2);
    }
}
