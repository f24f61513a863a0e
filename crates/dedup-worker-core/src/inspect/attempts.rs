//! An event's delivery attempts and the operator's acts on its deliveries (`outbox_attempts`),
//! as `events show` gives them: the JSON list (`"attempts"`) and one text line each.

use serde_json::{json, Value};

use super::time;
use crate::event::printable;
use crate::store::AttemptRecord;

/// The longest error or excerpt shown on a text line (the JSON carries what was kept).
const MAX_TEXT_CHARS: usize = 200;

/// The JSON of each attempt, in the order recorded. The response excerpt is given as text
/// (invalid UTF-8 replaced); the CLI reads the database with its own access, so it is not
/// hidden as the console's `admin.show_payloads` may hide it.
pub(super) fn to_json(attempts: &[AttemptRecord]) -> Vec<Value> {
    attempts
        .iter()
        .map(|a| {
            let headers: Vec<Value> = a
                .headers()
                .into_iter()
                .map(|(name, value)| json!([name, value]))
                .collect();
            json!({
                "at": time(a.at), "outbox_id": a.outbox_id, "attempt": a.attempt,
                "kind": a.kind, "lane": a.lane, "destination": a.destination,
                "started_at": a.started_at.map(time), "duration_ms": a.duration_ms,
                "status": a.status, "error": a.error, "response_headers": headers,
                "response_excerpt": a.response_body.as_deref().map(String::from_utf8_lossy),
                "response_truncated": a.body_truncated, "actor": a.actor,
            })
        })
        .collect()
}

/// One line an attempt: `attempt 2 failed at T (120 ms): 500 receiver answered 500 — {"error":…}`,
/// or an operator's act with who.
pub(super) fn text_line(a: &AttemptRecord) -> (String, String) {
    let name = format!("outbox #{}", a.outbox_id);
    if let Some(actor) = &a.actor {
        return (name, format!("{} by {} at {}", a.kind, actor, time(a.at)));
    }
    let mut text = format!("attempt {} {} at {}", a.attempt, a.kind, time(a.at));
    if let Some(ms) = a.duration_ms {
        text.push_str(&format!(" ({ms} ms)"));
    }
    if let Some(status) = a.status {
        text.push_str(&format!(": HTTP {status}"));
    }
    if let Some(error) = &a.error {
        text.push_str(&format!(": {}", printable(error, MAX_TEXT_CHARS)));
    }
    if let Some(body) = a.response_body.as_deref().filter(|b| !b.is_empty()) {
        let body = String::from_utf8_lossy(body);
        text.push_str(&format!(" — {}", printable(&body, MAX_TEXT_CHARS)));
    }
    (name, text)
}
