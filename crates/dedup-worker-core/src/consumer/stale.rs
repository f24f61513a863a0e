//! The stale-event guard (`[consumer.stale_guard]`): Stripe does not order events, so an
//! `updated` event from 10:00:05 can arrive after the one from 10:00:09; an app that applies each
//! event's object would overwrite new state with old. For an event of a guarded type, the
//! consumer records its version as the newest of its object unless a strictly newer one was
//! handled; then the event is *stale*: recorded as processed (its dedup row stays), listed in
//! `stale_events` with the newer event's id, counted (`dedup_stale_events_total`), logged, and
//! not passed to the handler, so not forwarded. Equal versions are not stale.
//!
//! A thin event (an event notification) is guarded like its snapshot sibling: its `created` is
//! RFC 3339 text, read as Unix seconds (the unit of a snapshot event's `created`, so the two
//! shapes of one object's changes compare, and a thin event and its snapshot event are equal
//! versions), and its object is its `related_object.id` where the configured pointer finds
//! nothing in it.
//!
//! The check runs in the batch transaction, inside the event's savepoint when there is one, so
//! it commits with the dedup insert or not at all: an event whose handler fails leaves no
//! version behind, and a rolled-back batch decides again. The object's row stays locked until
//! the batch commits, so two workers decide one object's events one after the other.

use crate::config::StaleGuardSettings;
use crate::event::{type_matches, Event};
use crate::store::{StaleEvent, StoreError, StoreTx};
use crate::stripe::shape::THIN_EVENT_OBJECT;

/// The configured guard (only built when enabled).
#[derive(Debug, Clone)]
pub struct StaleGuard {
    /// Type patterns it applies to.
    types: Vec<String>,
    /// Where the object's id is in the payload.
    object_pointer: String,
    /// Where the version (an integer, or RFC 3339 text read as Unix seconds) is in the payload.
    version_pointer: String,
}

impl StaleGuard {
    /// The guard, or `None` when it is off.
    pub fn from_settings(settings: &StaleGuardSettings) -> Option<Self> {
        settings.enabled.then(|| StaleGuard {
            types: settings.types.clone(),
            object_pointer: settings.object_pointer.clone(),
            version_pointer: settings.version_pointer.clone(),
        })
    }

    /// The object and version `event` is about, if it is of a guarded type and has both.
    fn object_version(&self, event: &Event) -> Option<(String, i64)> {
        if !self
            .types
            .iter()
            .any(|p| type_matches(p, &event.event_type))
        {
            return None;
        }
        let payload: serde_json::Value = serde_json::from_slice(&event.payload).ok()?;
        let thin =
            payload.get("object").and_then(serde_json::Value::as_str) == Some(THIN_EVENT_OBJECT);
        let object = match payload.pointer(&self.object_pointer) {
            None if thin => payload.pointer("/related_object/id")?,
            found => found?,
        };
        let object = match object {
            serde_json::Value::String(s) if !s.is_empty() => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return None,
        };
        let version = match payload.pointer(&self.version_pointer)? {
            serde_json::Value::String(time) => {
                chrono::DateTime::parse_from_rfc3339(time).ok()?.timestamp()
            }
            other => other.as_i64()?,
        };
        Some((object, version))
    }

    /// The `(source, object id)` of each of `events` whose version [`Self::is_stale`] would
    /// record, so the batch can lock them all, in one order, first.
    pub(super) fn objects<'e>(
        &self,
        events: impl Iterator<Item = &'e Event>,
    ) -> Vec<(&'e str, String)> {
        events
            .filter_map(|e| Some((e.source.as_str(), self.object_version(e)?.0)))
            .collect()
    }

    /// Whether `event` is stale; records its version otherwise, and lists it when it is.
    pub(super) async fn is_stale(
        &self,
        event: &Event,
        tx: &mut StoreTx,
    ) -> Result<bool, StoreError> {
        let Some((object_id, version)) = self.object_version(event) else {
            return Ok(false);
        };
        let Some((newer_version, newer_event_id)) = tx
            .record_object_version(&event.source, &object_id, version, &event.id)
            .await?
        else {
            return Ok(false);
        };
        // In the handle span, which carries the event's own key and type.
        tracing::info!(
            newer_event_id = %newer_event_id,
            object_id = %object_id,
            version,
            newer_version,
            "stale event: a newer version of its object was handled; not passed to the handler"
        );
        metrics::counter!("dedup_stale_events_total", "source" => event.source.clone())
            .increment(1);
        tx.insert_stale_event(&StaleEvent {
            source: event.source.clone(),
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            object_id,
            version,
            newer_event_id,
            newer_version,
        })
        .await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn guard(object_pointer: &str) -> StaleGuard {
        StaleGuard {
            types: vec!["*.updated".into()],
            object_pointer: object_pointer.into(),
            version_pointer: "/created".into(),
        }
    }

    fn event(event_type: &str, payload: serde_json::Value) -> Event {
        Event {
            source: "stripe".into(),
            id: "evt_1".into(),
            event_type: event_type.into(),
            payload: Bytes::from(payload.to_string()),
            delivery_attempt: 1,
            alias: None,
            headers: crate::event::SenderHeaders::default(),
        }
    }

    #[test]
    fn a_thin_event_is_versioned_in_seconds_and_by_its_related_object() {
        let guard = guard("/data/object/id");
        let snapshot = event(
            "customer.subscription.updated",
            serde_json::json!({"object": "event", "created": 1_796_119_212,
                               "data": {"object": {"id": "sub_1"}}}),
        );
        let thin = event(
            "v1.customer.subscription.updated",
            serde_json::json!({"object": "v2.core.event", "created": "2026-12-01T10:00:12.345Z",
                               "related_object": {"id": "sub_1", "type": "subscription"}}),
        );
        // One change in both shapes: the same object, equal versions (not stale).
        assert_eq!(
            guard.object_version(&snapshot),
            Some(("sub_1".into(), 1_796_119_212))
        );
        assert_eq!(
            guard.object_version(&thin),
            Some(("sub_1".into(), 1_796_119_212))
        );
        // An object the pointer finds wins, in a thin event too (a fetched full event).
        let full = event(
            "v1.customer.subscription.updated",
            serde_json::json!({"object": "v2.core.event", "created": "2026-12-01T10:00:12Z",
                               "data": {"object": {"id": "sub_2"}},
                               "related_object": {"id": "sub_1"}}),
        );
        assert_eq!(guard.object_version(&full).unwrap().0, "sub_2");
        // Only a thin event falls back on its related object; text that is not a time, and
        // types not guarded, are not guarded.
        let snapshot_with_related = event(
            "customer.updated",
            serde_json::json!({"object": "event", "created": 1, "related_object": {"id": "x"}}),
        );
        assert_eq!(guard.object_version(&snapshot_with_related), None);
        let not_a_time = event(
            "v1.customer.updated",
            serde_json::json!({"object": "v2.core.event", "created": "yesterday",
                               "related_object": {"id": "cus_1"}}),
        );
        assert_eq!(guard.object_version(&not_a_time), None);
        let created = event(
            "v1.customer.created",
            serde_json::json!({"object": "v2.core.event", "created": "2026-12-01T10:00:12Z",
                               "related_object": {"id": "cus_1"}}),
        );
        assert_eq!(guard.object_version(&created), None);
    }
}
