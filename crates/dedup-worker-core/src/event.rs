//! The unit that flows through the pipeline once it has been received from a transport, and the
//! rules its key fields obey.
//!
//! An event's source, id and type end up in indexed text columns (the dedup key is a primary
//! key), in HTTP headers (`Idempotency-Key`), AMQP short strings (`message_id`, `type`: at most
//! 255 bytes) and logs. What a provider or a foreign producer sends is checked against
//! [`check_event_field`] at the edge (ingress answers 400, the consumer dead-letters), so a value
//! the store cannot hold never reaches a statement shared with other events: PostgreSQL text
//! cannot hold NUL, and a B-tree entry cannot exceed about 2.7 KB.

use std::borrow::Cow;

use bytes::Bytes;

mod headers;
pub mod search_keys;
pub use headers::{SenderHeaders, MAX_SENDER_HEADER_BYTES};

/// An event as the consumer sees it: its dedup key and the raw payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Where it came from: the first half of the dedup key. `stripe` and the Standard Webhooks
    /// route's `standard_webhooks.source` for those routes; a named source's name
    /// (`[sources.NAME]`, `POST /webhooks/NAME`), not its scheme.
    pub source: String,
    /// The provider's event id (`evt_…`): the second half of the dedup key.
    pub id: String,
    /// The event type (`invoice.paid`), empty when unknown.
    pub event_type: String,
    /// The body exactly as received; forwarded byte for byte.
    pub payload: Bytes,
    /// Which delivery of this message this is (1 on the first); lets a handler tell a retry.
    pub delivery_attempt: u32,
    /// The id an earlier release or another setting gave this same message, under the same
    /// source (a thin event's own id, now keyed by its `snapshot_event`; an EventBridge
    /// envelope's id, now keyed by its `detail`): the dedup insert looks it up as well, so a
    /// message handled under the old key is a duplicate under the new one, but never records
    /// it. `None` for most events.
    pub alias: Option<String>,
    /// The sender's own delivery headers its scheme keeps (GitHub's `X-GitHub-Delivery`,
    /// Shopify's `X-Shopify-Topic`, Slack's `X-Slack-Retry-Num`, …; see the book's "Sources"),
    /// carried from the ingress on every transport. Empty for Stripe, Standard Webhooks and
    /// messages other producers sent. Read one with [`Event::header`].
    pub headers: SenderHeaders,
}

impl Event {
    /// The sender's header `name` as the ingress received it, compared without regard to case
    /// (`event.header("x-github-delivery")`); `None` when the sender did not send it or its
    /// scheme does not keep it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    /// The payload parsed as `T`, your own type for what the provider sends: `let invoice:
    /// Invoice = event.json()?;` in a handler, where a payload that does not parse is a fatal
    /// [`crate::consumer::HandlerError`] (it parses no better next time).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// The longest source, event id or event type accepted, in bytes (UTF-8). Stripe's ids are
/// about 30 bytes; 255 is the AMQP short-string limit and far inside PostgreSQL's index limit.
pub const MAX_EVENT_FIELD_BYTES: usize = 255;

/// Which field of an event a value is, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventField {
    Source,
    Id,
    Type,
}

impl EventField {
    pub fn name(self) -> &'static str {
        match self {
            EventField::Source => "source",
            EventField::Id => "id",
            EventField::Type => "type",
        }
    }
}

/// Why a source, id or type is refused. The message names the field and the limit, never more
/// than a short, escaped prefix of the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEventField {
    #[error("the event {} is empty", .field.name())]
    Empty { field: EventField },
    #[error(
        "the event {} is {len} bytes long; at most {MAX_EVENT_FIELD_BYTES} bytes are accepted",
        .field.name()
    )]
    TooLong { field: EventField, len: usize },
    #[error(
        "the event {} contains the control character U+{code:04X} at byte {at}; ids, types \
         and sources must be printable text",
        .field.name()
    )]
    ControlCharacter {
        field: EventField,
        code: u32,
        at: usize,
    },
}

/// Checks one field: at most [`MAX_EVENT_FIELD_BYTES`] bytes and no control character (NUL
/// above all, which PostgreSQL text cannot hold; the others would corrupt headers and logs).
/// Only the type may be empty. Linear in the value's length, and refuses an over-long value
/// before looking at its characters.
pub fn check_event_field(field: EventField, value: &str) -> Result<(), InvalidEventField> {
    if value.is_empty() && field != EventField::Type {
        return Err(InvalidEventField::Empty { field });
    }
    if value.len() > MAX_EVENT_FIELD_BYTES {
        return Err(InvalidEventField::TooLong {
            field,
            len: value.len(),
        });
    }
    match value.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, c)) => Err(InvalidEventField::ControlCharacter {
            field,
            code: u32::from(c),
            at,
        }),
        None => Ok(()),
    }
}

/// Text safe to store and log whatever it came from: control characters escaped (`\u{0}`), at
/// most `max_chars` characters kept (then `…`). For dead letters, whose id or reason may be the
/// very value that was refused.
pub fn printable(value: &str, max_chars: usize) -> Cow<'_, str> {
    let clean = value.chars().take(max_chars).all(|c| !c.is_control());
    if clean && value.chars().nth(max_chars).is_none() {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len().min(max_chars * 4));
    for c in value.chars().take(max_chars) {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    if value.chars().nth(max_chars).is_some() {
        out.push('…');
    }
    Cow::Owned(out)
}

/// Whether `event_type` matches `pattern`, where `*` stands for any run of characters
/// (`invoice.*`, `*.updated`; no `*`: the whole type). Used by `backfill --type` and the
/// stale-event guard's `types`.
pub fn type_matches(pattern: &str, event_type: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = event_type.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: the whole type
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::proptest_support::config;

    #[test]
    fn the_payload_parses_into_the_handlers_type() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Envelope {
            id: String,
            data: Data,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Data {
            object: Invoice,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Invoice {
            #[allow(dead_code)]
            id: String,
            amount_paid: i64,
        }
        let event = |payload: &'static str| Event {
            source: "stripe".into(),
            id: "evt_1".into(),
            event_type: "invoice.paid".into(),
            payload: Bytes::from_static(payload.as_bytes()),
            delivery_attempt: 1,
            alias: None,
            headers: SenderHeaders::default(),
        };
        let paid = event(r#"{"id":"evt_1","data":{"object":{"id":"in_1","amount_paid":500}}}"#);
        let parsed: Envelope = paid.json().unwrap();
        assert_eq!(parsed.data.object.amount_paid, 500);
        assert_eq!(parsed.id, "evt_1");
        let malformed = event(r#"{"id":"evt_1","data":{"object":{"id":"in_1"}}}"#);
        let error = malformed.json::<Envelope>().unwrap_err();
        assert!(error.to_string().contains("amount_paid"), "{error}");
    }

    #[test]
    fn limits() {
        assert_eq!(check_event_field(EventField::Id, "evt_1"), Ok(()));
        assert_eq!(check_event_field(EventField::Type, ""), Ok(()));
        assert_eq!(
            check_event_field(EventField::Id, ""),
            Err(InvalidEventField::Empty {
                field: EventField::Id
            })
        );
        assert_eq!(check_event_field(EventField::Id, &"x".repeat(255)), Ok(()));
        assert_eq!(
            check_event_field(EventField::Id, &"x".repeat(5000)),
            Err(InvalidEventField::TooLong {
                field: EventField::Id,
                len: 5000
            })
        );
        // 86 three-byte characters are 258 bytes: the limit is in bytes.
        assert!(check_event_field(EventField::Id, &"€".repeat(86)).is_err());
        assert_eq!(
            check_event_field(EventField::Id, "evt_\u{0}x"),
            Err(InvalidEventField::ControlCharacter {
                field: EventField::Id,
                code: 0,
                at: 4
            })
        );
        assert!(check_event_field(EventField::Source, "a\nb").is_err());
        assert!(check_event_field(EventField::Type, "a\u{85}").is_err());
        assert_eq!(check_event_field(EventField::Id, "évt_ü 1"), Ok(()));
    }

    #[test]
    fn printable_escapes_and_truncates() {
        assert!(matches!(printable("evt_1", 10), Cow::Borrowed("evt_1")));
        assert_eq!(printable("a\u{0}b", 10), "a\\u{0}b");
        assert_eq!(printable("abcdef", 3), "abc…");
        assert_eq!(printable("abc", 3), "abc");
    }

    proptest! {
        #![proptest_config(config(256))]
        #[test]
        fn accepted_values_are_storable(value in any::<String>()) {
            if check_event_field(EventField::Id, &value).is_ok() {
                prop_assert!(!value.is_empty() && value.len() <= MAX_EVENT_FIELD_BYTES);
                prop_assert!(!value.contains('\0'));
            }
        }

        #[test]
        fn printable_never_contains_control_characters(value in any::<String>(), max in 0usize..64) {
            let out = printable(&value, max);
            prop_assert!(!out.chars().any(char::is_control));
            prop_assert!(out.chars().count() <= max * 10 + 1);
        }
    }

    #[test]
    fn type_patterns_match_as_globs() {
        assert!(type_matches("invoice.paid", "invoice.paid"));
        assert!(!type_matches("invoice.paid", "invoice.paid.extra"));
        assert!(type_matches("invoice.*", "invoice.payment_failed"));
        assert!(!type_matches("invoice.*", "customer.created"));
        assert!(type_matches("*.updated", "customer.subscription.updated"));
        assert!(!type_matches("*.updated", "customer.updated.x"));
        assert!(type_matches("*", "anything"));
        assert!(type_matches(
            "customer.*.updated",
            "customer.subscription.updated"
        ));
        assert!(!type_matches(
            "customer.*.updated",
            "invoice.subscription.updated"
        ));
    }
}
