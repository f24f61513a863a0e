//! [`OutboxPlan`]: how a handler's messages become outbox rows, each in the lane of its sink.
//! A message that names a destination (`.to("billing")`, `.to("https://…")`) goes there. One
//! that names none goes where `[[outbox.routes]]` send it: one row per sink of every matching
//! route (the same idempotency key in each), and when no route matches, to the `default` lane,
//! or nowhere with `outbox.unrouted = "drop"`. With no routes, all go to `default`, as before
//! routes existed.

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
}

impl Default for OutboxPlan {
    /// No routes: every message without a destination to the `default` lane.
    fn default() -> Self {
        OutboxPlan {
            routes: Routes::new(Vec::new()),
            drop_unrouted: false,
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
        OutboxPlan {
            routes: Routes::new(routes),
            drop_unrouted: settings.unrouted == Unrouted::Drop,
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
