//! Lease heartbeats: work that holds leases (a consumer's batch, a relay's claimed rows, SQS
//! visibility) extends them while it runs, so a lease need only outlast a few heartbeats, not
//! the slowest batch. When a process dies its leases lapse within one lease, seconds rather than
//! minutes, and another process takes the work over.
//!
//! A heartbeat that cannot reach the store or the broker is only a warning: the next one tries
//! again, and if the lease lapses meanwhile, the lease-checked marks and releases keep the late
//! worker from undoing what the new holder does.

use std::future::Future;
use std::time::Duration;

use futures::future::{select, Either};

/// Heartbeats per lease: one or two may fail or be late before the lease lapses.
pub const HEARTBEATS_PER_LEASE: u32 = 3;

/// How often a lease of `lease` is extended.
pub fn heartbeat_period(lease: Duration) -> Duration {
    lease / HEARTBEATS_PER_LEASE
}

/// Runs `work` to completion; every `period` meanwhile, awaits `extend()` (each call cut off
/// after one period, so a hung call cannot hold the next heartbeat back). Both run on the
/// caller's task: when `work` ends or is dropped, the heartbeat stops with it, and nothing
/// extends a lease after the work that needed it is over.
pub async fn with_lease_heartbeat<T, F, Fut>(
    what: &'static str,
    period: Duration,
    work: impl Future<Output = T>,
    mut extend: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let heartbeat = async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if tokio::time::timeout(period, extend()).await.is_err() {
                tracing::warn!(
                    lease = what,
                    ?period,
                    "lease heartbeat timed out; retrying at the next one"
                );
                metrics::counter!("dedup_lease_heartbeat_failures_total", "lease" => what)
                    .increment(1);
            }
        }
    };
    futures::pin_mut!(work);
    futures::pin_mut!(heartbeat);
    match select(work, heartbeat).await {
        Either::Left((output, _)) => output,
        Either::Right(((), work)) => work.await,
    }
}

/// Logs and counts leases a heartbeat found lost: another worker claimed the work after this
/// one's lease lapsed (a pause longer than the lease, heartbeats that could not get through).
/// Harmless for correctness (every mark and release names its claim), but it means the work
/// may be done twice, so it is worth an alert.
pub fn report_lost(what: &'static str, lost: usize) {
    if lost > 0 {
        tracing::warn!(
            lease = what,
            count = lost,
            "lease heartbeat found leases lost; another worker owns that work now"
        );
        metrics::counter!("dedup_lease_heartbeat_lost_total", "lease" => what)
            .increment(lost as u64);
    }
}

/// The failure of a heartbeat call that did answer: a warning, the next one tries again.
pub fn report_failed(what: &'static str, error: &dyn std::fmt::Display) {
    tracing::warn!(lease = what, %error, "lease heartbeat failed; retrying at the next one");
    metrics::counter!("dedup_lease_heartbeat_failures_total", "lease" => what).increment(1);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    const PERIOD: Duration = Duration::from_millis(100);

    fn counting(
        beats: &Arc<AtomicUsize>,
        hang: bool,
    ) -> impl FnMut() -> futures::future::BoxFuture<'static, ()> {
        let beats = beats.clone();
        move || {
            let beats = beats.clone();
            Box::pin(async move {
                beats.fetch_add(1, Ordering::SeqCst);
                if hang {
                    std::future::pending::<()>().await;
                }
            })
        }
    }

    #[tokio::test]
    async fn heartbeats_every_period_while_the_work_runs_and_stops_with_it() {
        let beats = Arc::new(AtomicUsize::new(0));
        let work = async {
            tokio::time::sleep(PERIOD * 7 / 2).await;
            7
        };
        let output = with_lease_heartbeat("test", PERIOD, work, counting(&beats, false)).await;
        assert_eq!(output, 7);
        assert_eq!(beats.load(Ordering::SeqCst), 3);
        tokio::time::sleep(PERIOD * 3).await;
        assert_eq!(
            beats.load(Ordering::SeqCst),
            3,
            "no heartbeat after the work"
        );
    }

    #[tokio::test]
    async fn a_hung_heartbeat_holds_back_neither_the_work_nor_the_next_one() {
        let beats = Arc::new(AtomicUsize::new(0));
        let work = tokio::time::sleep(PERIOD * 9 / 2);
        let started = tokio::time::Instant::now();
        with_lease_heartbeat("test", PERIOD, work, counting(&beats, true)).await;
        assert!(started.elapsed() < PERIOD * 6, "the work ended on time");
        // Each call is cut off after a period and the next one starts: at 1, 2, 3 and 4.
        let beats = beats.load(Ordering::SeqCst);
        assert!((3..=4).contains(&beats), "{beats} heartbeats");
    }
}
