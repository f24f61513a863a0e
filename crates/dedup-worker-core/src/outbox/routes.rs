//! Routes (`[[outbox.routes]]`): which sinks receive the events a handler forwards without
//! naming a destination.
//!
//! A route matches on the event's source, its type (exactly or by a `prefix*`), and values at
//! JSON pointers in its payload; every route that matches adds its sinks. The configuration
//! layer parses and checks the entries (`config::check_type_pattern`, `config::check_pointer`); this module
//! only matches, so it does no I/O and reads no payload it is not given.

use serde_json::Value;

/// One `[[outbox.routes]]` entry as the relay uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// A name for logs; `None` when the entry has none.
    pub name: Option<String>,
    /// Empty: any source; else the event's source (the webhook source's name, e.g. "stripe")
    /// must equal one of these.
    pub sources: Vec<String>,
    /// Empty: any type; else the event's type must match one: an exact type, or a prefix
    /// ending in `*` ("invoice.*" matches "invoice.paid", "*" matches all).
    pub types: Vec<String>,
    /// JSON pointer (RFC 6901, starting with '/') and the value that must be JSON-equal at
    /// that pointer in the payload; all must hold, and a pointer to nothing does not match.
    pub matches: Vec<(String, Value)>,
    /// The sinks the event goes to when the route matches, by name; not empty.
    pub sinks: Vec<String>,
}

impl Route {
    /// Whether the route takes the event; `payload` is `None` when not parsed or not JSON.
    fn takes(&self, source: &str, event_type: &str, payload: Option<&Value>) -> bool {
        let source_ok = self.sources.is_empty() || self.sources.iter().any(|s| s == source);
        let type_ok =
            self.types.is_empty() || self.types.iter().any(|p| type_matches(p, event_type));
        source_ok
            && type_ok
            && (self.matches.is_empty()
                || payload.is_some_and(|payload| {
                    self.matches.iter().all(|(pointer, wanted)| {
                        payload
                            .pointer(pointer)
                            .is_some_and(|found| json_equal(found, wanted))
                    })
                }))
    }
}

/// The configured routes, in configuration order.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// The routes, in the order they are configured (the order their sinks are named in).
    routes: Vec<Route>,
    /// Whether any route has `matches` (computed once: asked for every event).
    needs_payload: bool,
}

impl Routes {
    pub fn new(routes: Vec<Route>) -> Self {
        let needs_payload = routes.iter().any(|route| !route.matches.is_empty());
        Routes {
            routes,
            needs_payload,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether any route has `matches` (the caller then parses the payload; else it need not).
    pub fn needs_payload(&self) -> bool {
        self.needs_payload
    }

    /// The sink names every matching route names, each once, in the order first named (routes
    /// in order). `payload` is `None` when not parsed or not JSON; then routes with `matches`
    /// do not match.
    pub fn sinks_for(&self, source: &str, event_type: &str, payload: Option<&Value>) -> Vec<&str> {
        let mut sinks: Vec<&str> = Vec::new();
        let matching = self
            .routes
            .iter()
            .filter(|route| route.takes(source, event_type, payload));
        for sink in matching.flat_map(|route| &route.sinks) {
            // A linear check: a handful of sinks, where a set would cost more than it saves.
            if !sinks.contains(&sink.as_str()) {
                sinks.push(sink);
            }
        }
        sinks
    }
}

/// An event type against a pattern: equal, or, for a pattern ending in `*`, starting with what
/// comes before it.
fn type_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// JSON equality: as `Value`'s `==`, except that numbers compare by value, so `1` in the
/// configuration matches `1.0` in a payload (serde_json keeps integers and floats apart).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x == y
            } else if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                x == y
            } else if x.is_f64() || y.is_f64() {
                x.as_f64() == y.as_f64()
            } else {
                // A negative integer and one above i64::MAX.
                false
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| json_equal(x, y)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn route(sources: &[&str], types: &[&str], sinks: &[&str]) -> Route {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        Route {
            name: None,
            sources: strings(sources),
            types: strings(types),
            matches: Vec::new(),
            sinks: strings(sinks),
        }
    }

    /// Any event, to sink "x".
    fn route_any() -> Route {
        route(&[], &[], &["x"])
    }

    fn with_match(mut route: Route, pointer: &str, value: Value) -> Route {
        route.matches.push((pointer.to_string(), value));
        route
    }

    #[test]
    fn no_routes() {
        let routes = Routes::new(Vec::new());
        assert!(routes.is_empty());
        assert!(!routes.needs_payload());
        assert!(routes.sinks_for("stripe", "invoice.paid", None).is_empty());
    }

    #[test]
    fn empty_sources_and_types_match_everything() {
        let routes = Routes::new(vec![route(&[], &[], &["audit"])]);
        assert!(!routes.is_empty());
        assert_eq!(routes.sinks_for("github", "push", None), ["audit"]);
        assert_eq!(routes.sinks_for("", "", None), ["audit"]);
    }

    #[test]
    fn source_must_equal_one_listed() {
        let routes = Routes::new(vec![route(&["stripe", "paypal"], &[], &["billing"])]);
        assert_eq!(routes.sinks_for("paypal", "x", None), ["billing"]);
        assert!(routes.sinks_for("github", "x", None).is_empty());
        assert!(routes.sinks_for("Stripe", "x", None).is_empty());
    }

    #[test]
    fn types_match_exactly_or_by_prefix() {
        let routes = Routes::new(vec![
            route(&[], &["invoice.*"], &["invoices"]),
            route(&[], &["charge.refunded"], &["refunds"]),
            route(&[], &["cust*"], &["customers"]),
        ]);
        let sinks = |event_type| routes.sinks_for("stripe", event_type, None);
        assert_eq!(sinks("invoice.paid"), ["invoices"]);
        assert!(sinks("invoice").is_empty());
        assert_eq!(sinks("charge.refunded"), ["refunds"]);
        assert!(sinks("charge.refunded.extra").is_empty());
        assert_eq!(sinks("customer.created"), ["customers"]);
        assert!(sinks("other").is_empty());
        let all = Routes::new(vec![route(&[], &["*"], &["all"])]);
        assert_eq!(all.sinks_for("s", "", None), ["all"]);
    }

    #[test]
    fn matches_compare_values_at_pointers() {
        let route = with_match(route(&[], &[], &["eu"]), "/data/object/region", json!("eu"));
        let route = with_match(route, "/livemode", json!(true));
        let routes = Routes::new(vec![route]);
        assert!(routes.needs_payload());
        let payload = json!({"livemode": true, "data": {"object": {"region": "eu"}}});
        assert_eq!(routes.sinks_for("s", "t", Some(&payload)), ["eu"]);
        // Every match must hold.
        let test_mode = json!({"livemode": false, "data": {"object": {"region": "eu"}}});
        assert!(routes.sinks_for("s", "t", Some(&test_mode)).is_empty());
        // A pointer to nothing does not match, not even a wanted null.
        let missing = json!({"livemode": true});
        assert!(routes.sinks_for("s", "t", Some(&missing)).is_empty());
        let null = Routes::new(vec![with_match(route_any(), "/gone", Value::Null)]);
        assert!(null.sinks_for("s", "t", Some(&missing)).is_empty());
        assert_eq!(
            null.sinks_for("s", "t", Some(&json!({"gone": null}))),
            ["x"]
        );
    }

    #[test]
    fn matches_need_a_json_payload() {
        let routes = Routes::new(vec![
            with_match(route(&[], &[], &["a"]), "/k", json!(1)),
            route(&[], &[], &["b"]),
        ]);
        assert_eq!(routes.sinks_for("s", "t", None), ["b"]);
        assert_eq!(
            routes.sinks_for("s", "t", Some(&json!({"k": 1}))),
            ["a", "b"]
        );
    }

    #[test]
    fn values_are_json_equal() {
        let routes = |value| Routes::new(vec![with_match(route_any(), "/v", value)]);
        let hits = |value: Value, payload: Value| {
            !routes(value)
                .sinks_for("s", "t", Some(&json!({ "v": payload })))
                .is_empty()
        };
        assert!(hits(json!(1), json!(1.0)));
        assert!(hits(json!(-2), json!(-2)));
        assert!(hits(json!(u64::MAX), json!(u64::MAX)));
        assert!(!hits(json!(-1), json!(u64::MAX)));
        assert!(!hits(json!(1), json!("1")));
        assert!(hits(json!({"a": [1, 2.0]}), json!({"a": [1.0, 2]})));
        assert!(!hits(json!({"a": 1}), json!({"a": 1, "b": 2})));
        assert!(!hits(json!([1, 2]), json!([2, 1])));
        assert!(hits(json!("x"), json!("x")));
    }

    #[test]
    fn pointer_escapes_and_array_indices() {
        let slash = Routes::new(vec![with_match(route_any(), "/a~1b", json!(1))]);
        assert_eq!(slash.sinks_for("s", "t", Some(&json!({"a/b": 1}))), ["x"]);
        assert!(slash
            .sinks_for("s", "t", Some(&json!({"a": {"b": 1}})))
            .is_empty());
        let tilde = Routes::new(vec![with_match(route_any(), "/m~0n", json!(1))]);
        assert_eq!(tilde.sinks_for("s", "t", Some(&json!({"m~n": 1}))), ["x"]);
        let index = Routes::new(vec![with_match(route_any(), "/items/1/id", json!("b"))]);
        let items = json!({"items": [{"id": "a"}, {"id": "b"}]});
        assert_eq!(index.sinks_for("s", "t", Some(&items)), ["x"]);
    }

    #[test]
    fn sinks_once_each_in_the_order_first_named() {
        let routes = Routes::new(vec![
            route(&["stripe"], &[], &["billing", "audit"]),
            route(&[], &["invoice.*"], &["invoices", "billing"]),
            route(&["github"], &[], &["ci"]),
            route(&[], &[], &["audit", "archive", "archive"]),
        ]);
        assert_eq!(
            routes.sinks_for("stripe", "invoice.paid", None),
            ["billing", "audit", "invoices", "archive"]
        );
        assert_eq!(
            routes.sinks_for("github", "push", None),
            ["ci", "audit", "archive"]
        );
    }
}
