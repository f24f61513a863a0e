//! Backoff delays and durations as SQL binds them.
//!
//! The delay is computed here, with `backon`'s exponential builder and jitter; callers store it
//! with a message or row (so it survives restarts) or sleep it (a breaker, a reconnect loop).

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

    #[test]
    fn millis_saturate() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
