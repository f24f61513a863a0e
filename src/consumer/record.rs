//! The dedup record of a batch: `INSERT … ON CONFLICT DO NOTHING` of every event's key, in the
//! batch transaction, so "seen" and "handled" commit together. What the insert reports as new
//! is handled; the rest are duplicates, acked without running the handler.
//!
//! Each event's creation time decides which sealed dedup generations the insert may skip
//! (`crate::store::dedup`), so it is passed only where this consumer can verify that Stripe
//! said it ([`trusted_creation_time`]); anything else looks in every generation: correct, only
//! slower.

use std::collections::{BTreeMap, HashSet};

use crate::event::Event;
use crate::queue::Delivery;
use crate::signature::stripe::verify_authenticity;
use crate::store::{ProcessedEvent, StoreError, StoreTx};
use crate::stripe::shape::THIN_EVENT_OBJECT;

/// How far after its signature's `t` an event's `created` may be (Stripe's clock both times)
/// and still be trusted: Stripe creates an event before it signs a delivery of it.
pub(super) const CREATED_AFTER_SIGNING_SECS: i64 = 300;

/// A decoded event and the delivery it came in.
pub(super) type Received<'e, 'd> = &'e (Event, &'d Delivery);

/// Records the dedup keys of `events` in `tx`, one statement per source in the batch; splits
/// them into those recorded now (to handle) and those already there (duplicates).
/// `stripe_secrets` are the configured `stripe.secrets`, which verify the signatures the ingress
/// carried (see [`trusted_creation_time`]).
pub(super) async fn record_new<'e, 'd>(
    tx: &mut StoreTx,
    events: Vec<Received<'e, 'd>>,
    stripe_secrets: &[String],
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
                created: trusted_creation_time(
                    event,
                    delivery.stripe_signature.as_deref(),
                    stripe_secrets,
                ),
                // What `events show` reports of how it arrived.
                received_at: delivery.enqueued_at,
                delivery_attempt: i32::try_from(delivery.attempts).ok(),
                alias: event.alias.clone(),
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

/// When Stripe created the event (Unix seconds), only where this consumer can verify that
/// Stripe said so, else `None`. All of these must hold:
/// * the event's source is `stripe` and `stripe.secrets` is configured here;
/// * the message carries the signature the ingress verified (`signature`: `t=…,v1=…`), and one
///   of the secrets verifies it over the event's exact payload, with no timestamp tolerance
///   (the ingress refused replays; authenticity does not expire);
/// * the payload's own `id` is the event's dedup key (a producer could pair a genuine signed
///   body with another message id);
/// * it is not a thin event (its key is its snapshot event's id, and its `created` is not when
///   that event was recorded);
/// * its top-level `created` is an integer at most [`CREATED_AFTER_SIGNING_SECS`] after the
///   signature's `t`.
///
/// Everything else (no signature or a bad one, no secrets on a consume-only process, backfill,
/// redrive, EventBridge, Standard Webhooks, foreign producers) gives `None`.
pub(crate) fn trusted_creation_time(
    event: &Event,
    signature: Option<&str>,
    secrets: &[String],
) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        id: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        object: Option<std::borrow::Cow<'a, str>>,
        created: Option<serde_json::Value>,
    }
    let signature = signature?;
    // A JSON object only: serde would also read `[1]` into the struct, as a sequence.
    let is_object = event.payload.trim_ascii_start().first() == Some(&b'{');
    if event.source != crate::stripe::SOURCE || secrets.is_empty() || !is_object {
        return None;
    }
    let head: Head = serde_json::from_slice(&event.payload).ok()?;
    if head.id.as_deref() != Some(event.id.as_str())
        || head.object.as_deref() == Some(THIN_EVENT_OBJECT)
    {
        return None;
    }
    let created = head.created?.as_i64()?;
    // The HMAC last: the cheap checks above spare it for whatever cannot be trusted anyway.
    let signed = verify_authenticity(signature, &event.payload, secrets).ok()?;
    (created <= signed.timestamp.saturating_add(CREATED_AFTER_SIGNING_SECS)).then_some(created)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::signature::stripe::signature_header;

    const SECRET: &str = "whsec_record_test";
    const T: i64 = 1_764_547_200;

    fn event(source: &str, id: &str, payload: &str) -> Event {
        Event {
            source: source.into(),
            id: id.into(),
            event_type: "invoice.paid".into(),
            payload: Bytes::copy_from_slice(payload.as_bytes()),
            delivery_attempt: 1,
            alias: None,
        }
    }

    fn body(id: &str, created: i64) -> String {
        format!(
            r#"{{"id":"{id}","object":"event","created":{created},"data":{{"object":{{"created":1}}}}}}"#
        )
    }

    fn trusted(event: &Event, signature: Option<&str>) -> Option<i64> {
        trusted_creation_time(event, signature, &[SECRET.to_owned()])
    }

    #[test]
    fn a_created_stripe_signed_is_trusted_however_old_the_signature() {
        let payload = body("evt_1", T - 60);
        let signed = signature_header(SECRET, T, payload.as_bytes());
        assert_eq!(
            trusted(&event("stripe", "evt_1", &payload), Some(&signed)),
            Some(T - 60)
        );
        // Any configured secret (rotation); and a signature from years ago still verifies.
        let old = body("evt_1", 1_000);
        let signed_then = signature_header(SECRET, 1_100, old.as_bytes());
        let secrets = ["whsec_other".to_owned(), SECRET.to_owned()];
        assert_eq!(
            trusted_creation_time(
                &event("stripe", "evt_1", &old),
                Some(&signed_then),
                &secrets
            ),
            Some(1_000)
        );
        // The compact form the ingress carries is itself a header.
        let parsed =
            crate::signature::stripe::verify_authenticity(&signed, payload.as_bytes(), &[SECRET]);
        assert_eq!(parsed.map(|v| v.compact()), Ok(signed));
    }

    #[test]
    fn anything_stripe_did_not_sign_as_such_is_not_trusted() {
        let payload = body("evt_1", T);
        let signed = signature_header(SECRET, T, payload.as_bytes());
        let stripe = event("stripe", "evt_1", &payload);
        // No signature carried; no secrets configured here; a signature by another secret;
        // a signature of other bytes; a malformed one.
        assert_eq!(trusted(&stripe, None), None);
        assert_eq!(trusted_creation_time(&stripe, Some(&signed), &[]), None);
        let foreign = signature_header("whsec_not_ours", T, payload.as_bytes());
        assert_eq!(trusted(&stripe, Some(&foreign)), None);
        let of_other_bytes = signature_header(SECRET, T, body("evt_1", T + 1).as_bytes());
        assert_eq!(trusted(&stripe, Some(&of_other_bytes)), None);
        for garbage in [
            "",
            "t=1",
            "v1=00",
            &format!("t={T},v1=zz"),
            &"v1=,".repeat(5000),
        ] {
            assert_eq!(trusted(&stripe, Some(garbage)), None, "{garbage:.40}");
        }
        // A genuine body under another key, or another source.
        assert_eq!(
            trusted(&event("stripe", "evt_other", &payload), Some(&signed)),
            None
        );
        assert_eq!(
            trusted(&event("github", "evt_1", &payload), Some(&signed)),
            None
        );
    }

    #[test]
    fn a_thin_event_or_a_created_after_its_signature_is_not_trusted() {
        let thin = r#"{"id":"evt_1","object":"v2.core.event","created":1764547200,"snapshot_event":"evt_1"}"#;
        let signed = signature_header(SECRET, T, thin.as_bytes());
        assert_eq!(
            trusted(&event("stripe", "evt_1", thin), Some(&signed)),
            None
        );
        // Created up to five minutes after it was signed (clocks): trusted; later: not.
        for (created, expected) in [
            (
                T + CREATED_AFTER_SIGNING_SECS,
                Some(T + CREATED_AFTER_SIGNING_SECS),
            ),
            (T + CREATED_AFTER_SIGNING_SECS + 1, None),
            (T + 86_400, None),
        ] {
            let payload = body("evt_1", created);
            let signed = signature_header(SECRET, T, payload.as_bytes());
            assert_eq!(
                trusted(&event("stripe", "evt_1", &payload), Some(&signed)),
                expected
            );
        }
        // `created` that is not an integer of seconds, or no object at all.
        for odd in [
            r#"{"id":"evt_1","created":"2025-12-01T00:00:00Z"}"#,
            r#"{"id":"evt_1","created":1.5}"#,
            r#"{"id":"evt_1"}"#,
            "[1]",
            "not json",
        ] {
            let signed = signature_header(SECRET, T, odd.as_bytes());
            assert_eq!(
                trusted(&event("stripe", "evt_1", odd), Some(&signed)),
                None,
                "{odd}"
            );
        }
    }
}
