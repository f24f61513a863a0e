//! A lane's circuit breaker, the counting half: when a run of delivery outcomes should open the
//! circuit, and how long to wait between probes once it is open.
//!
//! The open / half-open / closed state is shared by every relay process, so it lives in the
//! database; this module holds no such state and does no I/O. Each process counts the outcomes
//! of its own deliveries to a lane with a [`Breaker`] and, when [`Breaker::record`] reports a
//! trip, opens the shared circuit. [`next_probe_interval`] spaces the probes of an open circuit.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// When a lane's circuit opens (config `outbox.breaker` / `outbox.sinks.NAME.breaker`).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerPolicy {
    /// A run of this many consecutive failures trips; 0 turns this trigger off.
    pub failures: u32,
    /// In (0, 1]: trips when, with at least `min_requests` outcomes among the last `window`,
    /// failed / seen >= this.
    pub failure_ratio: f64,
    /// How many of the latest outcomes the ratio is taken over; 0 turns this trigger off.
    pub window: u32,
    /// The fewest outcomes the ratio is judged on (at most `window`; a larger value is read as
    /// `window`, so the trigger stays reachable).
    pub min_requests: u32,
    /// The first probe interval after the circuit opens.
    pub probe_after: Duration,
    /// The cap on the doubling probe interval (before jitter).
    pub probe_max: Duration,
}

/// Why a lane's circuit opened; its `Display` is the text logged and shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TripReason {
    /// A run of failures with no success between them.
    Consecutive {
        /// The length of the run.
        failures: u32,
    },
    /// Too large a share of the latest outcomes failed.
    Ratio {
        /// Failures among the outcomes remembered.
        failed: u32,
        /// Outcomes remembered (at most the policy's window).
        seen: u32,
    },
}

impl fmt::Display for TripReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TripReason::Consecutive { failures } => write!(f, "{failures} consecutive failures"),
            TripReason::Ratio { failed, seen } => {
                write!(f, "{failed} of the last {seen} deliveries failed")
            }
        }
    }
}

/// One process's count of a lane's delivery outcomes since the last trip or reset.
#[derive(Debug, Clone)]
pub struct Breaker {
    /// When to trip.
    policy: BreakerPolicy,
    /// The latest outcomes, oldest first, at most `policy.window` of them; `true` = failed.
    recent: VecDeque<bool>,
    /// How many of `recent` failed (kept so a record costs O(1), not a recount).
    failed_in_window: u32,
    /// Failures since the last success (or trip, or reset).
    consecutive: u32,
}

impl Breaker {
    pub fn new(policy: BreakerPolicy) -> Self {
        let capacity = policy.window as usize;
        Breaker {
            policy,
            recent: VecDeque::with_capacity(capacity),
            failed_in_window: 0,
            consecutive: 0,
        }
    }

    /// Feeds one delivery's outcome; `Some(reason)` when this outcome trips the circuit, and
    /// then the counts start afresh (so the next trip needs a new run).
    ///
    /// Only a failure trips: a success is evidence the sink works right now, so even when the
    /// success is the outcome that brings the count up to `min_requests` with the ratio
    /// already over the line, the circuit stays closed until the next failure.
    pub fn record(&mut self, failed: bool) -> Option<TripReason> {
        self.consecutive = if failed { self.consecutive + 1 } else { 0 };
        if self.policy.window > 0 {
            // The oldest outcome falls out of a full window.
            if self.recent.len() >= self.policy.window as usize
                && self.recent.pop_front() == Some(true)
            {
                self.failed_in_window -= 1;
            }
            self.recent.push_back(failed);
            self.failed_in_window += u32::from(failed);
        }
        if !failed {
            return None;
        }
        let reason = self.trip_reason()?;
        self.reset();
        Some(reason)
    }

    /// The trigger that holds now, the consecutive one first (its message is the plainer).
    fn trip_reason(&self) -> Option<TripReason> {
        let policy = &self.policy;
        if policy.failures > 0 && self.consecutive >= policy.failures {
            return Some(TripReason::Consecutive {
                failures: self.consecutive,
            });
        }
        let seen = self.recent.len() as u32;
        let enough = seen >= policy.min_requests.min(policy.window).max(1);
        let ratio = f64::from(self.failed_in_window) / f64::from(seen.max(1));
        (policy.window > 0 && enough && ratio >= policy.failure_ratio).then_some(
            TripReason::Ratio {
                failed: self.failed_in_window,
                seen,
            },
        )
    }

    /// Forgets every outcome (the circuit closed, or another process opened it).
    pub fn reset(&mut self) {
        self.recent.clear();
        self.failed_in_window = 0;
        self.consecutive = 0;
    }

    pub fn policy(&self) -> &BreakerPolicy {
        &self.policy
    }
}

/// The share of the interval that jitter may add or take away: probes from several processes
/// (or several lanes opened by one outage) spread out instead of arriving together.
const JITTER: f64 = 0.2;

/// The shortest interval returned: a zero interval would probe in a busy loop.
const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// The wait before the next probe: `probe_after` for the first (`previous` = None), else double
/// the previous, capped at `probe_max`; then ±20 % jitter from `jitter_unit` in [-1.0, 1.0]
/// (0.0 = none; values outside are clamped, NaN is none), never above `probe_max` × 1.2 and
/// never below 1 ms.
pub fn next_probe_interval(
    previous: Option<Duration>,
    policy: &BreakerPolicy,
    jitter_unit: f64,
) -> Duration {
    let base = match previous {
        None => policy.probe_after,
        Some(previous) => previous.saturating_mul(2),
    }
    .min(policy.probe_max);
    let unit = if jitter_unit.is_nan() {
        0.0
    } else {
        jitter_unit.clamp(-1.0, 1.0)
    };
    // Through f64 seconds rather than Duration::mul_f64, which panics on overflow (a
    // probe_max of Duration::MAX would).
    let scale = |d: Duration, factor: f64| {
        Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
    };
    let ceiling = scale(policy.probe_max, 1.0 + JITTER);
    scale(base, 1.0 + JITTER * unit)
        .min(ceiling)
        .max(MIN_INTERVAL)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::proptest_support::config;

    fn policy(failures: u32, failure_ratio: f64, window: u32, min_requests: u32) -> BreakerPolicy {
        BreakerPolicy {
            failures,
            failure_ratio,
            window,
            min_requests,
            probe_after: Duration::from_secs(1),
            probe_max: Duration::from_secs(60),
        }
    }

    /// Records `outcomes` ('F' failed, 'S' succeeded) and returns what each one reported.
    fn feed(breaker: &mut Breaker, outcomes: &str) -> Vec<Option<TripReason>> {
        outcomes.chars().map(|c| breaker.record(c == 'F')).collect()
    }

    #[test]
    fn trips_after_exactly_n_consecutive_failures() {
        let mut breaker = Breaker::new(policy(3, 1.0, 0, 0));
        assert_eq!(feed(&mut breaker, "FF"), [None, None]);
        let trip = breaker.record(true);
        assert_eq!(trip, Some(TripReason::Consecutive { failures: 3 }));
        assert_eq!(trip.unwrap().to_string(), "3 consecutive failures");
    }

    #[test]
    fn a_success_restarts_the_run() {
        let mut breaker = Breaker::new(policy(3, 1.0, 0, 0));
        assert!(feed(&mut breaker, "FFSFFSFF").iter().all(Option::is_none));
        assert!(breaker.record(true).is_some());
    }

    #[test]
    fn ratio_trips_only_once_min_requests_are_seen() {
        let mut breaker = Breaker::new(policy(0, 0.5, 10, 4));
        assert!(feed(&mut breaker, "FFF").iter().all(Option::is_none));
        let trip = breaker.record(true);
        assert_eq!(trip, Some(TripReason::Ratio { failed: 4, seen: 4 }));
        assert_eq!(
            trip.unwrap().to_string(),
            "4 of the last 4 deliveries failed"
        );
    }

    #[test]
    fn ratio_below_the_line_does_not_trip() {
        let mut breaker = Breaker::new(policy(0, 0.5, 10, 4));
        // At each failure 2 of 5, 3 of 7, 4 of 9 < 0.5; the tenth, a failure, makes 5 of 10.
        assert!(feed(&mut breaker, "SSFSFSFSF").iter().all(Option::is_none));
        assert_eq!(
            breaker.record(true),
            Some(TripReason::Ratio {
                failed: 5,
                seen: 10
            })
        );
    }

    #[test]
    fn a_success_reaching_min_requests_does_not_trip() {
        let mut breaker = Breaker::new(policy(0, 0.5, 10, 4));
        // The fourth outcome, a success, makes 3 of 4 but only a failure trips.
        assert!(feed(&mut breaker, "FFFS").iter().all(Option::is_none));
        assert_eq!(
            breaker.record(true),
            Some(TripReason::Ratio { failed: 4, seen: 5 })
        );
    }

    #[test]
    fn older_outcomes_fall_out_of_the_window() {
        let mut breaker = Breaker::new(policy(0, 0.75, 4, 4));
        // Window FFSS then F: the oldest F falls out, leaving FSSF = 2 of 4.
        assert!(feed(&mut breaker, "FFSSF").iter().all(Option::is_none));
        // FSSF -> SSFF -> SFFF: 3 of 4 = 0.75 trips.
        assert_eq!(feed(&mut breaker, "F"), [None]);
        assert_eq!(
            breaker.record(true),
            Some(TripReason::Ratio { failed: 3, seen: 4 })
        );
    }

    #[test]
    fn both_triggers_off_never_trips() {
        let mut breaker = Breaker::new(policy(0, 0.1, 0, 0));
        assert!(feed(&mut breaker, &"F".repeat(1000))
            .iter()
            .all(Option::is_none));
    }

    #[test]
    fn after_a_trip_counts_start_afresh() {
        let mut breaker = Breaker::new(policy(3, 0.5, 4, 4));
        assert!(feed(&mut breaker, "FFF")[2].is_some());
        // Neither the run nor the window carries over: two more failures are not enough.
        assert_eq!(feed(&mut breaker, "FF"), [None, None]);
        assert!(breaker.record(true).is_some());
    }

    #[test]
    fn reset_forgets_everything() {
        let mut breaker = Breaker::new(policy(3, 0.5, 4, 4));
        feed(&mut breaker, "FF");
        breaker.reset();
        assert_eq!(feed(&mut breaker, "FF"), [None, None]);
        assert_eq!(breaker.policy(), &policy(3, 0.5, 4, 4));
    }

    #[test]
    fn min_requests_above_window_is_read_as_window() {
        let mut breaker = Breaker::new(policy(0, 1.0, 2, 10));
        assert_eq!(feed(&mut breaker, "F"), [None]);
        assert_eq!(
            breaker.record(true),
            Some(TripReason::Ratio { failed: 2, seen: 2 })
        );
    }

    #[test]
    fn probe_interval_doubles_and_caps() {
        let policy = policy(1, 1.0, 0, 0);
        let mut interval = next_probe_interval(None, &policy, 0.0);
        let mut seen = vec![interval.as_secs()];
        for _ in 0..8 {
            interval = next_probe_interval(Some(interval), &policy, 0.0);
            seen.push(interval.as_secs());
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn probe_after_above_probe_max_is_capped() {
        let mut policy = policy(1, 1.0, 0, 0);
        policy.probe_after = Duration::from_secs(600);
        assert_eq!(next_probe_interval(None, &policy, 0.0), policy.probe_max);
    }

    #[test]
    fn jitter_stays_within_twenty_percent_and_the_bounds() {
        let policy = policy(1, 1.0, 0, 0);
        let first = |unit| next_probe_interval(None, &policy, unit);
        assert_eq!(first(1.0), Duration::from_millis(1200));
        assert_eq!(first(-1.0), Duration::from_millis(800));
        assert_eq!(first(7.0), Duration::from_millis(1200));
        assert_eq!(first(f64::NAN), Duration::from_secs(1));
        // A jittered previous interval above the cap doubles to the cap, then jitters.
        let top = next_probe_interval(Some(Duration::from_secs(72)), &policy, 1.0);
        assert_eq!(top, Duration::from_secs(72));
        let mut zero = policy.clone();
        zero.probe_after = Duration::ZERO;
        assert_eq!(next_probe_interval(None, &zero, -1.0), MIN_INTERVAL);
        let mut huge = policy.clone();
        huge.probe_max = Duration::MAX;
        assert_eq!(
            next_probe_interval(Some(Duration::MAX), &huge, 1.0),
            Duration::MAX
        );
    }

    /// The reference model: a recount over the outcomes since the last trip.
    fn model_trips(policy: &BreakerPolicy, since_trip: &[bool]) -> bool {
        let Some(&last) = since_trip.last() else {
            return false;
        };
        if !last {
            return false;
        }
        let run = since_trip.iter().rev().take_while(|&&f| f).count() as u32;
        if policy.failures > 0 && run >= policy.failures {
            return true;
        }
        if policy.window == 0 {
            return false;
        }
        let start = since_trip.len().saturating_sub(policy.window as usize);
        let window = &since_trip[start..];
        let failed = window.iter().filter(|&&f| f).count() as f64;
        let needed = policy.min_requests.min(policy.window).max(1) as usize;
        window.len() >= needed && failed / window.len() as f64 >= policy.failure_ratio
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn record_trips_iff_the_model_says_so(
            failures in 0u32..6,
            ratio_percent in 1u32..=100,
            window in 0u32..10,
            min_requests in 0u32..10,
            outcomes in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            let policy = policy(failures, f64::from(ratio_percent) / 100.0, window, min_requests);
            let mut breaker = Breaker::new(policy.clone());
            let mut since_trip = Vec::new();
            for failed in outcomes {
                since_trip.push(failed);
                let expected = model_trips(&policy, &since_trip);
                prop_assert_eq!(breaker.record(failed).is_some(), expected);
                if expected {
                    since_trip.clear();
                }
            }
        }
    }
}
