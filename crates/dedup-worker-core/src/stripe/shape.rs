//! The shapes in which Stripe delivers one change, and the dedup key each of them carries.
//!
//! * A **snapshot event** (`"object": "event"`): its `id` (`evt_…`) is the key.
//! * A **thin event** (an event notification, `"object": "v2.core.event"`): for a v1
//!   resource, Stripe sends it beside the snapshot event of the same change and names that
//!   event in `snapshot_event`. The pair is one change under two ids, so the key of a thin event
//!   is its `snapshot_event` when it has one (whichever of the two arrives first is handled, the
//!   other is a duplicate), else its own `id` (v2 resources have no snapshot).
//! * An **Amazon EventBridge envelope** (`{version, id, "detail-type", source, account, time,
//!   region, resources, detail}`): `detail` is one of the two above, `source` is
//!   `aws.partner/stripe.com/…`, and the envelope's own `id` is EventBridge's UUID, never the key.
//!
//! Both readers parse only what they need, borrowing from the body.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The source half of the dedup key of every Stripe event, however it arrived (webhook,
/// EventBridge, backfill): one key space.
pub const SOURCE: &str = "stripe";

/// `object` of a thin event.
pub const THIN_EVENT_OBJECT: &str = "v2.core.event";

/// The prefix of an EventBridge envelope's `source` for Stripe's partner event sources.
pub const EVENTBRIDGE_SOURCE_PREFIX: &str = "aws.partner/stripe.com";

/// What the pipeline reads of a Stripe event.
#[derive(Debug, Deserialize)]
pub struct StripeEventHead<'a> {
    /// The event's own id.
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    /// `event` (snapshot) or `v2.core.event` (thin).
    #[serde(borrow, default)]
    pub object: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type", default)]
    pub event_type: Option<Cow<'a, str>>,
    /// Thin events of v1 resources: the id of the snapshot event of the same change.
    #[serde(borrow, default)]
    pub snapshot_event: Option<Cow<'a, str>>,
    /// Thin events: the account context (`Stripe-Context`) their full event is fetched under.
    #[serde(borrow, default)]
    pub context: Option<Cow<'a, str>>,
}

/// Why a body is not a Stripe event the pipeline can key.
#[derive(Debug, thiserror::Error)]
pub enum StripeShapeError {
    #[error("the payload is not a JSON object: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the payload has no string `id`")]
    NoId,
    #[error("the thin event's `snapshot_event` is not a non-empty string")]
    BadSnapshotEvent,
}

impl<'a> StripeEventHead<'a> {
    /// Reads the head of a Stripe event (snapshot or thin); an object with a non-empty `id`.
    pub fn read(body: &'a [u8]) -> Result<Self, StripeShapeError> {
        // An object only: serde would read `["evt_1"]` into the struct, as a sequence.
        if body.trim_ascii_start().first() != Some(&b'{') {
            return Err(StripeShapeError::NotJson(serde::de::Error::custom(
                "expected a JSON object",
            )));
        }
        let head: StripeEventHead =
            serde_json::from_slice(body).map_err(StripeShapeError::NotJson)?;
        if head.id.as_deref().is_none_or(str::is_empty) {
            return Err(StripeShapeError::NoId);
        }
        if head.is_thin() && head.snapshot_event.as_deref() == Some("") {
            return Err(StripeShapeError::BadSnapshotEvent);
        }
        Ok(head)
    }

    /// Whether this is a thin event (an event notification).
    pub fn is_thin(&self) -> bool {
        self.object.as_deref() == Some(THIN_EVENT_OBJECT)
    }

    /// The event's own id (non-empty after [`Self::read`]).
    pub fn own_id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }

    /// The dedup key's id: a thin event's `snapshot_event` when it has one, else its own id.
    pub fn dedup_id(&self) -> &str {
        match (&self.snapshot_event, self.is_thin()) {
            (Some(snapshot), true) => snapshot,
            _ => self.own_id(),
        }
    }
}

/// Why a body is not an EventBridge envelope of a Stripe event.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    #[error("the EventBridge envelope's `detail` is not a JSON object")]
    NoDetail,
    #[error("the EventBridge envelope's source {0:?} is not a Stripe partner event source ({EVENTBRIDGE_SOURCE_PREFIX}/…)")]
    NotStripe(String),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    /// EventBridge's own id of this put, as it is (not read as a string: a foreign value of
    /// another type must not make the envelope unreadable).
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    source: Option<Cow<'a, str>>,
    /// Present whatever its value (`null` included): a `detail` key makes the message an
    /// envelope, never an event keyed on EventBridge's own `id`.
    #[serde(borrow, default, deserialize_with = "present")]
    detail: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The Stripe event inside an EventBridge envelope, as the exact bytes of its `detail` (no
/// copy), in one parse that borrows from the body. `Ok(None)`: not an envelope (not a JSON
/// object, or neither a top-level `detail`, which a Stripe event never has, nor Stripe's
/// partner event `source`), so the message is read as a plain event: a dead letter redriven,
/// or a webhook this service's ingress published onto the same queue. An envelope must come
/// from Stripe's partner event source and carry an object as its `detail`.
pub fn eventbridge_detail(body: &Bytes) -> Result<Option<Bytes>, EnvelopeError> {
    Ok(eventbridge_envelope(body)?.map(|envelope| envelope.detail))
}

/// What the pipeline reads of an EventBridge envelope of a Stripe event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBridgeEnvelope {
    /// EventBridge's own id (new for every put), when it is a string: never the event's key,
    /// but the key a consumer without `consumer.envelope = "eventbridge"` gave the message.
    pub id: Option<String>,
    /// The Stripe event, as the exact bytes of the envelope's `detail`.
    pub detail: Bytes,
}

/// [`eventbridge_detail`], with the envelope's own id.
pub fn eventbridge_envelope(body: &Bytes) -> Result<Option<EventBridgeEnvelope>, EnvelopeError> {
    // An object only: serde would read `[null, {..}]` into the struct, as a sequence.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Ok(None);
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope>(body) else {
        return Ok(None);
    };
    let source = envelope.source.unwrap_or_default();
    let from_stripe = source.starts_with(EVENTBRIDGE_SOURCE_PREFIX);
    match envelope.detail {
        None if !from_stripe => Ok(None),
        _ if !from_stripe => Err(EnvelopeError::NotStripe(
            crate::event::printable(&source, 80).into_owned(),
        )),
        Some(detail) if detail.get().starts_with('{') => Ok(Some(EventBridgeEnvelope {
            id: envelope
                .id
                .and_then(|id| serde_json::from_str::<String>(id.get()).ok()),
            detail: body.slice_ref(detail.get().as_bytes()),
        })),
        _ => Err(EnvelopeError::NoDetail),
    }
}

/// The one change a Stripe message carries, and the key it is claimed under: what
/// [`stripe_change`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeChange {
    /// The change's key: a snapshot event's id, a thin event's `snapshot_event` (its own id
    /// when it has none), the same of an EventBridge envelope's `detail`. Every copy of one
    /// change, on whichever channel, has this key, so the dedup insert that claims it is the
    /// one place two copies meet.
    pub key: String,
    /// The message's other id, a key an earlier release or another setting gave it: a thin
    /// event's own id (when it names a snapshot event), an envelope's own `id`.
    pub other: Option<String>,
}

/// Every field [`stripe_change`] may need, of an event or of an envelope, in one parse that
/// borrows from the body; each as it is, so a value of a foreign type makes the message not a
/// change rather than unreadable.
#[derive(Deserialize)]
struct ChangeShape<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    snapshot_event: Option<&'a RawValue>,
    #[serde(borrow, default)]
    source: Option<&'a RawValue>,
    #[serde(borrow, default)]
    detail: Option<&'a RawValue>,
}

/// A JSON string's value, borrowed where it has no escapes; `None` for any other JSON value.
fn string_of(raw: Option<&RawValue>) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Cow<str>>(raw?.get()).ok()
}

/// The change a message carries, when it is one of Stripe's shapes: a Stripe EventBridge
/// envelope (whatever the consumer's source or `consumer.envelope`: its `source` says it is
/// Stripe's), or, when `stripe_source` (the message is under source `stripe`), a snapshot or
/// thin event. `None` for anything else (not JSON, no `object`, another object, a `detail`
/// that is not a Stripe event): the message is keyed by the general rule.
pub fn stripe_change(body: &[u8], stripe_source: bool) -> Option<StripeChange> {
    // An object only: serde would read `["evt_1"]` into the struct, as a sequence.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let shape: ChangeShape = serde_json::from_slice(body).ok()?;
    let from_eventbridge =
        string_of(shape.source).is_some_and(|s| s.starts_with(EVENTBRIDGE_SOURCE_PREFIX));
    if from_eventbridge {
        let detail = StripeEventHead::read(shape.detail?.get().as_bytes()).ok()?;
        let key = detail.dedup_id().to_owned();
        let other = string_of(shape.id).filter(|id| *id != key);
        return Some(StripeChange {
            key,
            other: other.map(Cow::into_owned),
        });
    }
    if !stripe_source {
        return None;
    }
    let object = string_of(shape.object)?;
    let own_id = string_of(shape.id).filter(|id| !id.is_empty())?;
    let snapshot = string_of(shape.snapshot_event).filter(|id| !id.is_empty());
    match (&*object, snapshot) {
        (THIN_EVENT_OBJECT, Some(snapshot)) if snapshot != own_id => Some(StripeChange {
            key: snapshot.into_owned(),
            other: Some(own_id.into_owned()),
        }),
        ("event" | THIN_EVENT_OBJECT, _) => Some(StripeChange {
            key: own_id.into_owned(),
            other: None,
        }),
        _ => None,
    }
}

/// Why [`thin_event_beside`] cannot make a thin event of a body.
#[derive(Debug, thiserror::Error)]
pub enum ThinEventError {
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error(
        "not a snapshot event (an object with \"object\": \"event\", a string `id` and `type`)"
    )]
    NotSnapshot,
}

/// The thin event (event notification) Stripe's event destinations with the thin payload send
/// beside the snapshot event `snapshot`, for local tests (`dedup-worker sign --thin-event`): its
/// own id (`evt_…` with `_thin` appended), `v1.` before the type, `created` as RFC 3339, the
/// related object (`data.object`'s id, object, and URL), and `snapshot_event` naming the
/// snapshot, so the two are one change.
pub fn thin_event_beside(snapshot: &[u8]) -> Result<Vec<u8>, ThinEventError> {
    use serde_json::{json, Value};
    let event: Value = serde_json::from_slice(snapshot).map_err(ThinEventError::NotJson)?;
    let (Some("event"), Some(id), Some(event_type)) = (
        event["object"].as_str(),
        event["id"].as_str(),
        event["type"].as_str(),
    ) else {
        return Err(ThinEventError::NotSnapshot);
    };
    let created = event["created"]
        .as_i64()
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .unwrap_or_else(chrono::Utc::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let object = &event["data"]["object"];
    let mut thin = json!({
        "id": format!("{id}_thin"),
        "object": THIN_EVENT_OBJECT,
        "type": format!("v1.{event_type}"),
        "livemode": event["livemode"].as_bool().unwrap_or(false),
        "created": created,
        "snapshot_event": id,
    });
    if let (Some(object_id), Some(kind)) = (object["id"].as_str(), object["object"].as_str()) {
        // `invoice` → /v1/invoices/in_1; `checkout.session` → /v1/checkout/sessions/cs_1.
        let url = format!("/v1/{}s/{object_id}", kind.replace('.', "/"));
        thin["related_object"] = json!({"id": object_id, "type": kind, "url": url});
    }
    if let Some(account) = event["account"].as_str() {
        thin["context"] = json!(account);
    }
    serde_json::to_vec_pretty(&thin).map_err(ThinEventError::NotJson)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_of_a_thin_event_is_its_snapshot_event() {
        let thin = br#"{"id":"evt_thin","object":"v2.core.event","type":"v1.invoice.paid","snapshot_event":"evt_A","created":"2026-11-30T10:00:00.000Z"}"#;
        let head = StripeEventHead::read(thin).unwrap();
        assert!(head.is_thin());
        assert_eq!((head.own_id(), head.dedup_id()), ("evt_thin", "evt_A"));
        let v2 = br#"{"id":"evt_v2","object":"v2.core.event","type":"v2.core.account.updated"}"#;
        assert_eq!(StripeEventHead::read(v2).unwrap().dedup_id(), "evt_v2");
        // A snapshot event keeps its own id, whatever else it carries.
        let snapshot =
            br#"{"id":"evt_A","object":"event","snapshot_event":"evt_X","type":"invoice.paid"}"#;
        assert_eq!(StripeEventHead::read(snapshot).unwrap().dedup_id(), "evt_A");
    }

    #[test]
    fn a_change_is_keyed_by_its_snapshot_event_and_a_thin_events_own_id_is_the_other() {
        let thin = br#"{"id":"evt_thin","object":"v2.core.event","snapshot_event":"evt_A"}"#;
        let change = stripe_change(thin, true).unwrap();
        assert_eq!(
            (change.key.as_str(), change.other.as_deref()),
            ("evt_A", Some("evt_thin"))
        );
        for one_id in [
            &br#"{"id":"evt_v2","object":"v2.core.event"}"#[..],
            br#"{"id":"evt_A","object":"event","snapshot_event":"evt_B"}"#,
        ] {
            assert_eq!(stripe_change(one_id, true).unwrap().other, None);
        }
        // Under another source only an envelope, which names Stripe itself, is a change.
        assert_eq!(stripe_change(thin, false), None);
    }

    #[test]
    fn the_thin_event_beside_a_snapshot_event_is_keyed_by_it() {
        let snapshot = br#"{"id":"evt_1","object":"event","type":"checkout.session.completed","created":1764547200,"account":"acct_9","data":{"object":{"id":"cs_1","object":"checkout.session"}}}"#;
        let thin = thin_event_beside(snapshot).unwrap();
        let head = StripeEventHead::read(&thin).unwrap();
        assert!(head.is_thin());
        assert_eq!((head.own_id(), head.dedup_id()), ("evt_1_thin", "evt_1"));
        assert_eq!(
            head.event_type.as_deref(),
            Some("v1.checkout.session.completed")
        );
        assert_eq!(head.context.as_deref(), Some("acct_9"));
        let value: serde_json::Value = serde_json::from_slice(&thin).unwrap();
        assert_eq!(value["created"], "2025-12-01T00:00:00.000Z");
        assert_eq!(value["related_object"]["url"], "/v1/checkout/sessions/cs_1");
        for refused in [
            &b"nope"[..],
            br#"{"id":"evt_1","object":"v2.core.event","type":"x"}"#,
            br#"{"object":"event"}"#,
        ] {
            assert!(thin_event_beside(refused).is_err());
        }
    }

    #[test]
    fn what_cannot_be_keyed_says_why() {
        for (body, expected) in [
            (&b"[1]"[..], "not a JSON object"),
            (b"nope", "not a JSON object"),
            (br#"{"id":""}"#, "no string `id`"),
            (br#"{"id":7}"#, "not a JSON object"),
            (br#"{"object":"v2.core.event"}"#, "no string `id`"),
            (
                br#"{"id":"evt_1","object":"v2.core.event","snapshot_event":""}"#,
                "snapshot_event",
            ),
            (
                br#"{"id":"evt_1","object":"v2.core.event","snapshot_event":3}"#,
                "not a JSON object",
            ),
        ] {
            let error = StripeEventHead::read(body).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn an_eventbridge_envelope_yields_its_detail_byte_for_byte() {
        let detail = r#"{"id": "evt_1", "object": "event", "type": "invoice.paid"}"#;
        let body = Bytes::from(format!(
            r#"{{"version":"0","id":"6a7e8feb-b491-4cf7-a9f1-bf3703467718","detail-type":"invoice.paid","source":"aws.partner/stripe.com/ed_test_61abc","account":"123456789012","time":"2026-11-30T10:00:00Z","region":"us-east-1","resources":[],"detail":{detail}}}"#
        ));
        assert_eq!(
            eventbridge_detail(&body).unwrap().as_deref(),
            Some(detail.as_bytes())
        );
        let envelope = eventbridge_envelope(&body).unwrap().unwrap();
        assert_eq!(
            envelope.id.as_deref(),
            Some("6a7e8feb-b491-4cf7-a9f1-bf3703467718")
        );
        // An id that is not a string is no reason to refuse the envelope.
        let numeric = Bytes::from(format!(
            r#"{{"id":7,"source":"aws.partner/stripe.com/ed_1","detail":{detail}}}"#
        ));
        let envelope = eventbridge_envelope(&numeric).unwrap().unwrap();
        assert_eq!(
            (envelope.id, envelope.detail.as_ref()),
            (None, detail.as_bytes())
        );
        // Not envelopes: read as plain events.
        for plain in [detail, "[]", "not json", r#"{"id":"evt_1","detail":"#] {
            let plain = Bytes::copy_from_slice(plain.as_bytes());
            assert!(eventbridge_detail(&plain).unwrap().is_none(), "{plain:?}");
        }
        for foreign in [
            &br#"{"source":"aws.ec2","detail":{"id":"i-1"}}"#[..],
            br#"{"detail":null}"#,
        ] {
            assert!(matches!(
                eventbridge_detail(&Bytes::copy_from_slice(foreign)),
                Err(EnvelopeError::NotStripe(_))
            ));
        }
        for odd in [
            &br#"{"source":"aws.partner/stripe.com/x","detail":"evt"}"#[..],
            br#"{"source":"aws.partner/stripe.com/x","detail":null}"#,
            br#"{"source":"aws.partner/stripe.com/x","id":"6a7e8feb"}"#,
        ] {
            assert!(matches!(
                eventbridge_detail(&Bytes::copy_from_slice(odd)),
                Err(EnvelopeError::NoDetail)
            ));
        }
    }
}
