//! The fields an event is searched by, taken from its body once, when it is kept: the object it
//! is about and its customer (`[search]` names where they are). Kept beside the body in indexed
//! columns, so finding a customer's events never reads a body.
//!
//! Pure: no store, no I/O. A value that could not sit in an indexed text column (a NUL, a
//! control character, more than [`MAX_EVENT_FIELD_BYTES`](super::MAX_EVENT_FIELD_BYTES) bytes)
//! is left out, as if absent: one odd body must never fail the batch it came in.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

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
/// The two fields of [`STRIPE_OBJECT`] that make a `customer.*` event its own customer.
const STRIPE_OBJECT_KIND: &str = "/data/object/object";
const STRIPE_OBJECT_ID: &str = "/data/object/id";

impl SearchKeys {
    /// The fields of `payload` at `pointers`. A body that is not JSON has none.
    ///
    /// Taken: a string, a number (as its JSON text), or an expanded object's `id`. For Stripe's
    /// `customer.*` events (`/data/object/object` is `"customer"`) the customer is the object
    /// itself, whose id is the customer's.
    ///
    /// Only what the pointers name is built (see `Wanted`); the rest is checked as JSON and
    /// skipped (its syntax only: a number beyond `f64` or a lone surrogate escape in a field
    /// no pointer reads no longer makes a body keyless). A body that is not UTF-8, or not
    /// JSON, has none.
    pub fn extract(payload: &[u8], pointers: &SearchPointers) -> SearchKeys {
        let wanted = Wanted::of(&[
            pointers.object.as_str(),
            pointers.customer.as_str(),
            STRIPE_OBJECT_KIND,
            STRIPE_OBJECT_ID,
        ]);
        match pruned(payload, &wanted) {
            Some(body) => SearchKeys::of(&body, pointers),
            None => SearchKeys::default(),
        }
    }

    /// The fields of a parsed body (whole, or pruned to what `pointers` name).
    fn of(body: &Value, pointers: &SearchPointers) -> SearchKeys {
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

/// `payload` parsed keeping only what `wanted` names; `None` when it is not UTF-8 or not one
/// JSON value (trailing bytes included), as the whole value's parse would refuse it.
fn pruned(payload: &[u8], wanted: &Wanted) -> Option<Value> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let body = Pruned(wanted).deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(body)
}

/// The parts of a body the search keys read: a tree of JSON pointer tokens. Parsing builds
/// only these subtrees as [`Value`]s and skips the rest ([`IgnoredAny`]: checked as JSON, never
/// allocated), so a 2 KB invoice costs a scan, not a tree of maps and strings. The search keys
/// are then read from the pruned value with the same [`Value::pointer`] as from the whole one.
#[derive(Debug, Default)]
struct Wanted<'p> {
    /// The pointers ending here: this value is built whole.
    whole: bool,
    /// The tokens below this value that some pointer goes through, each with what it wants.
    below: Vec<(Cow<'p, str>, Wanted<'p>)>,
}

impl<'p> Wanted<'p> {
    /// The tree of `pointers`; a pointer that is not one (no leading `/`) adds nothing, as
    /// [`Value::pointer`] finds nothing at it.
    fn of(pointers: &[&'p str]) -> Self {
        let mut root = Wanted::default();
        for pointer in pointers {
            if pointer.is_empty() {
                root.whole = true;
                continue;
            }
            let Some(tokens) = pointer.strip_prefix('/') else {
                continue;
            };
            let mut node = &mut root;
            for token in tokens.split('/') {
                let token = match token.contains('~') {
                    true => Cow::Owned(token.replace("~1", "/").replace("~0", "~")),
                    false => Cow::Borrowed(token),
                };
                let at = match node.below.iter().position(|(t, _)| *t == token) {
                    Some(at) => at,
                    None => {
                        node.below.push((token, Wanted::default()));
                        node.below.len() - 1
                    }
                };
                node = &mut node.below[at].1;
            }
            node.whole = true;
        }
        root
    }

    /// What is wanted under the object key or array index `token`.
    fn below(&self, token: &str) -> Option<&Wanted<'p>> {
        self.below.iter().find(|(t, _)| t == token).map(|(_, w)| w)
    }

    /// What is wanted at array index `index`: a token that is an index as [`Value::pointer`]
    /// reads one (digits, no leading zero).
    fn at_index(&self, index: usize) -> Option<&Wanted<'p>> {
        self.below
            .iter()
            .find(|(t, _)| parse_index(t) == Some(index))
            .map(|(_, w)| w)
    }

    /// The highest array index wanted here: past it an array's items are skipped unbuilt.
    fn last_index(&self) -> Option<usize> {
        self.below.iter().filter_map(|(t, _)| parse_index(t)).max()
    }
}

/// An array index token as RFC 6901 (and [`Value::pointer`]) reads it.
fn parse_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// Parses one value keeping what a [`Wanted`] names: wanted values whole, their containers
/// with only the wanted members (array items not wanted are `null`, so indices hold), and
/// anything else (a scalar where a container was wanted) as `null`, where no pointer finds
/// anything, as in the whole value.
struct Pruned<'w, 'p>(&'w Wanted<'p>);

impl<'de> DeserializeSeed<'de> for Pruned<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.0.whole {
            return Value::deserialize(deserializer);
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned<'_, '_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match self.0.below(&key.0) {
                // A key given twice: the last one's value, as the whole value keeps.
                Some(wanted) => {
                    fields.insert(key.0.into_owned(), map.next_value_seed(Pruned(wanted))?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let last = self.0.last_index();
        let mut items = Vec::new();
        for index in 0.. {
            let item = match self.0.at_index(index) {
                Some(wanted) => seq.next_element_seed(Pruned(wanted))?,
                None => seq.next_element::<IgnoredAny>()?.map(|_| Value::Null),
            };
            let Some(item) = item else { break };
            // Past the last index wanted, items are only skipped.
            if last.is_some_and(|last| index <= last) {
                items.push(item);
            }
        }
        Ok(Value::Array(items))
    }
}

/// An object's key: borrowed from the body, copied only when it has escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(key)))
    }
    fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(key.to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
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

    #[test]
    fn a_key_given_twice_counts_as_its_last_value_and_other_fields_are_skipped() {
        let body = br#"{"data":{"object":{"id":"in_1"}},"lines":[{"id":"il_1"}],"data":{"object":{"id":"in_2","customer":"cus_\u0041"}}}"#;
        assert_eq!(SearchKeys::extract(body, &stripe()), some("in_2", "cus_A"));
        // Broken JSON in a field no pointer reads still makes the body not JSON.
        let broken = br#"{"data":{"object":{"id":"in_1"}},"lines":[1,}"#;
        assert_eq!(
            SearchKeys::extract(broken, &stripe()),
            SearchKeys::default()
        );
        let trailing = br#"{"data":{"object":{"id":"in_1"}}} x"#;
        assert_eq!(
            SearchKeys::extract(trailing, &stripe()),
            SearchKeys::default()
        );
        let latin1 = b"{\"data\":{\"object\":{\"id\":\"in_1\"}},\"name\":\"Ren\xe9\"}";
        assert_eq!(
            SearchKeys::extract(latin1, &stripe()),
            SearchKeys::default()
        );
    }

    #[test]
    fn array_indices_and_escaped_tokens_are_followed() {
        let pointers = SearchPointers {
            object: "/items/1/id".into(),
            customer: "/meta/a~1b/c~0d".into(),
        };
        let body = json!({"items": [{"id": "it_0"}, {"id": "it_1"}, {"id": "it_2"}],
                          "meta": {"a/b": {"c~d": "cus_E"}}});
        let found = SearchKeys::extract(body.to_string().as_bytes(), &pointers);
        assert_eq!(found, some("it_1", "cus_E"));
    }

    /// What `extract` found before it parsed only the wanted parts: the whole body parsed,
    /// the same rules applied. The pruned parse must agree with it on every body.
    fn whole_parse(payload: &[u8], pointers: &SearchPointers) -> SearchKeys {
        match serde_json::from_slice::<Value>(payload) {
            Ok(body) => SearchKeys::of(&body, pointers),
            Err(_) => SearchKeys::default(),
        }
    }

    /// Keys and pointer tokens from a small set, so that pointers often meet the bodies'
    /// fields: Stripe's, array indices (and a leading-zero one, which is no index), the two
    /// characters a pointer escapes, the empty key.
    const TOKENS: &[&str] = &[
        "data", "object", "id", "customer", "0", "1", "01", "a/b", "c~d", "",
    ];

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            prop::sample::select(TOKENS).prop_map(Value::from),
            "[a-z\\\"\u{0}-\u{1f}\u{e9}\u{1f600}]{0,5}".prop_map(Value::from),
        ];
        let tree = leaf.prop_recursive(5, 64, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(TOKENS), inner), 0..5).prop_map(
                    |fields| Value::Object(
                        fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                    )
                ),
            ]
        });
        // Half of them as Stripe events: the object under /data/object.
        prop_oneof![
            tree.clone(),
            tree.prop_map(|object| json!({"id": "evt_1", "data": {"object": object}})),
        ]
    }

    fn any_pointer() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(TOKENS), 0..5).prop_map(|tokens| {
            tokens
                .iter()
                .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
                .collect()
        })
    }

    proptest! {
        #![proptest_config(crate::proptest_support::config(1024))]

        #[test]
        fn the_pruned_parse_finds_what_the_whole_parse_finds(
            body in any_json(),
            object in any_pointer(),
            customer in any_pointer(),
            cut in any::<prop::sample::Index>(),
        ) {
            let pointers = SearchPointers { object, customer };
            let text = body.to_string();
            prop_assert_eq!(
                SearchKeys::extract(text.as_bytes(), &pointers),
                whole_parse(text.as_bytes(), &pointers)
            );
            // Cut short anywhere: mostly not JSON any more; the two agree either way.
            let short = &text.as_bytes()[..cut.index(text.len())];
            prop_assert_eq!(
                SearchKeys::extract(short, &pointers),
                whole_parse(short, &pointers)
            );
        }
    }
}
