//! Pacing a lane's deliveries: the delay a receiver asks for with `Retry-After`, and a local
//! token bucket that keeps the lane under its configured rate.
//!
//! Both are pure: [`retry_after`] reads headers against a given clock reading, and [`Pacer`]
//! decides against a given instant ([`Pacer::until_ready`] is the only part that sleeps). The
//! bucket is kept as a generic cell rate algorithm (one "theoretical arrival time" in integer
//! time) rather than a fractional token count, so a rate of 10 a second grants exactly one token
//! each 100 ms, with no rounding drift to make a waiter wake a hair too early.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::HeaderMap;
use tokio::time::Instant;

/// The delay a 429/503 response's `Retry-After` asks for: delta-seconds (`3`, surrounding
/// whitespace tolerated) or an HTTP-date, relative to `now` (a past date is
/// [`Duration::ZERO`]). `None` when absent or unparsable; the caller then treats the answer as
/// an ordinary failure. Not capped here.
///
/// Of several `Retry-After` fields the first counts. Delta-seconds too large for a `u64` read as
/// `u64::MAX` seconds (the value is well-formed, only long; the caller's cap applies). Besides the
/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 and asctime forms are
/// read, as RFC 9110 §5.6.7 asks of recipients.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if value.is_empty() {
        return None;
    }
    // Digits only: `u64::from_str` would also take "+3", which the grammar does not.
    if value.bytes().all(|b| b.is_ascii_digit()) {
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds));
    }
    let at = http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An HTTP-date in any of its three forms, as a clock reading.
fn http_date(value: &str) -> Option<SystemTime> {
    if let Ok(at) = chrono::DateTime::parse_from_rfc2822(value) {
        return Some(at.into());
    }
    // RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime ("Sun Nov  6 08:49:37 1994"),
    // both in GMT. chrono reads a two-digit year 70-99 as 19xx and 00-69 as 20xx.
    ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"]
        .iter()
        .find_map(|format| chrono::NaiveDateTime::parse_from_str(value, format).ok())
        .map(|naive| naive.and_utc().into())
}

/// A token bucket: `rate_per_sec` tokens a second, at most `burst` saved up, starting full.
/// Shared by one lane's concurrent deliveries; the lock is held only to read and update the
/// bucket, never across an await.
#[derive(Debug)]
pub struct Pacer {
    /// The time one token takes to accrue (1 / rate, rounded up to the nanosecond so the
    /// granted rate never exceeds the configured one).
    interval: Duration,
    /// How far ahead of now the bucket may be drawn: (burst - 1) intervals. A full bucket can
    /// grant `burst` tokens at once.
    tolerance: Duration,
    /// When the bucket would next be full again if nothing more were taken (the theoretical
    /// arrival time); `None` before the first take, when it is full.
    full_at: Mutex<Option<Instant>>,
}

impl Pacer {
    /// # Panics
    /// When `rate_per_sec` is not a positive finite number (the configuration rejects those).
    /// A `burst` of 0 is read as 1.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        assert!(
            rate_per_sec.is_finite() && rate_per_sec > 0.0,
            "a pacer's rate must be positive, not {rate_per_sec}"
        );
        // `as` saturates: a rate below one token in ~584 years waits that long.
        let nanos = (1e9 / rate_per_sec).ceil().max(1.0) as u64;
        let interval = Duration::from_nanos(nanos);
        Pacer {
            interval,
            tolerance: interval.saturating_mul(burst.max(1) - 1),
            full_at: Mutex::new(None),
        }
    }

    /// Takes a token if one is there; else `Err` with how long until one is.
    pub fn try_take(&self) -> Result<(), Duration> {
        self.try_take_at(Instant::now())
    }

    /// [`Self::try_take`] at `now`. Instants earlier than one already seen are read as that
    /// one's time (tokens never un-accrue).
    fn try_take_at(&self, now: Instant) -> Result<(), Duration> {
        // A poisoned lock means a panic between reading and writing one `Option<Instant>`,
        // which leaves it valid; pacing goes on.
        let mut full_at = self.full_at.lock().unwrap_or_else(|e| e.into_inner());
        let drawn_from = full_at.map_or(now, |at| at.max(now));
        let ahead = drawn_from - now;
        if ahead > self.tolerance {
            return Err(ahead - self.tolerance);
        }
        *full_at = Some(drawn_from + self.interval);
        Ok(())
    }

    /// Waits until a token is taken. Cancel-safe: a waiter dropped while sleeping has taken
    /// nothing. Concurrent waiters race for each token as it accrues; each that loses sleeps
    /// again for the time its next try names.
    pub async fn until_ready(&self) {
        while let Err(wait) = self.try_take() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use proptest::prelude::*;

    use super::*;
    use crate::proptest_support::config;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    /// 1994-11-06T08:49:37Z, the date in RFC 9110's examples.
    fn example_date() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    #[test]
    fn delta_seconds() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&headers(" 120\t"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after(&headers("0"), now), Some(Duration::ZERO));
        let huge = headers("99999999999999999999999");
        assert_eq!(retry_after(&huge, now), Some(Duration::from_secs(u64::MAX)));
    }

    #[test]
    fn http_date_in_the_future() {
        let now = example_date() - Duration::from_secs(90);
        let fixdate = headers("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(retry_after(&fixdate, now), Some(Duration::from_secs(90)));
        let rfc850 = headers("Sunday, 06-Nov-94 08:49:37 GMT");
        assert_eq!(retry_after(&rfc850, now), Some(Duration::from_secs(90)));
        let asctime = headers("Sun Nov  6 08:49:37 1994");
        assert_eq!(retry_after(&asctime, now), Some(Duration::from_secs(90)));
        // Sub-second clock readings leave a sub-second delay, not a rounding to zero.
        let almost = example_date() - Duration::from_millis(250);
        assert_eq!(
            retry_after(&fixdate, almost),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn http_date_in_the_past_is_zero() {
        let now = example_date() + Duration::from_secs(3600);
        let fixdate = headers("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(retry_after(&fixdate, now), Some(Duration::ZERO));
    }

    #[test]
    fn absent_or_garbage_is_none() {
        let now = SystemTime::now();
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        for garbage in [
            "",
            "  ",
            "soon",
            "-3",
            "+3",
            "3.5",
            "3s",
            "Sun, 06 Nov 1994",
        ] {
            assert_eq!(retry_after(&headers(garbage), now), None, "{garbage:?}");
        }
        let mut opaque = HeaderMap::new();
        opaque.insert(RETRY_AFTER, HeaderValue::from_bytes(b"\xff3").unwrap());
        assert_eq!(retry_after(&opaque, now), None);
    }

    #[test]
    fn the_first_of_several_fields_counts() {
        let mut headers = headers("5");
        headers.append(RETRY_AFTER, HeaderValue::from_static("60"));
        assert_eq!(
            retry_after(&headers, SystemTime::now()),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn burst_at_once_then_paced_at_the_rate() {
        let pacer = Pacer::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(pacer.try_take_at(start), Ok(()));
        }
        let ms = Duration::from_millis;
        assert_eq!(pacer.try_take_at(start), Err(ms(100)));
        assert_eq!(pacer.try_take_at(start + ms(40)), Err(ms(60)));
        assert_eq!(pacer.try_take_at(start + ms(100)), Ok(()));
        assert_eq!(pacer.try_take_at(start + ms(100)), Err(ms(100)));
        assert_eq!(pacer.try_take_at(start + ms(200)), Ok(()));
        // Idle time refills, but never beyond the burst.
        let later = start + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(pacer.try_take_at(later), Ok(()));
        }
        assert_eq!(pacer.try_take_at(later), Err(ms(100)));
    }

    #[test]
    fn fractional_rate() {
        let pacer = Pacer::new(0.5, 1);
        let start = Instant::now();
        assert_eq!(pacer.try_take_at(start), Ok(()));
        assert_eq!(pacer.try_take_at(start), Err(Duration::from_secs(2)));
        assert_eq!(pacer.try_take_at(start + Duration::from_secs(2)), Ok(()));
    }

    #[test]
    fn an_earlier_instant_than_seen_waits_as_for_the_latest() {
        let pacer = Pacer::new(1.0, 1);
        let start = Instant::now() + Duration::from_secs(10);
        assert_eq!(pacer.try_take_at(start), Ok(()));
        let earlier = start - Duration::from_secs(5);
        assert_eq!(pacer.try_take_at(earlier), Err(Duration::from_secs(6)));
    }

    #[test]
    fn a_burst_of_zero_is_one() {
        let pacer = Pacer::new(1.0, 0);
        let start = Instant::now();
        assert_eq!(pacer.try_take_at(start), Ok(()));
        assert!(pacer.try_take_at(start).is_err());
    }

    #[test]
    #[should_panic(expected = "must be positive")]
    fn a_rate_of_zero_is_refused() {
        Pacer::new(0.0, 1);
    }

    // tokio's `test-util` feature (for a paused clock) is not enabled in this crate, so this
    // waits in real time: 10 a second, 100 ms a token. Only bounds that a loaded machine cannot
    // break are asserted (a late wake-up makes the wait longer, never shorter).
    #[tokio::test]
    async fn until_ready_waits_for_the_next_token() {
        let pacer = Pacer::new(10.0, 2);
        let start = Instant::now();
        pacer.until_ready().await;
        pacer.until_ready().await;
        assert!(pacer.try_take().is_err());
        pacer.until_ready().await;
        pacer.until_ready().await;
        assert!(start.elapsed() >= Duration::from_millis(200));
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn never_grants_more_than_burst_plus_rate_times_elapsed(
            rate_milli in 1u32..100_000,
            burst in 1u32..20,
            steps in proptest::collection::vec(0u64..2_000_000_000, 1..300),
        ) {
            let rate = f64::from(rate_milli) / 1000.0;
            let pacer = Pacer::new(rate, burst);
            let start = Instant::now();
            let (mut elapsed, mut granted) = (0u64, 0u64);
            for step in steps {
                elapsed += step;
                if pacer.try_take_at(start + Duration::from_nanos(elapsed)).is_ok() {
                    granted += 1;
                }
                let allowed = f64::from(burst) + rate * elapsed as f64 / 1e9 + 1.0;
                prop_assert!(granted as f64 <= allowed, "{granted} > {allowed}");
            }
        }

        #[test]
        fn the_wait_named_is_enough(
            rate_milli in 1u32..100_000,
            burst in 1u32..20,
            steps in proptest::collection::vec(0u64..2_000_000_000, 1..100),
        ) {
            let pacer = Pacer::new(f64::from(rate_milli) / 1000.0, burst);
            let mut now = Instant::now();
            for step in steps {
                now += Duration::from_nanos(step);
                if let Err(wait) = pacer.try_take_at(now) {
                    prop_assert!(!wait.is_zero());
                    prop_assert_eq!(pacer.try_take_at(now + wait), Ok(()));
                    now += wait;
                }
            }
        }
    }
}
