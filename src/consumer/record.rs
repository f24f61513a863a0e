//! The dedup record of a batch: `INSERT … ON CONFLICT DO NOTHING` of every event's key, in the
//! batch transaction, so "seen" and "handled" commit together. What the insert reports as new
//! is handled; the rest are duplicates, acked without running the handler.

use std::collections::{BTreeMap, HashSet};

use crate::event::Event;
use crate::queue::Delivery;
use crate::store::{ProcessedEvent, StoreError, StoreTx};

/// Records the dedup keys of `events` in `tx`, one statement per source in the batch; splits
/// them into those recorded now (to handle) and those already there (duplicates).
pub(super) type Received<'e, 'd> = &'e (Event, &'d Delivery);

pub(super) async fn record_new<'e, 'd>(
    tx: &mut StoreTx,
    events: Vec<Received<'e, 'd>>,
) -> Result<(Vec<Received<'e, 'd>>, Vec<Received<'e, 'd>>), StoreError> {
    // Keys are inserted in one global order, (source, id), whatever order the transport
    // delivered them in: two workers whose batches share ids then wait for each other in that
    // order, and never form the cycle PostgreSQL reports as `deadlock detected`.
    let mut by_source: BTreeMap<&str, Vec<ProcessedEvent>> = BTreeMap::new();
    for (event, delivery) in &events {
        by_source
            .entry(event.source.as_str())
            .or_default()
            .push(ProcessedEvent {
                id: event.id.clone(),
                event_type: event.event_type.clone(),
                created: signed_creation_time(event),
                // What `events show` reports of how it arrived.
                received_at: delivery.enqueued_at,
                delivery_attempt: i32::try_from(delivery.attempts).ok(),
            });
    }
    for pairs in by_source.values_mut() {
        pairs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    }
    let mut new: HashSet<(String, String)> = HashSet::new();
    for (source, pairs) in by_source {
        for id in tx.insert_processed_events(source, &pairs).await? {
            new.insert((source.to_owned(), id));
        }
    }
    Ok(events
        .into_iter()
        .partition(|(e, _)| new.contains(&(e.source.clone(), e.id.clone()))))
}

/// When the provider says the event was created (Unix seconds), where the provider signs it:
/// the top-level `created` of a Stripe event (seconds, or RFC 3339 for thin events), which
/// reaches the queue only through the verified ingress, the backfill (from Stripe's API) and
/// redrive. The store skips generations sealed well before it; any other source gets `None`
/// and every generation is looked up.
fn signed_creation_time(event: &Event) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Created {
        created: Option<serde_json::Value>,
    }
    // A JSON object only: serde would also read `[1]` into the struct, as a sequence.
    let is_object = event.payload.trim_ascii_start().first() == Some(&b'{');
    if event.source != "stripe" || !is_object {
        return None;
    }
    match serde_json::from_slice::<Created>(&event.payload)
        .ok()?
        .created?
    {
        serde_json::Value::Number(seconds) => seconds.as_i64(),
        serde_json::Value::String(time) => chrono::DateTime::parse_from_rfc3339(&time)
            .ok()
            .map(|t| t.timestamp()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn event(source: &str, payload: &str) -> Event {
        Event {
            source: source.into(),
            id: "evt_1".into(),
            event_type: "invoice.paid".into(),
            payload: Bytes::copy_from_slice(payload.as_bytes()),
            delivery_attempt: 1,
        }
    }

    #[test]
    fn the_creation_time_is_a_stripe_events_top_level_created() {
        let body = r#"{"id":"evt_1","created":1764547200,"data":{"object":{"created":1}}}"#;
        assert_eq!(
            signed_creation_time(&event("stripe", body)),
            Some(1_764_547_200)
        );
        let thin = r#"{"id":"evt_1","object":"v2.core.event","created":"2025-12-01T00:00:00Z"}"#;
        assert_eq!(
            signed_creation_time(&event("stripe", thin)),
            Some(1_764_547_200)
        );
        // Another source's `created` is not the provider's signed word: every generation.
        assert_eq!(signed_creation_time(&event("github", body)), None);
        for odd in [
            r#"{"id":"evt_1"}"#,
            r#"{"created":"yesterday"}"#,
            "[1]",
            "not json",
        ] {
            assert_eq!(signed_creation_time(&event("stripe", odd)), None, "{odd}");
        }
    }
}
