//! The delay a receiver asks for with `Retry-After` (on a 429 or 503): [`retry_after`], pure,
//! reading headers against a given clock reading. (A sink's own `rate_per_sec` is kept in the
//! store for every relay process together: `relay/rate.rs`.)

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::HeaderMap;

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

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

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
}
