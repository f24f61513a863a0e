//! [`OutboxPlan`]: how a handler's messages become outbox rows, each in the lane of its sink.
//! A message that names a destination (`.to("billing")`, `.to("https://…")`) goes there. One
//! that names none goes where `[[outbox.routes]]` send it: one row per sink of every matching
//! route (the same idempotency key in each), and when no route matches, to the `default` lane,
//! or nowhere with `outbox.unrouted = "drop"`. With no routes, all go to `default`, as before
//! routes existed.
//!
//! A row for an ordered sink (`[outbox.sinks.NAME] ordered = true`) gets its ordering key here:
//! the string or number at the sink's `ordering_key` pointer in the message's payload. A
//! payload without one there is delivered unordered (counted in
//! `dedup_outbox_unkeyed_rows_total{lane}`), rather than holding every such row behind one
//! another.

use std::collections::HashMap;

use super::routes::{Route, Routes};
use super::OutboxMessage;
use crate::config::{OutboxSettings, Unrouted, DEFAULT_LANE};
use crate::event::Event;
use crate::store::NewOutboxRow;

/// The configured routes, compiled once at start (see the module's doc).
#[derive(Debug, Clone)]
pub struct OutboxPlan {
    routes: Routes,
    /// `outbox.unrouted = "drop"`: a message no route matches is not delivered.
    drop_unrouted: bool,
    /// The ordered sinks, by name, and the JSON pointer to each one's ordering key.
    ordered: HashMap<String, String>,
}

impl Default for OutboxPlan {
    /// No routes: every message without a destination to the `default` lane.
    fn default() -> Self {
        OutboxPlan {
            routes: Routes::new(Vec::new()),
            drop_unrouted: false,
            ordered: HashMap::new(),
        }
    }
}

impl OutboxPlan {
    pub fn new(settings: &OutboxSettings) -> Self {
        let routes = settings
            .routes
            .iter()
            .map(|route| Route {
                name: route.name.clone(),
                sources: route.sources.clone(),
                types: route.types.clone(),
                matches: route
                    .matches
                    .iter()
                    .map(|(pointer, value)| (pointer.clone(), value.clone()))
                    .collect(),
                sinks: route.sinks.clone(),
            })
            .collect();
        let ordered = settings
            .sinks
            .iter()
            .filter_map(|(name, sink)| Some((name.clone(), sink.ordering_pointer()?.to_owned())))
            .collect();
        OutboxPlan {
            routes: Routes::new(routes),
            drop_unrouted: settings.unrouted == Unrouted::Drop,
            ordered,
        }
    }

    /// Appends the rows of `event`'s handler's `messages` to `rows`.
    pub fn rows(
        &self,
        event: &Event,
        messages: Vec<OutboxMessage>,
        traceparent: Option<&str>,
        rows: &mut Vec<NewOutboxRow>,
    ) {
        for message in messages {
            let row = |destination: Option<String>, message: &OutboxMessage| NewOutboxRow {
                ordering_key: destination
                    .as_deref()
                    .and_then(|sink| self.ordering_key(sink, message)),
                source: event.source.clone(),
                event_id: event.id.clone(),
                destination,
                idempotency_key: message.idempotency_key.clone(),
                event_type: message.event_type.clone(),
                payload: message.payload.to_vec(),
                traceparent: traceparent.map(str::to_owned),
            };
            if message.destination.is_some() || self.routes.is_empty() {
                rows.push(row(message.destination.clone(), &message));
                continue;
            }
            let payload = self
                .routes
                .needs_payload()
                .then(|| serde_json::from_slice::<serde_json::Value>(&message.payload).ok())
                .flatten();
            let sinks = self
                .routes
                .sinks_for(&event.source, &message.event_type, payload.as_ref());
            if sinks.is_empty() {
                if self.drop_unrouted {
                    metrics::counter!("dedup_outbox_unrouted_total").increment(1);
                    tracing::debug!(source = %event.source, event_id = %event.id, event_type = %message.event_type, "no route matches; not delivered (outbox.unrouted = \"drop\")");
                } else {
                    rows.push(row(None, &message));
                }
                continue;
            }
            for sink in sinks {
                let destination = (sink != DEFAULT_LANE).then(|| sink.to_owned());
                rows.push(row(destination, &message));
            }
        }
    }
}

impl OutboxPlan {
    /// The ordering key of `message`'s row in lane `sink`, if that sink is ordered and the
    /// payload holds a string or a number at its pointer (see the module's doc).
    fn ordering_key(&self, sink: &str, message: &OutboxMessage) -> Option<String> {
        let pointer = self.ordered.get(sink)?;
        let payload = serde_json::from_slice::<serde_json::Value>(&message.payload).ok();
        let key = match payload.as_ref().and_then(|p| p.pointer(pointer)) {
            Some(serde_json::Value::String(key)) if !key.is_empty() => Some(key.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        if key.is_none() {
            metrics::counter!("dedup_outbox_unkeyed_rows_total", "lane" => sink.to_owned())
                .increment(1);
            tracing::debug!(sink, pointer = %pointer, event_type = %message.event_type, "no ordering key in the payload; delivered unordered");
        }
        key
    }
}
