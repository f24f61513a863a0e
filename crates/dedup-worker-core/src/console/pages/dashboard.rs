//! `/`: the last hour at a glance: per-minute counts as an inline SVG chart (drawn here, no
//! script), the queue's depth and oldest message, outbox counts, the sinks whose circuit is open,
//! paused or held, the keys of ordered sinks held by a failed row, and recent failures.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Extension;
use maud::{html, Markup, PreEscaped};

use super::{csrf, event_path, layout, when, PageError};
use crate::console::auth::Caller;
use crate::console::ConsoleState;
use crate::operator::{self, RowFilter};
use crate::store::{bounded, MinuteCount};

/// The series charted, their colour and label.
const SERIES: &[(&str, &str, &str)] = &[
    ("handled", "#1a7f37", "handled"),
    ("duplicates", "#9a6700", "duplicates"),
    ("dead_letters", "#cf222e", "dead letters"),
    ("stale", "#8250df", "stale"),
    ("outbox_dispatched", "#0969da", "outbox dispatched"),
    ("outbox_pending", "#6e7781", "outbox pending"),
    ("outbox_failed", "#bc4c00", "outbox failed"),
];

const MINUTES: i64 = 60;

/// `GET /`.
pub async fn dashboard(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
) -> Result<Markup, PageError> {
    let within = state.options.statement_timeout;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let start = (now_ms / 60_000 - (MINUTES - 1)) * 60_000;
    let unavailable = |e: crate::store::StoreError| PageError::unavailable(&e);
    let counts = bounded(within, state.store.reads().minute_counts(start))
        .await
        .map_err(unavailable)?;
    let totals = bounded(within, state.store.reads().alert_counts())
        .await
        .map_err(unavailable)?;
    let backlog = tokio::time::timeout(within, state.transport.backlog())
        .await
        .ok()
        .and_then(Result::ok);
    let recent = RowFilter::default();
    let dead = bounded(
        within,
        operator::list_dead_letters(&state.store, &recent, None, 5),
    )
    .await
    .map_err(unavailable)?;
    let failed = bounded(
        within,
        operator::list_failed_deliveries(&state.store, &recent, None, 5),
    )
    .await
    .map_err(unavailable)?;
    let lanes = bounded(within, operator::lane_states(&state.store))
        .await
        .map_err(unavailable)?;
    let held = bounded(within, operator::held_keys(&state.store, 20))
        .await
        .map_err(unavailable)?;
    let depth = backlog
        .as_ref()
        .and_then(|b| b.depth)
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let oldest = backlog
        .as_ref()
        .and_then(|b| b.oldest_age)
        .map(|a| format!("{} s", a.as_secs()))
        .unwrap_or_else(|| "—".into());
    let sum = |series: &str| {
        counts
            .iter()
            .filter(|c| c.series == series)
            .map(|c| c.count)
            .sum::<i64>()
    };
    let body = html! {
        div.cards {
            div.card { "Queue depth" b #queue-depth { (depth) } span.muted { (state.options.queue) } }
            div.card { "Oldest waiting" b #queue-oldest { (oldest) } }
            div.card { "Dead letters" b #dead-letter-count { (totals.dead_letters) } }
            div.card { "Outbox pending" b { (totals.outbox_pending) } }
            div.card { "Outbox failed" b #outbox-failed-count { (totals.outbox_failed) } }
        }
        h2 { "The last hour, per minute" }
        (chart(&counts, start))
        p {
            @for (i, (series, colour, label)) in SERIES.iter().enumerate() {
                @if i > 0 { " · " }
                span style={ "color:" (colour) } { "■ " } (label) " " strong { (sum(series)) }
            }
        }
        h2 { "Sinks" }
        @if lanes.is_empty() {
            p.muted { "Every sink's circuit is closed; none is paused or held by its receiver." }
        } @else {
            table #sinks {
                thead { tr { th { "Sink" } th { "Circuit" } th { "Paused" } th { "Held for" } th { "Trips" } th { "Last error" } } }
                tbody {
                    @for lane in &lanes { tr {
                        td { (crate::config::lane_label(&lane.sink)) }
                        td class=(lane.circuit.as_str()) { (lane.circuit.as_str().replace('_', "-")) }
                        td { @if lane.paused { "paused by " (lane.paused_by.as_deref().unwrap_or("?")) } @else { "no" } }
                        td { (lane.held_for().map(|d| format!("{} s", d.as_secs())).unwrap_or_else(|| "—".into())) }
                        td { (lane.trips) }
                        td { (lane.last_error.as_deref().unwrap_or("")) }
                    } }
                }
            }
            p.muted { "Other sinks are closed, running and not held. " code { "dedup-worker outbox resume SINK" } " closes a circuit and lifts a pause or a hold." }
        }
        @if !held.is_empty() {
            h2 { "Keys held by a failed delivery" }
            table #held-keys {
                thead { tr { th { "Sink" } th { "Key" } th { "Row" } th { "Event" } th { "Waiting behind it" } th { "Error" } } }
                tbody {
                    @for h in &held { tr {
                        td { (crate::config::lane_label(&h.sink)) }
                        td { (h.ordering_key) }
                        td { (h.id) }
                        td { a.event href=(event_path(&h.source, &h.event_id)) { (h.event_id) } }
                        td { (h.waiting) }
                        td { (h.last_error.as_deref().unwrap_or("")) }
                    } }
                }
            }
            p.muted { "An ordered sink delivers the rows of a key one after another, so these wait. " code { "dedup-worker outbox retry --failed" } " sends the failed rows again; " code { "dedup-worker outbox skip ROW" } " gives up on one and lets its key go on." }
        }
        h2 { "Recent failures" }
        table #recent-failures {
            thead { tr { th { "When" } th { "What" } th { "Event" } th { "Error" } } }
            tbody {
                @for d in &dead { tr {
                    td { (when(d.created_at_ms)) } td.dead_letter { "dead letter" }
                    td { a.event href=(event_path(&d.source, &d.event_id)) { (d.event_id) } } td { (d.error) }
                } }
                @for o in &failed { tr {
                    td { (when(o.created_at_ms)) } td.failed { "delivery failed" }
                    td { a.event href=(event_path(&o.source, &o.event_id)) { (o.event_id) } } td { (o.last_error.as_deref().unwrap_or("")) }
                } }
            }
        }
    };
    Ok(layout("Overview", &csrf(&state, &caller), body))
}

/// An SVG line per series over the minutes from `start`, scaled to the largest count.
fn chart(counts: &[MinuteCount], start: i64) -> Markup {
    const W: i64 = 900;
    const H: i64 = 160;
    let mut by_series: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for c in counts {
        let slot = (c.minute_ms - start) / 60_000;
        if (0..MINUTES).contains(&slot) {
            by_series
                .entry(c.series.as_str())
                .or_insert_with(|| vec![0; MINUTES as usize])[slot as usize] += c.count;
        }
    }
    let max = by_series
        .values()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |i: usize| i as i64 * W / (MINUTES - 1);
    let y = |n: i64| H - n * (H - 10) / max;
    let mut paths = String::new();
    for (series, colour, _) in SERIES {
        let Some(values) = by_series.get(series) else {
            continue;
        };
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{},{}", x(i), y(*n)))
            .collect();
        paths.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        ));
    }
    html! {
        svg #chart xmlns="http://www.w3.org/2000/svg" viewBox={ "-30 -5 " (W + 40) " " (H + 25) } width="100%" height="200" role="img" aria-label="events per minute, last hour" {
            line x1="0" y1=(H) x2=(W) y2=(H) stroke="#d0d7de" {}
            text x="-28" y="10" font-size="11" fill="#6e7781" { (max) }
            text x="-28" y=(H) font-size="11" fill="#6e7781" { "0" }
            text x="0" y=(H + 18) font-size="11" fill="#6e7781" { "60 min ago" }
            text x=(W - 30) y=(H + 18) font-size="11" fill="#6e7781" { "now" }
            // Numbers and fixed colours only: nothing of the data's text goes in here.
            (PreEscaped(paths))
        }
    }
}
