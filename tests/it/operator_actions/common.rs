//! What the store tests share: the rows, the filters tried, and the oracle.

use std::collections::BTreeSet;

use dedup_worker_core::operator::{self, Actor, RowFilter};
use dedup_worker_core::store::Store;

use crate::helpers::Backend;

/// Some moment, in Unix milliseconds.
pub const T0: i64 = 1_796_119_200_000;

/// The rows: event type, and time after [`T0`]. Types that a LIKE, a case-folding or a
/// collation-ordered comparison would confuse with `invoice.`, and two times a millisecond
/// apart.
pub const ROWS: &[(&str, i64)] = &[
    ("invoice.paid", 0),
    ("invoice.payment_failed", 1_000),
    ("invoice", 2_000),
    ("invoicex.paid", 3_000),
    ("charge.refunded", 4_000),
    ("invoice.paid", 5_000),
    ("charge.refunded", 5_999),
    ("Invoice.paid", 6_000),
    ("invoice%paid", 7_000),
    ("invoice_paid", 8_000),
];

/// The filters tried, given the rows' ids (in [`ROWS`] order).
pub fn filters(ids: &[i64]) -> Vec<RowFilter> {
    let typed = |p: &str| RowFilter {
        type_prefix: Some(p.into()),
        ..RowFilter::default()
    };
    let timed = |since: Option<i64>, until: Option<i64>| RowFilter {
        since_ms: since.map(|s| T0 + s),
        until_ms: until.map(|u| T0 + u),
        ..RowFilter::default()
    };
    vec![
        typed("charge.refunded"),
        timed(Some(5_999), Some(6_000)),
        typed("invoice%"),
        RowFilter {
            ids: vec![ids[1], ids[4]],
            ..RowFilter::default()
        },
        RowFilter {
            type_prefix: Some("charge.".into()),
            ..timed(Some(4_000), Some(5_999))
        },
        timed(None, Some(5_000)),
        typed("invoice."),
        timed(Some(2_000), None),
        typed("invoice"),
        RowFilter::default(),
    ]
}

/// Whether `filter` selects the row `id` of type `event_type` at `time`: the oracle.
pub fn selects(filter: &RowFilter, id: i64, event_type: &str, time: i64) -> bool {
    filter
        .type_prefix
        .as_deref()
        .is_none_or(|p| event_type.starts_with(p))
        && filter.since_ms.is_none_or(|s| time >= s)
        && filter.until_ms.is_none_or(|u| time < u)
        && (filter.ids.is_empty() || filter.ids.contains(&id))
}

/// The rows of `ids` (in [`ROWS`] order) the filter selects, among `among`.
pub fn expected(filter: &RowFilter, ids: &[i64], among: &BTreeSet<i64>) -> BTreeSet<i64> {
    ROWS.iter()
        .zip(ids)
        .filter(|((event_type, offset), id)| {
            among.contains(id) && selects(filter, **id, event_type, T0 + offset)
        })
        .map(|(_, id)| *id)
        .collect()
}

/// A time as the store keeps it, as an SQL literal.
pub fn at(backend: Backend, ms: i64) -> String {
    match backend {
        Backend::Postgres => format!("TIMESTAMPTZ 'epoch' + {ms} * INTERVAL '1 millisecond'"),
        Backend::Sqlite => ms.to_string(),
    }
}

/// Runs `sql` returning one text column, every row.
pub async fn texts(store: &Store, sql: &str) -> Vec<String> {
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_scalar(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_scalar(sql).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Lists through `list` in pages of 2, newest first; the ids.
pub async fn paged<F, Fut>(mut list: F) -> Vec<i64>
where
    F: FnMut(Option<i64>) -> Fut,
    Fut: std::future::Future<Output = Vec<i64>>,
{
    let mut all = Vec::new();
    let mut before = None;
    loop {
        let page = list(before).await;
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(&last) = page.last() else {
            return all;
        };
        all.extend(page);
        before = Some(last);
    }
}

/// The newest actions are `want` (filter JSON, count) in the order taken, by `actor`.
pub async fn assert_recorded(store: &Store, action: &str, actor: &Actor, want: &[(String, i64)]) {
    let mut actions = operator::recent_actions(store, 100).await.unwrap();
    actions.reverse();
    let got: Vec<(String, i64)> = actions
        .iter()
        .map(|a| {
            assert_eq!(
                (a.action.as_str(), a.actor.as_str()),
                (action, actor.0.as_str())
            );
            (a.filter.clone(), a.count)
        })
        .collect();
    assert_eq!(got, want);
    let times: Vec<i64> = actions.iter().map(|a| a.at_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let now = chrono::Utc::now().timestamp_millis();
    assert!(
        times
            .iter()
            .all(|t| (now - 60_000..=now + 1_000).contains(t)),
        "{times:?}"
    );
}
