//! The order check judged on fabricated histories: it must catch a delivery out of its key's
//! commit order, and let retries of a head and interleaved keys pass.

use super::*;

/// A lane row `id` of ordering key `key` (none: unordered), its `Idempotency-Key` `idem`.
fn row(id: i64, key: Option<&str>, idem: &str) -> LaneRow {
    LaneRow {
        id,
        ordering_key: key.map(str::to_owned),
        idempotency_key: idem.into(),
        status: "dispatched".into(),
    }
}

/// A delivery of `idem` (the change of the same name) answered `status`.
fn arrive(idem: &str, status: u16) -> Record {
    Record::OrderedSink {
        t: 0,
        key: idem.into(),
        idempotency_key: Some(idem.into()),
        ordering_key: None,
        status,
    }
}

fn accepted(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// Two keys: `c1` with a1, a2, a3 committed in that order; `c2` with b1, b2 (interleaved ids).
fn lane() -> Vec<LaneRow> {
    vec![
        row(1, Some("c1"), "a1"),
        row(2, Some("c2"), "b1"),
        row(3, Some("c1"), "a2"),
        row(4, Some("c2"), "b2"),
        row(5, Some("c1"), "a3"),
    ]
}

const ALL: [&str; 5] = ["a1", "a2", "a3", "b1", "b2"];

#[test]
fn in_order_with_retried_heads_and_interleaved_keys_holds() {
    let records = [
        arrive("b1", 200),
        arrive("a1", 500),
        // The head again after a failure, and after a 2xx whose answer was lost.
        arrive("a1", 200),
        arrive("b2", 500),
        arrive("a1", 200),
        arrive("a2", 200),
        arrive("b2", 200),
        arrive("a3", 200),
    ];
    let found = check(&records, &lane(), &accepted(&ALL));
    assert!(found.holds(), "{found:?}");
    assert!(found.reasons(5).is_empty(), "{:?}", found.reasons(5));
    assert_eq!(found.ordered_deliveries, 8);
    assert_eq!(found.ordered_deliveries_checked, 8);
    assert_eq!(found.ordered_deliveries_failed, 2);
    assert_eq!(found.ordered_redeliveries, 3);
    assert_eq!(found.ordered_keys_checked, 2);
    assert_eq!(found.ordered_keys_with_several, 2);
}

#[test]
fn a_row_arriving_before_an_earlier_one_was_accepted_is_caught() {
    // a2 goes while a1 was answered only 500.
    let records = [
        arrive("a1", 500),
        arrive("a2", 200),
        arrive("a1", 200),
        arrive("a3", 200),
        arrive("b1", 200),
        arrive("b2", 200),
    ];
    let found = check(&records, &lane(), &accepted(&ALL));
    let kinds: Vec<(&str, &str, &str)> = found
        .order_violations
        .iter()
        .map(|v| (v.kind, v.idempotency_key.as_str(), v.other.as_str()))
        .collect();
    // a2 overtook a1; then a1's retry came after a later row of its key.
    assert_eq!(
        kinds,
        [("overtook", "a2", "a1"), ("after_later", "a1", "a2")]
    );
    assert!(!found.holds());
    assert_eq!(found.reasons(5), ["order_violations: 2"]);
}

#[test]
fn a_row_arriving_before_an_earlier_one_arrived_at_all_is_caught() {
    let records = [
        arrive("a2", 200),
        arrive("a1", 200),
        arrive("a3", 200),
        arrive("b1", 200),
        arrive("b2", 200),
    ];
    let found = check(&records, &lane(), &accepted(&ALL));
    assert_eq!(found.order_violations.len(), 2, "{found:?}");
    assert_eq!(found.order_violations[0].kind, "overtook");
    assert_eq!(found.order_violations[0].place, 1);
    assert_eq!(found.order_violations[0].other_place, 0);
}

#[test]
fn a_late_repeat_after_a_later_row_is_caught() {
    // a1 accepted, a2 delivered, then a1 again (a stale request from a paused relay).
    let records = [
        arrive("a1", 200),
        arrive("a2", 200),
        arrive("a1", 200),
        arrive("a3", 200),
        arrive("b1", 200),
        arrive("b2", 200),
    ];
    let found = check(&records, &lane(), &accepted(&ALL));
    assert_eq!(found.order_violations.len(), 1, "{found:?}");
    assert_eq!(found.order_violations[0].kind, "after_later");
    assert_eq!(found.order_violations[0].idempotency_key, "a1");
    assert_eq!(found.order_violations[0].other, "a2");
}

#[test]
fn the_lane_is_read_in_id_order_whatever_order_it_is_given_in() {
    let mut shuffled = lane();
    shuffled.reverse();
    let records = [arrive("a2", 200), arrive("a1", 200)];
    let found = check(&records, &shuffled, &[]);
    assert_eq!(found.order_violations.len(), 2, "{found:?}");
}

#[test]
fn an_event_never_accepted_at_the_ordered_sink_is_missing() {
    let records = [
        arrive("a1", 200),
        arrive("a2", 500),
        arrive("b1", 200),
        arrive("b2", 200),
    ];
    let found = check(&records, &lane(), &accepted(&ALL));
    assert!(found.order_violations.is_empty(), "{found:?}");
    assert_eq!(found.ordered_missing, ["a2", "a3"]);
    assert_eq!(found.reasons(5), ["ordered_missing: 2"]);
}

#[test]
fn unkeyed_rows_are_counted_not_judged_and_strangers_are_unexpected() {
    let mut rows = lane();
    rows.push(row(6, None, "thin1"));
    rows.push(row(7, None, "thin2"));
    let records = [
        arrive("thin2", 200),
        arrive("a1", 200),
        arrive("thin1", 200),
        arrive("a2", 200),
        arrive("stranger", 200),
    ];
    let found = check(&records, &rows, &[]);
    assert!(found.order_violations.is_empty(), "{found:?}");
    assert_eq!(found.ordered_rows, 7);
    assert_eq!(found.ordered_rows_unkeyed, 2);
    assert_eq!(found.ordered_deliveries_unkeyed, 2);
    assert_eq!(found.ordered_deliveries_checked, 2);
    assert_eq!(found.ordered_unexpected, ["stranger"]);
    assert_eq!(found.reasons(0), ["ordered_unexpected: 1"]);
}

#[test]
fn a_run_that_judged_no_key_over_two_rows_says_so() {
    let records = [arrive("a1", 200), arrive("b1", 200)];
    let found = check(&records, &lane(), &accepted(&["a1", "b1"]));
    assert!(found.holds(), "{found:?}");
    assert_eq!(found.ordered_keys_checked, 2);
    assert_eq!(found.ordered_keys_with_several, 0);
    assert_eq!(
        found.reasons(2),
        ["the order check judged no key with two rows delivered"]
    );
}
