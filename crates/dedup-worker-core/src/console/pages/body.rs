//! The event page's "Body" section: the body the store kept of a handled event
//! (`retention.payload_days`), indented when it is JSON, capped, with the sender headers kept
//! beside it; hidden when `admin.show_payloads` hides payloads.
//!
//! A body that cannot be read is said so in one sentence (the cause goes to the log): the
//! rest of the event's page is still worth showing.

use maud::{html, Markup};

use crate::console::ConsoleState;
use crate::event::SenderHeaders;
use crate::inspect::EventReport;

/// The most of a body the page shows.
const BODY_CAP: usize = 64 * 1024;

/// The section for `report`'s event; nothing for an event never handled (no body can be kept).
pub async fn kept_body(state: &ConsoleState, report: &EventReport) -> Markup {
    if report.processed.is_none() {
        return html! {};
    }
    if !state.options.show_payloads {
        return html! {
            h2 { "Body" }
            p.muted #body-hidden { "Bodies are hidden here (admin.show_payloads)." }
        };
    }
    let limit = state.options.statement_timeout;
    let read = state.store.bodies().kept(&report.source, &report.event_id);
    let failure = match tokio::time::timeout(limit, read).await {
        Ok(Ok(kept)) => Ok(kept),
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(_) => Err(format!("no answer within {limit:?}")),
    };
    let kept = match failure {
        Ok(kept) => kept,
        Err(error) => {
            tracing::warn!(%error, source = %report.source, event_id = %report.event_id, "console: reading a kept body failed");
            return html! {
                h2 { "Body" }
                p.error #body-unreadable { "The kept body could not be read; the log says why." }
            };
        }
    };
    let Some(kept) = kept else {
        return html! {
            h2 { "Body" }
            p.muted #body-none { "No body is kept for this event: bodies are kept retention.payload_days after handling (not at all when it is 0)." }
        };
    };
    let headers = SenderHeaders::from_wire(kept.headers.as_deref());
    html! {
        h2 { "Body" }
        p.muted {
            @if let Some(object) = &kept.object_id { "object " code { (object) } " · " }
            @if let Some(customer) = &kept.customer { "customer " code { (customer) } " · " }
            "kept " (super::when(kept.kept_at))
        }
        @if !headers.is_empty() {
            details #headers {
                summary { "Sender headers" }
                ul { @for (name, value) in headers.iter() { li { code { (name) } ": " (value) } } }
            }
        }
        pre #body { (pretty(&kept.body)) }
    }
}

/// A body as indented JSON (as it is when it is not JSON), cut at [`BODY_CAP`].
fn pretty(body: &[u8]) -> String {
    let text = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    if text.len() <= BODY_CAP {
        return text;
    }
    let mut cut = BODY_CAP;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}\n… ({} bytes more)", &text[..cut], text.len() - cut)
}

/// An error and its causes, `: ` between them, for the log.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
