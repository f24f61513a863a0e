//! `/`: the last hour at a glance: the per-minute counts (`activity_minutes`, written with what
//! they count, so a past minute never changes) as an inline SVG chart (drawn here, no script)
//! and as a table, the queue's depth and oldest message, outbox counts, the sinks whose circuit
//! is open, paused or held, the keys of ordered sinks held by a failed row, and recent failures.
//! The page refreshes itself every 15 s (a `<meta>` refresh, no script) unless `?refresh=off`.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::Extension;
use maud::{html, Markup, PreEscaped};

use super::{csrf, event_path, layout_with_head, when, PageError};
use crate::console::auth::Caller;
use crate::console::ConsoleState;
use crate::operator::{self, RowFilter};
use crate::store::{bounded, MinuteCount, Series};

/// The series charted and listed, in this order, each with its colour and label. States (the
/// outbox's pending rows) are cards, not series: a chart of a state would change its past.
const SERIES: &[(Series, &str, &str)] = &[
    (Series::Handled, "#1a7f37", "handled"),
    (Series::Duplicates, "#9a6700", "duplicates"),
    (Series::DeadLettered, "#cf222e", "dead-lettered"),
    (Series::Stale, "#8250df", "stale"),
    (Series::OutboxWritten, "#6e7781", "outbox rows written"),
    (Series::Delivered, "#0969da", "delivered"),
    (Series::DeliveryFailed, "#bc4c00", "delivery failed"),
    (Series::GaveUp, "#a40e26", "gave up"),
    (Series::Throttled, "#bf8700", "throttled"),
    (Series::Redriven, "#1b7c83", "redriven"),
    (Series::Discarded, "#57606a", "discarded"),
    (Series::Retried, "#8a4600", "retried"),
    (Series::Resent, "#218bff", "re-sent"),
];

const MINUTES: i64 = 60;

/// How often the page reloads itself, in seconds.
const REFRESH_SECS: u32 = 15;

/// Each minute's counts by series, minutes as Unix ms (series the page does not know are left
/// out: a newer version's, during a rolling upgrade).
type ByMinute = BTreeMap<i64, BTreeMap<Series, i64>>;

/// `GET /` (`?refresh=off`: without the self-refresh).
pub async fn dashboard(
    State(state): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Result<Markup, PageError> {
    // Anything else than `refresh=off` (a typo, a repeated key) leaves the refresh on.
    let refreshing = !form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .any(|(key, value)| key == "refresh" && value == "off");
    let within = state.options.statement_timeout;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let current = now_ms - now_ms.rem_euclid(60_000);
    let start = current - (MINUTES - 1) * 60_000;
    let unavailable = |e: crate::store::StoreError| PageError::unavailable(&e);
    let counts = bounded(within, state.store.reads().minute_counts(start))
        .await
        .map_err(unavailable)?;
    let counting_since = bounded(within, state.store.reads().counting_since())
        .await
        .map_err(unavailable)?
        .filter(|since| *since > start);
    let by_minute = by_minute(&counts);
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
    let sum = |series: Series| {
        by_minute
            .values()
            .filter_map(|counts| counts.get(&series))
            .sum::<i64>()
    };
    let body = html! {
        p #refresh.muted {
            @if refreshing {
                "This page reloads every " (REFRESH_SECS) " s. "
                a #refresh-toggle href="/?refresh=off" { "Stop reloading" }
            } @else {
                "This page does not reload by itself. "
                a #refresh-toggle href="/" { "Reload every " (REFRESH_SECS) " s" }
            }
        }
        div.cards {
            div.card { "Queue depth" b #queue-depth { (depth) } span.muted { (state.options.queue) } }
            div.card { "Oldest waiting" b #queue-oldest { (oldest) } }
            div.card { "Dead letters" b #dead-letter-count { (totals.dead_letters) } }
            div.card { "Outbox pending" b { (totals.outbox_pending) } }
            div.card { "Outbox failed" b #outbox-failed-count { (totals.outbox_failed) } }
        }
        h2 { "The last hour, per minute" }
        @if let Some(since) = counting_since {
            p #counting-since.muted {
                "Counting since " (hh_mm(since)) " UTC: minutes before this version was "
                "installed have no counts."
            }
        }
        (chart(&by_minute, start, current))
        p #legend {
            @for (i, (series, colour, label)) in SERIES.iter().enumerate() {
                @if i > 0 { " · " }
                span style={ "color:" (colour) } { "■ " } (label) " " strong { (sum(*series)) }
            }
        }
        (minutes_table(&by_minute, current))
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
    let head = html! {
        @if refreshing { meta http-equiv="refresh" content=(REFRESH_SECS); }
    };
    Ok(layout_with_head(
        "Overview",
        &csrf(&state, &caller),
        head,
        body,
    ))
}

/// The counts by minute, then series.
fn by_minute(counts: &[MinuteCount]) -> ByMinute {
    let mut by_minute = ByMinute::new();
    for c in counts {
        if let Some(series) = Series::from_name(&c.series) {
            *by_minute
                .entry(c.minute_ms)
                .or_default()
                .entry(series)
                .or_default() += c.count;
        }
    }
    by_minute
}

/// Unix ms as `HH:MM` (UTC).
fn hh_mm(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%H:%M").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// The chart's numbers as a table (for screen readers, and for copying): a row per minute with
/// counts, newest first, a column per series counted in the hour; the current minute is marked
/// as still counting.
fn minutes_table(by_minute: &ByMinute, current: i64) -> Markup {
    let shown: Vec<&(Series, &str, &str)> = SERIES
        .iter()
        .filter(|(series, _, _)| by_minute.values().any(|c| c.contains_key(series)))
        .collect();
    html! {
        details #minutes-details {
            summary { "The counts per minute, as a table" }
            @if by_minute.is_empty() {
                p.muted { "Nothing was counted in the last hour." }
            } @else {
                table #minutes {
                    caption.muted { "Minutes in UTC, newest first. A minute is final once the transactions that began in it have ended." }
                    thead { tr {
                        th scope="col" { "Minute" }
                        @for (series, _, label) in &shown { th scope="col" data-series=(series.name()) { (label) } }
                    } }
                    tbody {
                        @for (minute, counts) in by_minute.iter().rev() {
                            @let still = *minute >= current;
                            tr data-minute=(minute) class=[still.then_some("counting")] {
                                th scope="row" {
                                    (hh_mm(*minute))
                                    @if still { " " em { "(still counting)" } }
                                }
                                @for (series, _, _) in &shown {
                                    td data-series=(series.name()) { (counts.get(series).copied().unwrap_or(0)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An SVG line per series over the minutes from `start`, scaled to the largest count; the
/// current minute's segment (`current`, still counting) dashed.
fn chart(by_minute: &ByMinute, start: i64, current: i64) -> Markup {
    const W: i64 = 900;
    const H: i64 = 160;
    let mut by_series: BTreeMap<Series, Vec<i64>> = BTreeMap::new();
    for (minute, counts) in by_minute {
        let slot = (minute - start) / 60_000;
        if !(0..MINUTES).contains(&slot) {
            continue;
        }
        for (series, n) in counts {
            by_series
                .entry(*series)
                .or_insert_with(|| vec![0; MINUTES as usize])[slot as usize] += n;
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
    let last = usize::try_from((current - start) / 60_000).unwrap_or(0);
    let mut paths = String::new();
    for (series, colour, _) in SERIES {
        let Some(values) = by_series.get(series) else {
            continue;
        };
        let point = |(i, n): (usize, &i64)| format!("{},{}", x(i), y(*n));
        let done: Vec<String> = values.iter().enumerate().take(last).map(point).collect();
        paths.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            done.join(" ")
        ));
        if let (Some(before), Some(now)) = (values.get(last.wrapping_sub(1)), values.get(last)) {
            paths.push_str(&format!(
                "<line class=\"counting\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{colour}\" \
                 stroke-width=\"2\" stroke-dasharray=\"4 3\"/>",
                x(last - 1),
                y(*before),
                x(last),
                y(*now)
            ));
        }
    }
    html! {
        svg #chart xmlns="http://www.w3.org/2000/svg" viewBox={ "-30 -5 " (W + 40) " " (H + 25) } width="100%" height="200" role="img" aria-label="events per minute, last hour (the table below has the numbers)" {
            line x1="0" y1=(H) x2=(W) y2=(H) stroke="#d0d7de" {}
            text x="-28" y="10" font-size="11" fill="#6e7781" { (max) }
            text x="-28" y=(H) font-size="11" fill="#6e7781" { "0" }
            text x="0" y=(H + 18) font-size="11" fill="#6e7781" { "60 min ago" }
            text x=(W - 110) y=(H + 18) font-size="11" fill="#6e7781" { "now (dashed: still counting)" }
            // Numbers and fixed colours only: nothing of the data's text goes in here.
            (PreEscaped(paths))
        }
    }
}
