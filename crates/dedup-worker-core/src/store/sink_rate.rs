//! A sink's `rate_per_sec` and `burst` held for every relay process together (`outbox_sinks.
//! rate_tat_us`): [`Sinks::take_tokens`]. The bucket is a GCRA kept in the lane's row: its
//! theoretical arrival time, the instant the bucket would be full again if nothing more were
//! taken. A process takes a few tokens at a time under the row's lock ([`grant`] decides how
//! many), and spends them itself; so two relays of a sink at 50 a second send 50 a second
//! between them, not 100. The time is the database's on PostgreSQL (relays' clocks may
//! differ), the process's on SQLite (one machine).

use std::time::Duration;

use super::{Pool, Sinks, StoreError};

/// The lane's row, made if it is not there (a lane without one has a full bucket).
const ENSURE_ROW: &str =
    "INSERT INTO outbox_sinks (sink) VALUES ($1) ON CONFLICT (sink) DO NOTHING";
/// The bucket's new arrival time, written under the row's lock.
const STORE_TAT: &str = "UPDATE outbox_sinks SET rate_tat_us = $2 WHERE sink = $1";

/// What [`Sinks::take_tokens`] granted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tokens {
    /// Deliveries that may go now (at most what was asked).
    pub granted: u32,
    /// With none granted: how long until the next token accrues.
    pub wait: Duration,
}

/// The GCRA's decision at `now_us` for a bucket whose theoretical arrival time is `tat_us`
/// (`None`: full): how many of `want` tokens go now, the new arrival time, and (none granted)
/// the wait for the next. A token accrues every `interval_us`; up to `burst` go at once from a
/// full bucket.
pub fn grant(
    tat_us: Option<f64>,
    now_us: f64,
    want: u32,
    interval_us: f64,
    burst: u32,
) -> (u32, f64, Duration) {
    let base = tat_us.map_or(now_us, |tat| tat.max(now_us));
    // A token at `now` conforms while the bucket is drawn at most (burst - 1) intervals ahead:
    // n tokens fit when base + (n - 1)·interval - now <= (burst - 1)·interval.
    let fit = ((now_us - base) / interval_us + f64::from(burst.max(1))).floor();
    let granted = fit.clamp(0.0, f64::from(want)) as u32;
    let tat = base + f64::from(granted) * interval_us;
    let wait = match granted {
        0 => {
            let ahead = base - now_us - f64::from(burst.max(1) - 1) * interval_us;
            Duration::from_micros(ahead.max(1.0).ceil() as u64)
        }
        _ => Duration::ZERO,
    };
    (granted, tat, wait)
}

impl Sinks<'_> {
    /// Takes up to `want` of lane `sink`'s shared tokens (a token every `interval`, `burst` at
    /// most at once), for this process to spend now (see the module's doc).
    pub async fn take_tokens(
        self,
        sink: &str,
        want: u32,
        interval: Duration,
        burst: u32,
    ) -> Result<Tokens, StoreError> {
        let interval_us = (interval.as_secs_f64() * 1e6).max(1.0);
        let decide = |tat: Option<f64>, now: f64| grant(tat, now, want, interval_us, burst);
        let (granted, wait) = match self.pool {
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(ENSURE_ROW).bind(sink).execute(&mut *tx).await?;
                let (tat, now): (Option<f64>, f64) = sqlx::query_as(
                    "SELECT rate_tat_us, extract(epoch FROM clock_timestamp())::float8 * 1e6
                       FROM outbox_sinks WHERE sink = $1 FOR UPDATE",
                )
                .bind(sink)
                .fetch_one(&mut *tx)
                .await?;
                let (granted, tat, wait) = decide(tat, now);
                if granted > 0 {
                    sqlx::query(STORE_TAT)
                        .bind(sink)
                        .bind(tat)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                (granted, wait)
            }
            Pool::Sqlite(pool) => {
                let mut tx = super::sqlite::begin_immediate(pool).await?;
                sqlx::query(ENSURE_ROW).bind(sink).execute(&mut *tx).await?;
                let tat: Option<f64> =
                    sqlx::query_scalar("SELECT rate_tat_us FROM outbox_sinks WHERE sink = $1")
                        .bind(sink)
                        .fetch_one(&mut *tx)
                        .await?;
                let now = chrono::Utc::now().timestamp_micros() as f64;
                let (granted, tat, wait) = decide(tat, now);
                if granted > 0 {
                    sqlx::query(STORE_TAT)
                        .bind(sink)
                        .bind(tat)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                (granted, wait)
            }
        };
        Ok(Tokens { granted, wait })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::grant;
    use crate::proptest_support::config;

    #[test]
    fn a_full_bucket_grants_the_burst_then_one_token_an_interval() {
        let (granted, tat, _) = grant(None, 0.0, 100, 100.0, 5);
        assert_eq!((granted, tat), (5, 500.0));
        let (granted, _, wait) = grant(Some(tat), 0.0, 1, 100.0, 5);
        assert_eq!(granted, 0);
        assert_eq!(wait.as_micros(), 100);
        let (granted, tat, _) = grant(Some(500.0), 100.0, 10, 100.0, 5);
        assert_eq!((granted, tat), (1, 600.0));
        // Long idle: full again, no more than the burst.
        assert_eq!(grant(Some(600.0), 1e9, 100, 100.0, 5).0, 5);
    }

    proptest! {
        #![proptest_config(config(256))]

        /// However the takes of any number of processes interleave, no window shorter than
        /// 1000 µs (ten intervals) sees more than burst + 9 tokens: the promise a receiver's
        /// rate is given.
        #[test]
        fn no_window_holds_more_than_the_burst_and_the_rate(
            steps in prop::collection::vec((0u32..400, 1u32..20), 1..200),
            burst in 1u32..10,
        ) {
            let interval = 100.0;
            let (mut tat, mut now) = (None, 0.0);
            let mut taken: Vec<f64> = Vec::new();
            for (advance, want) in steps {
                now += f64::from(advance);
                let (granted, next, _) = grant(tat, now, want, interval, burst);
                if granted > 0 {
                    tat = Some(next);
                }
                taken.extend(std::iter::repeat_n(now, granted as usize));
            }
            for (i, start) in taken.iter().enumerate() {
                let within = taken[i..].iter().take_while(|t| **t - start < 1_000.0).count();
                prop_assert!(within as u32 <= burst + 9,
                    "{within} tokens within 1000 µs from {start}");
            }
        }
    }
}
