//! Marks a lane makes outside its step's happy path: deliveries an outage left unmarked, rows
//! given back at shutdown, and the leases its heartbeat extends.

use std::collections::HashMap;
use std::time::Duration;

use std::sync::Mutex;

use crate::lease::{report_failed, report_lost};
use crate::store::{bounded, AttemptLane, AttemptMark, OutboxClaim, Store, StoreError};

/// The longest a give-back or a last mark at shutdown may take.
pub(super) const OUTSIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes claimed rows due at once (a step abandoned at shutdown). What cannot be given back is
/// delivered after its lease.
pub(super) async fn give_back(store: &Store, label: &str, claims: &[OutboxClaim]) {
    let mut released = 0;
    for (claim_token, ids) in by_claim(claims) {
        match tokio::time::timeout(
            OUTSIDE_CALL_TIMEOUT,
            store.outbox().release_leases(claim_token, &ids),
        )
        .await
        {
            Ok(Ok(rows)) => released += rows,
            Ok(Err(error)) => {
                tracing::warn!(lane = %label, %error, "could not give claimed rows back; they are delivered after their lease")
            }
            Err(_) => tracing::warn!(
                lane = %label,
                "giving claimed rows back timed out; they are delivered after their lease"
            ),
        }
    }
    tracing::warn!(
        lane = %label,
        released,
        "shutdown grace period over mid-delivery; the rows not yet marked were given back"
    );
}

/// Marks the rows a failed step delivered but could not mark (`unmarked`); they stay remembered
/// until the store takes the mark. Returns how many had been claimed by another relay meanwhile
/// (the outage outlasted the lease): their marks change nothing, that relay decides them. A
/// mark that did commit although the step saw an error counts as marked again.
pub(super) async fn mark_unmarked(
    store: &Store,
    label: &str,
    lane: AttemptLane<'_>,
    unmarked: &Mutex<Vec<AttemptMark>>,
    limit: Duration,
) -> Result<usize, StoreError> {
    let lock = || {
        unmarked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let claims = std::mem::take(&mut *lock());
    if claims.is_empty() {
        return Ok(0);
    }
    // Recorded once: a mark that did commit left its rows dispatched under this claim, which
    // the statement skips.
    match bounded(limit, store.outbox().mark_delivered(&claims, lane)).await {
        Ok(marked) => {
            metrics::counter!("dedup_outbox_dispatched_total").increment(marked);
            tracing::info!(lane = %label, rows = marked, "marked deliveries an outage left unmarked");
            Ok(lease_lost(claims.len(), marked))
        }
        Err(error) => {
            lock().extend(claims);
            Err(error)
        }
    }
}

/// Claimed rows by claim token (one claim, one token; grouped anyway).
pub(super) fn by_claim(claims: &[OutboxClaim]) -> HashMap<i64, Vec<i64>> {
    let mut by_token: HashMap<i64, Vec<i64>> = HashMap::new();
    for claim in claims {
        by_token
            .entry(claim.claim_token)
            .or_default()
            .push(claim.id);
    }
    by_token
}

/// One heartbeat: extends the leases of the rows in `held`, and forgets those found lost
/// (another relay claimed them after this one's lease lapsed; its delivery decides them).
pub(super) async fn extend_outbox_leases(
    store: &Store,
    held: &std::sync::Mutex<Vec<OutboxClaim>>,
    lease: Duration,
) -> bool {
    let claims = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut extended = std::collections::HashSet::new();
    for (claim_token, ids) in by_claim(&claims) {
        match store.outbox().extend_leases(claim_token, &ids, lease).await {
            Ok(ids) => extended.extend(ids.into_iter().map(|id| (id, claim_token))),
            Err(error) => {
                report_failed("outbox", &error);
                return false;
            }
        }
    }
    let lost = claims.len() - extended.len();
    report_lost("outbox", lost);
    if lost > 0 {
        held.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|c| extended.contains(&(c.id, c.claim_token)));
    }
    true
}

/// Of `attempted` marks, those that changed nothing (`marked` counts the rest): logged and
/// counted, not an error, since the relay that owns the rows now finishes them.
pub(super) fn lease_lost(attempted: usize, marked: u64) -> usize {
    let lost = attempted.saturating_sub(usize::try_from(marked).unwrap_or(usize::MAX));
    if lost > 0 {
        tracing::warn!(rows = lost, "lease lost; another relay owns the row");
        metrics::counter!("dedup_outbox_lease_lost_total").increment(lost as u64);
    }
    lost
}
