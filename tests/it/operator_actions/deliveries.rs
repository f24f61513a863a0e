//! Outbox rows by filter on both stores: failed deliveries counted, listed and retried,
//! dispatched ones counted and re-sent, against the oracle. Every row of [`ROWS`] is written
//! three times (failed at its time, dispatched at its time, pending), so a filter that
//! mistook the status or the time column would take rows it must not.

use std::collections::BTreeSet;

use dedup_worker_core::operator::{self, Actor, RowFilter};
use dedup_worker_core::store::{NewOutboxRow, Store};

use super::common::{assert_recorded, at, expected, filters, paged, ROWS, T0};
use crate::helpers::db::execute;
use crate::helpers::{Backend, TestDb};

both_stores!(
    failed_delivery_counts_match_their_retries,
    dispatched_delivery_counts_match_their_resends,
    a_retry_larger_than_a_chunk_takes_every_row,
);

/// A row as the test compares it: id, status, attempts, last error, no claim, no dispatch
/// time, due now.
type RowState = (i64, String, i32, String, bool, bool, bool);

/// Every outbox row, in id order.
async fn snapshot(store: &Store) -> Vec<RowState> {
    const COLUMNS: &str = "SELECT id, status, attempts, coalesce(last_error, ''),
                                  claim_token IS NULL, dispatched_at IS NULL";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(&format!(
            "{COLUMNS}, next_attempt_at <= now() FROM outbox ORDER BY id"
        ))
        .fetch_all(pool)
        .await
        .unwrap(),
        (_, Some(pool)) => sqlx::query_as(&format!(
            "{COLUMNS}, next_attempt_at <= {} FROM outbox ORDER BY id",
            chrono::Utc::now().timestamp_millis()
        ))
        .fetch_all(pool)
        .await
        .unwrap(),
        (None, None) => unreachable!("a store is one of the two"),
    }
}

fn outbox_row(event_id: String, event_type: &str) -> NewOutboxRow {
    NewOutboxRow {
        source: "stripe".into(),
        idempotency_key: format!("key_{event_id}"),
        payload: format!("{{\"id\":\"{event_id}\"}}").into_bytes(),
        event_id,
        destination: None,
        event_type: event_type.into(),
        traceparent: None,
        ordering_key: None,
    }
}

/// The ids of the failed, the dispatched and the pending rows, each in [`ROWS`] order.
struct Written {
    failed: Vec<i64>,
    dispatched: Vec<i64>,
}

/// Puts the row `id` of [`ROWS`]`[i]` in the state `status` at its time (a failed row is
/// created then; a dispatched one was created a minute before [`T0`] and dispatched then).
async fn set_state(store: &Store, backend: Backend, id: i64, i: usize, status: &str) {
    let time = at(backend, T0 + ROWS[i].1);
    let set = match status {
        "failed" => format!(
            "status = 'failed', attempts = 3, last_error = 'HTTP 500', claim_token = 42, \
             created_at = {time}, next_attempt_at = {time}"
        ),
        "dispatched" => format!(
            "status = 'dispatched', attempts = 1, claim_token = 43, last_error = NULL, \
             created_at = {}, dispatched_at = {time}",
            at(backend, T0 - 60_000)
        ),
        _ => format!(
            "created_at = {time}, next_attempt_at = {}",
            at(backend, 4_000_000_000_000)
        ),
    };
    execute(store, &format!("UPDATE outbox SET {set} WHERE id = {id}")).await;
}

async fn write_deliveries(store: &Store, backend: Backend) -> Written {
    let mut rows = Vec::new();
    for kind in ["f", "d", "p"] {
        for (i, (event_type, _)) in ROWS.iter().enumerate() {
            rows.push(outbox_row(format!("evt_{kind}{i}"), event_type));
        }
    }
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&rows).await.unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<i64> = snapshot(store).await.iter().map(|r| r.0).collect();
    let (failed, rest) = ids.split_at(ROWS.len());
    let (dispatched, pending) = rest.split_at(ROWS.len());
    for (status, family) in [
        ("failed", failed),
        ("dispatched", dispatched),
        ("pending", pending),
    ] {
        for (i, id) in family.iter().enumerate() {
            set_state(store, backend, *id, i, status).await;
        }
    }
    Written {
        failed: failed.to_vec(),
        dispatched: dispatched.to_vec(),
    }
}

/// `after` is `before` except the rows `moved`, which are now `now`.
fn only_moved(before: &[RowState], after: &[RowState], moved: &BTreeSet<i64>, now: &RowState) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        if moved.contains(&b.0) {
            assert_eq!(
                a,
                &(
                    b.0,
                    now.1.clone(),
                    now.2,
                    now.3.clone(),
                    now.4,
                    now.5,
                    now.6
                )
            );
        } else {
            assert_eq!(a, b, "a row the filter does not select is untouched");
        }
    }
}

/// For each filter, on the whole set of failed rows: the count and the paged list are what
/// the oracle selects; the retry takes exactly those (pending, no attempts, due now, the last
/// error kept) and leaves every other row as it was; each retry is recorded.
async fn failed_delivery_counts_match_their_retries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let rows = write_deliveries(&store, backend).await;
    let all: BTreeSet<i64> = rows.failed.iter().copied().collect();
    let actor = Actor("cli (tester)".into());
    let mut recorded = Vec::new();
    for filter in filters(&rows.failed) {
        let want = expected(&filter, &rows.failed, &all);
        let count = operator::count_failed_deliveries(&store, &filter)
            .await
            .unwrap();
        assert_eq!(count, want.len() as u64, "count of {filter:?}");
        let listed = paged(|before| {
            let (store, filter) = (&store, &filter);
            async move {
                let page = operator::list_failed_deliveries(store, filter, before, 2).await;
                page.unwrap().iter().map(|d| d.id).collect()
            }
        })
        .await;
        assert_eq!(
            listed,
            want.iter().rev().copied().collect::<Vec<_>>(),
            "{filter:?}"
        );
        let before = snapshot(&store).await;
        let retried = operator::retry_failed_deliveries(&store, &filter, &actor)
            .await
            .unwrap();
        assert_eq!(
            retried, count,
            "the retry takes what its dry run counted: {filter:?}"
        );
        let now = (0, "pending".into(), 0, "HTTP 500".into(), true, true, true);
        only_moved(&before, &snapshot(&store).await, &want, &now);
        recorded.push((serde_json::to_string(&filter).unwrap(), retried as i64));
        for (i, id) in rows.failed.iter().enumerate() {
            set_state(&store, backend, *id, i, "failed").await;
        }
    }
    assert_recorded(&store, "outbox_retry", &actor, &recorded).await;
    let newest = operator::list_failed_deliveries(&store, &RowFilter::default(), None, 1).await;
    let newest = newest.unwrap().pop().expect("a failed row");
    let last = ROWS.len() - 1;
    assert_eq!(newest.idempotency_key, format!("key_evt_f{last}"));
    assert_eq!((newest.status.as_str(), newest.attempts), ("failed", 3));
    assert_eq!(newest.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(newest.event_type, ROWS[last].0);
    assert_eq!(
        (newest.created_at_ms, newest.dispatched_at_ms),
        (T0 + ROWS[last].1, None)
    );
}

/// As for retries, on the dispatched rows by their dispatch time: the re-send takes exactly
/// what the count said (pending, no attempts, no dispatch time, due now, under no claim).
async fn dispatched_delivery_counts_match_their_resends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let rows = write_deliveries(&store, backend).await;
    let all: BTreeSet<i64> = rows.dispatched.iter().copied().collect();
    let actor = Actor::console("tester");
    let mut recorded = Vec::new();
    for filter in filters(&rows.dispatched) {
        let want = expected(&filter, &rows.dispatched, &all);
        let count = operator::count_dispatched_deliveries(&store, &filter)
            .await
            .unwrap();
        assert_eq!(count, want.len() as u64, "count of {filter:?}");
        let before = snapshot(&store).await;
        let resent = operator::resend_dispatched_deliveries(&store, &filter, &actor)
            .await
            .unwrap();
        assert_eq!(
            resent, count,
            "the re-send takes what its dry run counted: {filter:?}"
        );
        let now = (0, "pending".into(), 0, String::new(), true, true, true);
        only_moved(&before, &snapshot(&store).await, &want, &now);
        recorded.push((serde_json::to_string(&filter).unwrap(), resent as i64));
        for (i, id) in rows.dispatched.iter().enumerate() {
            set_state(&store, backend, *id, i, "dispatched").await;
        }
    }
    assert_recorded(&store, "outbox_resend", &actor, &recorded).await;
}

/// 2,500 failed rows, more than two chunks: one retry takes every one, and one re-send of
/// them once dispatched takes every one again.
async fn a_retry_larger_than_a_chunk_takes_every_row(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let rows: Vec<NewOutboxRow> = (0..2_500)
        .map(|i| outbox_row(format!("evt_{i}"), "invoice.paid"))
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&rows).await.unwrap();
    tx.commit().await.unwrap();
    execute(&store, "UPDATE outbox SET status = 'failed', attempts = 12").await;
    let actor = Actor::cli();
    let filter = RowFilter::default();
    assert_eq!(
        operator::count_failed_deliveries(&store, &filter)
            .await
            .unwrap(),
        2_500
    );
    let retried = operator::retry_failed_deliveries(&store, &filter, &actor).await;
    assert_eq!(retried.unwrap(), 2_500);
    assert_eq!(store.outbox().counts().await.unwrap().pending, 2_500);

    let now = chrono::Utc::now().timestamp_millis();
    execute(
        &store,
        &format!(
            "UPDATE outbox SET status = 'dispatched', dispatched_at = {}",
            at(backend, now)
        ),
    )
    .await;
    let since = RowFilter {
        since_ms: Some(now - 1_000),
        ..RowFilter::default()
    };
    let resent = operator::resend_dispatched_deliveries(&store, &since, &actor).await;
    assert_eq!(resent.unwrap(), 2_500);
    assert_eq!(store.outbox().counts().await.unwrap().pending, 2_500);
    let recorded: Vec<i64> = operator::recent_actions(&store, 10)
        .await
        .unwrap()
        .iter()
        .map(|a| a.count)
        .collect();
    assert_eq!(recorded, [2_500, 2_500]);
}
