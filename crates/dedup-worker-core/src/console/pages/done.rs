//! The banner that says what an action did: every console action ends in a redirect (303) to
//! a page with `?done=ID`, the id its `admin_actions` record has, and the page reads the record
//! back: "Retried 20 deliveries (type invoice.) — console (ops), 2026-12-04 10:02:03.000 UTC".
//! Read from the record, not from the redirect's words, so a reload says the same and a link
//! cannot make a page claim what nobody did.

use maud::{html, Markup};
use serde_json::Value;

use super::{when, when_text};
use crate::console::ConsoleState;
use crate::operator::{self, AdminAction};
use crate::store::bounded;

/// The banner of the action `done` names (a page's `done` field); nothing when it names none,
/// or when it cannot be read (the page itself is still worth showing; the failure is logged).
pub async fn done_banner(state: &ConsoleState, done: &str) -> Markup {
    let Ok(id) = done.trim().parse::<i64>() else {
        return html! {};
    };
    let read = bounded(
        state.options.statement_timeout,
        operator::recorded_action(&state.store, id),
    );
    match read.await {
        Ok(Some(action)) => html! { p #done .banner { (said(&action)) ", " (when(action.at_ms)) } },
        Ok(None) => html! {},
        Err(error) => {
            tracing::warn!(%error, id, "console: reading a recorded action failed");
            html! {}
        }
    }
}

/// What the record says, in a sentence (its time follows).
fn said(action: &AdminAction) -> String {
    let n = action.count;
    let plural = |one: &str, many: &str| {
        if n == 1 {
            one.to_owned()
        } else {
            many.to_owned()
        }
    };
    let what = match action.action.as_str() {
        "dlq_redrive" => format!("Redrove {n} {}", plural("dead letter", "dead letters")),
        "dlq_discard" => format!("Discarded {n} {}", plural("dead letter", "dead letters")),
        "outbox_retry" => format!("Retried {n} {}", plural("delivery", "deliveries")),
        "outbox_resend" => format!("Re-sent {n} {}", plural("delivery", "deliveries")),
        other => format!("{other}: {n} {}", plural("row", "rows")),
    };
    let filter = described(&action.filter);
    let filter = if filter.is_empty() {
        String::new()
    } else {
        format!(" ({filter})")
    };
    format!("{what}{filter} — {}", action.actor)
}

/// A recorded filter (`RowFilter` as JSON) as words: `type invoice., since …, row 42`.
fn described(filter: &str) -> String {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(filter) else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(prefix) = fields.get("type_prefix").and_then(Value::as_str) {
        parts.push(format!("type {prefix}"));
    }
    for (key, word) in [("since_ms", "since"), ("until_ms", "until")] {
        if let Some(ms) = fields.get(key).and_then(Value::as_i64) {
            parts.push(format!("{word} {}", when_text(ms)));
        }
    }
    if let Some(ids) = fields.get("ids").and_then(Value::as_array) {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let word = if ids.len() == 1 { "row" } else { "rows" };
        parts.push(format!("{word} {}", ids.join(", ")));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_action_is_said_with_its_filter_who_and_when() {
        let action = AdminAction {
            id: 7,
            at_ms: 1_796_119_323_000,
            actor: "console (ops)".into(),
            action: "outbox_retry".into(),
            filter: r#"{"type_prefix":"invoice."}"#.into(),
            count: 20,
        };
        assert_eq!(
            said(&action),
            "Retried 20 deliveries (type invoice.) — console (ops)"
        );
        let one = AdminAction {
            action: "outbox_resend".into(),
            filter: r#"{"ids":[42]}"#.into(),
            count: 1,
            ..action
        };
        assert_eq!(said(&one), "Re-sent 1 delivery (row 42) — console (ops)");
    }
}
