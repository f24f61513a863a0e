//! Dead letters by filter on both stores: counts, lists and redrives against the oracle.

use std::collections::BTreeSet;
use std::sync::Arc;

use dedup_worker::testing::test_settings;
use dedup_worker_core::operator::{self, Actor, RowFilter};
use dedup_worker_core::startup::build_transport;
use dedup_worker_core::store::{NewDeadLetter, Store, Wakeups};

use super::common::{assert_recorded, at, expected, filters, paged, texts, ROWS, T0};
use crate::helpers::db::execute;
use crate::helpers::{Backend, TestDb};

both_stores!(dead_letter_counts_match_their_redrives);

/// Writes a dead letter per row of [`ROWS`] (event `evt_{i}`), dead-lettered at its time.
async fn write_dead_letters(store: &Store, backend: Backend) -> Vec<i64> {
    let mut tx = store.begin().await.unwrap();
    for (i, (event_type, _)) in ROWS.iter().enumerate() {
        let row = NewDeadLetter {
            source: "stripe".into(),
            event_id: format!("evt_{i}"),
            event_type: (*event_type).into(),
            queue: "dedup.events".into(),
            payload: format!("{{\"id\":\"evt_{i}\"}}").into_bytes(),
            error: "fatal".into(),
            attempts: 3,
        };
        tx.insert_dead_letter(&row).await.unwrap();
    }
    tx.commit().await.unwrap();
    let ids: Vec<i64> = store
        .dead_letters()
        .list(100)
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    for (id, (_, offset)) in ids.iter().zip(ROWS) {
        let time = at(backend, T0 + offset);
        execute(
            store,
            &format!("UPDATE dead_letters SET created_at = {time} WHERE id = {id}"),
        )
        .await;
    }
    ids
}

/// For each filter: the count and the (paged, newest first) list are what the oracle selects;
/// then, filter after filter, the redrive takes exactly what its dry run counted among the
/// dead letters left, publishes them, and leaves the others; each redrive is recorded.
async fn dead_letter_counts_match_their_redrives(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let ids = write_dead_letters(&store, backend).await;
    let all: BTreeSet<i64> = ids.iter().copied().collect();
    for filter in filters(&ids) {
        let want = expected(&filter, &ids, &all);
        let count = operator::count_dead_letters(&store, &filter).await.unwrap();
        assert_eq!(count, want.len() as u64, "count of {filter:?}");
        let listed = paged(|before| {
            let (store, filter) = (&store, &filter);
            async move {
                let page = operator::list_dead_letters(store, filter, before, 2).await;
                page.unwrap().iter().map(|d| d.id).collect()
            }
        })
        .await;
        let newest_first: Vec<i64> = want.iter().rev().copied().collect();
        assert_eq!(listed, newest_first, "list of {filter:?}");
    }
    let listed = operator::list_dead_letters(&store, &RowFilter::default(), None, 100).await;
    let first = listed.unwrap().pop().expect("the oldest");
    assert_eq!(
        (first.event_type.as_str(), first.created_at_ms),
        (ROWS[0].0, T0)
    );

    let settings = test_settings(&db.url, &[]);
    let transport = build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
    let actor = Actor::console("tester");
    let mut left = all.clone();
    let mut recorded = Vec::new();
    for filter in filters(&ids) {
        let want = expected(&filter, &ids, &left);
        let count = operator::count_dead_letters(&store, &filter).await.unwrap();
        let redriven =
            operator::redrive_dead_letters(&store, transport.as_ref(), &filter, None, &actor)
                .await
                .unwrap();
        assert_eq!((count, redriven), (want.len() as u64, count), "{filter:?}");
        left = left.difference(&want).copied().collect();
        let now: BTreeSet<i64> = store
            .dead_letters()
            .list(100)
            .await
            .unwrap()
            .iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(now, left, "after redriving {filter:?}, the others are kept");
        recorded.push((serde_json::to_string(&filter).unwrap(), redriven as i64));
    }
    let published = texts(&store, "SELECT message_id FROM queue_messages ORDER BY id").await;
    let mut published_sorted = published.clone();
    published_sorted.sort();
    published_sorted.dedup();
    assert_eq!(
        published_sorted.len(),
        ROWS.len(),
        "each published once: {published:?}"
    );
    assert_recorded(&store, "dlq_redrive", &actor, &recorded).await;
}
