//! Pausing and resuming an outbox lane by hand (`outbox pause SINK`, `outbox resume SINK`):
//! what the circuit breaker does by itself, for an operator who knows a receiver is down (or
//! fixed). Both are recorded in `admin_actions` (`sink_pause`, `sink_resume`) with the lane as
//! the filter, and take effect for every relay process within about a second.
//!
//! On an ordered lane a row failed for good holds its key ([`held_keys`]); skipping it
//! (`outbox skip ID`, recorded as `outbox_skip` with the row's id, lane and key) lets the key's
//! next row go.

use super::{Action, Actor};
use crate::config::DEFAULT_LANE;
use crate::store::{HeldKey, SinkState, Store, StoreError};

/// Why a pause or a resume was refused.
#[derive(Debug, thiserror::Error)]
pub enum SinkActionError {
    /// Neither configured, nor known to the store (no row ever went to it).
    #[error("no sink named {sink:?}; the sinks are: {known}")]
    Unknown { sink: String, known: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The lanes an operator may name: `default`, the configured sinks, and any lane the store
/// knows (a row of `outbox_sinks`, or pending rows of an ad-hoc destination).
pub async fn known_lanes(store: &Store, configured: &[String]) -> Result<Vec<String>, StoreError> {
    let mut known: Vec<String> = std::iter::once(DEFAULT_LANE.to_owned())
        .chain(configured.iter().cloned())
        .collect();
    known.extend(store.sinks().list().await?.into_iter().map(|s| s.sink));
    known.extend(store.outbox().pending_lanes().await?);
    known.sort();
    known.dedup();
    Ok(known)
}

/// Every lane the store has state for, by name.
pub async fn lane_states(store: &Store) -> Result<Vec<SinkState>, StoreError> {
    store.sinks().list().await
}

/// Up to `limit` keys held by a row failed for good, oldest first.
pub async fn held_keys(store: &Store, limit: i64) -> Result<Vec<HeldKey>, StoreError> {
    store.outbox().held_keys(limit).await
}

/// Skips failed row `id` so the next row of its key may go (it stays failed); returns its lane
/// and key, or `None` if `id` is no failed row (or was skipped already). Recorded either way.
pub async fn skip_delivery(
    store: &Store,
    id: i64,
    actor: &Actor,
) -> Result<Option<(String, Option<String>)>, StoreError> {
    let skipped = store.outbox().skip(id, &actor.0).await?;
    let filter = serde_json::json!({
        "id": id,
        "sink": skipped.as_ref().map(|(sink, _)| crate::config::lane_label(sink)),
        "ordering_key": skipped.as_ref().and_then(|(_, key)| key.clone()),
    })
    .to_string();
    store
        .admin_actions()
        .record(
            &actor.0,
            Action::OutboxSkip.name(),
            &filter,
            i64::from(skipped.is_some()),
        )
        .await?;
    Ok(skipped)
}

/// Pauses lane `sink` for every relay; returns whether it was running.
pub async fn pause_sink(
    store: &Store,
    configured: &[String],
    sink: &str,
    actor: &Actor,
) -> Result<bool, SinkActionError> {
    let sink = &check_known(store, configured, sink).await?;
    let paused = store.sinks().pause(sink, &actor.0).await?;
    record_lane(store, actor, Action::SinkPause, sink, paused).await?;
    Ok(paused)
}

/// Resumes lane `sink`: not paused, its circuit closed, the receiver's hold lifted; returns
/// whether there was anything to lift.
pub async fn resume_sink(
    store: &Store,
    configured: &[String],
    sink: &str,
    actor: &Actor,
) -> Result<bool, SinkActionError> {
    let sink = &check_known(store, configured, sink).await?;
    let resumed = store.sinks().resume(sink).await?;
    record_lane(store, actor, Action::SinkResume, sink, resumed).await?;
    Ok(resumed)
}

/// The lane `sink` names: by its name, or an ad-hoc lane by its label (`~0a1b2c3d`, as
/// `outbox sinks` lists it).
async fn check_known(
    store: &Store,
    configured: &[String],
    sink: &str,
) -> Result<String, SinkActionError> {
    let known = known_lanes(store, configured).await?;
    if let Some(lane) = known
        .iter()
        .find(|lane| *lane == sink || crate::config::lane_label(lane) == sink)
    {
        return Ok(lane.clone());
    }
    Err(SinkActionError::Unknown {
        sink: sink.to_owned(),
        known: known
            .iter()
            .map(|lane| crate::config::lane_label(lane))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Records the action with the lane as its filter (`{"sink":"billing"}`) and a count of 1 if
/// it changed anything.
async fn record_lane(
    store: &Store,
    actor: &Actor,
    action: Action,
    sink: &str,
    changed: bool,
) -> Result<(), StoreError> {
    let filter = serde_json::json!({ "sink": crate::config::lane_label(sink) }).to_string();
    store
        .admin_actions()
        .record(&actor.0, action.name(), &filter, i64::from(changed))
        .await
        .map(drop)
}
