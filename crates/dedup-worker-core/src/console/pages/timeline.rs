//! The event page's delivery attempts (`outbox_attempts`): every attempt in the order recorded,
//! with its time, duration, status, error, the receiver's headers (redacted when recorded) in a
//! `<details>`, and the start of its answer's body, hidden when `admin.show_payloads` is false;
//! and the operator's acts (retry, re-send, skip) with who. They outlive the outbox rows, so a
//! delivery's story is told after the row is gone.

use maud::{html, Markup};

use super::when;
use crate::event::printable;
use crate::store::AttemptRecord;

/// The most characters of an answer's excerpt shown.
const EXCERPT_CHARS: usize = 4096;

/// The attempts section of the event page; nothing when none is recorded.
pub fn attempts(attempts: &[AttemptRecord], show_payloads: bool) -> Markup {
    if attempts.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Delivery attempts" }
        div.scroll {
            ol #attempts {
                @for a in attempts { (entry(a, show_payloads)) }
            }
        }
    }
}

/// One attempt, or one operator act.
fn entry(a: &AttemptRecord, show_payloads: bool) -> Markup {
    if let Some(actor) = &a.actor {
        return html! {
            li.attempt.operator data-kind=(a.kind) {
                (when(a.at)) " " strong { (a.kind) } " of delivery " (a.outbox_id) " by " span.actor { (actor) }
            }
        };
    }
    let headers = a.headers();
    let excerpt = a
        .response_body
        .as_deref()
        .filter(|b| !b.is_empty())
        .map(|b| printable(&String::from_utf8_lossy(b), EXCERPT_CHARS).into_owned());
    html! {
        li.attempt data-kind=(a.kind) {
            (when(a.at)) " delivery " (a.outbox_id) " attempt " (a.attempt) ": "
            strong.(a.kind) { (a.kind) }
            @if let Some(status) = a.status { " · HTTP " span.status { (status) } }
            @if let Some(ms) = a.duration_ms { " · " (ms) " ms" }
            @if let Some(destination) = &a.destination { " · to " code.destination { (destination) } }
            @if let Some(error) = &a.error { div.error { (printable(error, 1024)) } }
            @if !headers.is_empty() {
                details.headers {
                    summary { "Response headers (" (headers.len()) ")" }
                    table {
                        @for (name, value) in &headers { tr { td { code { (name) } } td { code { (value) } } } }
                    }
                }
            }
            @match (&excerpt, show_payloads) {
                (Some(text), true) => {
                    pre.excerpt { (text) }
                    @if a.body_truncated { p.muted { "(the answer went on; only its start is kept)" } }
                },
                (Some(_), false) => p.muted { "The answer's body is hidden here (admin.show_payloads)." },
                (None, _) => {},
            }
        }
    }
}
