//! The fields an event is searched by, taken from its body once, when it is kept: the object it
//! is about and its customer (`[search]` names where they are). Kept beside the body in indexed
//! columns, so finding a customer's events never reads a body.
//!
//! Pure: no store, no I/O. A value that could not sit in an indexed text column (a NUL, a
//! control character, more than [`MAX_EVENT_FIELD_BYTES`](super::MAX_EVENT_FIELD_BYTES) bytes)
//! is left out, as if absent: one odd body must never fail the batch it came in.

use serde_json::Value;

use super::{check_event_field, EventField};

/// Where the searched fields are in a body (`search.object_pointer`, `search.customer_pointer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchPointers {
    /// JSON pointer to the id of the object the event is about.
    pub object: String,
    /// JSON pointer to the event's customer.
    pub customer: String,
}

/// The searched fields of one body; `None` where the body has no usable value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchKeys {
    /// The id of the object the event is about (`in_…`, `ch_…`).
    pub object_id: Option<String>,
    /// The customer the event is about (`cus_…`).
    pub customer: Option<String>,
}

/// Where Stripe puts the object an event carries, and the field naming its kind.
const STRIPE_OBJECT: &str = "/data/object";

impl SearchKeys {
    /// The fields of `payload` at `pointers`. A body that is not JSON has none.
    ///
    /// Taken: a string, a number (as its JSON text), or an expanded object's `id`. For Stripe's
    /// `customer.*` events (`/data/object/object` is `"customer"`) the customer is the object
    /// itself, whose id is the customer's.
    pub fn extract(payload: &[u8], pointers: &SearchPointers) -> SearchKeys {
        let Ok(body) = serde_json::from_slice::<Value>(payload) else {
            return SearchKeys::default();
        };
        let object = body.pointer(STRIPE_OBJECT);
        let customer = body.pointer(&pointers.customer).and_then(key).or_else(|| {
            let object = object?;
            (object.get("object")?.as_str()? == "customer").then(|| key(object.get("id")?))?
        });
        SearchKeys {
            object_id: body.pointer(&pointers.object).and_then(key),
            customer,
        }
    }
}

/// A value as a searchable key: a string or number, or an object's `id`; checked like an event
/// id (non-empty, at most 255 bytes, no control character).
fn key(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Object(fields) => {
            return fields.get("id").filter(|id| !id.is_object()).and_then(key)
        }
        _ => return None,
    };
    check_event_field(EventField::Id, &text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stripe() -> SearchPointers {
        SearchPointers {
            object: "/data/object/id".into(),
            customer: "/data/object/customer".into(),
        }
    }

    fn keys(body: Value) -> SearchKeys {
        SearchKeys::extract(body.to_string().as_bytes(), &stripe())
    }

    fn some(object: &str, customer: &str) -> SearchKeys {
        SearchKeys {
            object_id: Some(object.into()),
            customer: Some(customer.into()),
        }
    }

    #[test]
    fn an_invoice_gives_its_id_and_customer() {
        let body = json!({"type": "invoice.paid", "data": {"object": {"id": "in_1", "object": "invoice", "customer": "cus_A"}}});
        assert_eq!(keys(body), some("in_1", "cus_A"));
    }

    #[test]
    fn an_expanded_customer_gives_its_id() {
        let body = json!({"data": {"object": {"id": "in_1", "customer": {"id": "cus_A", "email": "a@example.com"}}}});
        assert_eq!(keys(body), some("in_1", "cus_A"));
    }

    #[test]
    fn a_customer_event_is_its_own_customer() {
        let body = json!({"type": "customer.updated", "data": {"object": {"id": "cus_B", "object": "customer"}}});
        assert_eq!(keys(body), some("cus_B", "cus_B"));
    }

    #[test]
    fn numbers_are_taken_as_their_text() {
        let pointers = SearchPointers {
            object: "/order/id".into(),
            customer: "/order/customer_id".into(),
        };
        let body = json!({"order": {"id": 42, "customer_id": 7}});
        let found = SearchKeys::extract(body.to_string().as_bytes(), &pointers);
        assert_eq!(found, some("42", "7"));
    }

    #[test]
    fn nul_control_over_long_empty_and_other_kinds_are_left_out() {
        for bad in [
            json!("cus_\u{0}A"),
            json!("cus\nA"),
            json!("x".repeat(256)),
            json!(""),
            json!(true),
            json!(["cus_A"]),
            json!({"id": {"id": "nested"}}),
            Value::Null,
        ] {
            let body = json!({"data": {"object": {"id": bad.clone(), "customer": bad.clone()}}});
            assert_eq!(keys(body), SearchKeys::default(), "{bad}");
        }
        let longest = "x".repeat(255);
        let body =
            json!({"data": {"object": {"id": longest.clone(), "customer": longest.clone()}}});
        assert_eq!(keys(body), some(&longest, &longest));
    }

    #[test]
    fn a_body_that_is_not_json_or_lacks_the_fields_has_none() {
        assert_eq!(
            SearchKeys::extract(b"not json", &stripe()),
            SearchKeys::default()
        );
        assert_eq!(SearchKeys::extract(b"", &stripe()), SearchKeys::default());
        assert_eq!(keys(json!({"id": "evt_1"})), SearchKeys::default());
    }
}
