//! The history check judged on fabricated tables: it must name each way the history can fail to
//! add up.

use super::*;

fn effect(event_id: &str) -> EffectRow {
    EffectRow {
        event_id: event_id.into(),
        payload_id: event_id.into(),
        process: "consumer-0".into(),
        backend_pid: 1,
        delivery_attempt: 1,
        inserted_at_us: 0,
    }
}

/// Two events handled (one twice, after the window), one stale, three deliveries of which one
/// failed once first: every table adds up.
fn consistent() -> (HistoryTables, Vec<EffectRow>) {
    let effects = vec![effect("evt_a"), effect("evt_b"), effect("evt_b")];
    let tables = HistoryTables {
        bodies_by_event: [("evt_a", 1), ("evt_b", 2), ("evt_stale", 1)]
            .map(|(id, n)| (id.to_owned(), n))
            .into(),
        counts: [
            ("handled", 3),
            ("stale", 1),
            ("delivered", 3),
            ("delivery_failed", 1),
        ]
        .map(|(s, n)| (s.to_owned(), n))
        .into(),
        attempts_by_kind: [("delivered", 3), ("failed", 1)]
            .map(|(k, n)| (k.to_owned(), n))
            .into(),
        delivered_twice: vec![],
        dispatched_unrecorded: vec![],
    };
    (tables, effects)
}

#[test]
fn tables_that_add_up_hold() {
    let (tables, effects) = consistent();
    let found = check(&tables, &effects);
    assert_eq!(found.reasons(), Vec::<String>::new(), "{found:?}");
    assert_eq!(found.bodies, 4);
}

#[test]
fn a_handling_without_its_body_is_named() {
    let (mut tables, effects) = consistent();
    tables.bodies_by_event.insert("evt_b".into(), 1);
    let found = check(&tables, &effects);
    assert_eq!(found.bodies_missing, ["evt_b"]);
    assert!(found.bodies_against_counts.is_some(), "{found:?}");
}

#[test]
fn a_body_beyond_handlings_and_stale_events_is_named() {
    let (mut tables, effects) = consistent();
    tables.bodies_by_event.insert("evt_a".into(), 2);
    let found = check(&tables, &effects);
    assert_eq!(found.bodies_extra, ["evt_stale"], "{found:?}");
}

#[test]
fn a_failed_probe_is_a_failed_delivery() {
    let (mut tables, effects) = consistent();
    tables.counts.insert("delivery_failed".into(), 3);
    tables.attempts_by_kind.insert("probe_failed".into(), 2);
    let found = check(&tables, &effects);
    assert_eq!(found.reasons(), Vec::<String>::new(), "{found:?}");
}

#[test]
fn a_count_that_is_not_its_rows_is_named() {
    let (mut tables, effects) = consistent();
    tables.counts.insert("delivered".into(), 4);
    tables.counts.insert("handled".into(), 2);
    let found = check(&tables, &effects);
    assert_eq!(
        found.counts_mismatched,
        ["handled: counted 2, rows 3", "delivered: counted 4, rows 3"]
    );
}

#[test]
fn an_attempt_recorded_twice_or_not_at_all_is_named() {
    let (mut tables, effects) = consistent();
    tables.delivered_twice = vec![(7, 1)];
    tables.dispatched_unrecorded = vec![8, 9];
    let reasons = check(&tables, &effects).reasons();
    assert_eq!(
        reasons,
        [
            "history_delivered_twice: 1",
            "history_dispatched_unrecorded: 2"
        ]
    );
}
