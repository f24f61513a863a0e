//! Delivery attempts as the marks record them (issue 40), on PostgreSQL and SQLite: a mark
//! retried after its commit records one attempt; a delivery whose lease was lost is recorded
//! all the same; a batch's failures are marked in one statement, each recorded (`failed`, or
//! `gave_up` for the row that reached its limit); recording off records nothing; a skip is
//! recorded with who. On
//! PostgreSQL a missing day's partition skips the history and still commits the mark.

use std::time::Duration;

use chrono::Utc;
use dedup_worker_core::store::{
    dedup_key, AttemptKind, AttemptLane, AttemptMark, FailedMark, NewOutboxRow, OutboxRow, Shard,
    Store,
};

use crate::helpers::db::execute;
use crate::helpers::{store_contract, Backend, TestDb};

store_contract!(
    a_mark_retried_after_its_commit_records_one_attempt,
    a_delivery_whose_lease_was_lost_is_recorded,
    a_batchs_failures_are_marked_at_once_each_recorded,
    recording_off_records_nothing_and_still_marks,
    a_skip_is_recorded_with_who_after_the_attempts,
);

const LANE: AttemptLane<'static> = AttemptLane {
    lane: "default",
    destination: Some("https://hooks.example/…"),
    record: true,
    shard: Shard::ZERO,
};

fn row(id: &str) -> NewOutboxRow {
    NewOutboxRow {
        source: "stripe".into(),
        event_id: id.into(),
        destination: None,
        idempotency_key: id.into(),
        event_type: "invoice.paid".into(),
        payload: format!(r#"{{"id":"{id}"}}"#).into_bytes(),
        traceparent: None,
        ordering_key: None,
    }
}

async fn write(store: &Store, ids: &[&str]) {
    let rows: Vec<NewOutboxRow> = ids.iter().map(|id| row(id)).collect();
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&rows).await.unwrap();
    tx.commit().await.unwrap();
}

async fn claim(store: &Store, lease: Duration) -> Vec<OutboxRow> {
    let mut rows = store
        .outbox()
        .claim_lane("default", 10, lease, false)
        .await
        .unwrap();
    rows.sort_by_key(|r| r.id);
    rows
}

/// The attempt a relay saw for `row`: answered `status` with a body.
fn attempt(row: &OutboxRow, status: i16, body: &str) -> AttemptMark {
    AttemptMark {
        claim: row.claim(),
        event_key: dedup_key(&row.source, &row.event_id),
        attempt: row.attempts,
        started_at: Utc::now(),
        duration_ms: 12,
        status: Some(status),
        error: (status >= 300).then(|| format!("receiver answered {status}")),
        headers: Some(r#"[["x-request-id","req_1"],["set-cookie","[redacted]"]]"#.into()),
        body: Some(body.as_bytes().to_vec()),
        truncated: false,
    }
}

async fn a_mark_retried_after_its_commit_records_one_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &["evt_1"]).await;
    let rows = claim(&store, Duration::from_secs(30)).await;
    let delivered = [attempt(&rows[0], 200, r#"{"id":"rcpt_1"}"#)];
    assert_eq!(
        store
            .outbox()
            .mark_delivered(&delivered, LANE)
            .await
            .unwrap(),
        1
    );
    // The same mark again, as after an outage that hid the first one's commit.
    assert_eq!(
        store
            .outbox()
            .mark_delivered(&delivered, LANE)
            .await
            .unwrap(),
        1
    );
    let recorded = store
        .reads()
        .attempts_of("stripe", "evt_1", 0, 10)
        .await
        .unwrap();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let one = &recorded[0];
    assert_eq!(
        (one.kind.as_str(), one.attempt, one.status),
        ("delivered", 1, Some(200))
    );
    assert_eq!(one.outbox_id, rows[0].id);
    assert_eq!(one.destination.as_deref(), Some("https://hooks.example/…"));
    assert_eq!(
        one.response_body.as_deref(),
        Some(&br#"{"id":"rcpt_1"}"#[..])
    );
    assert_eq!(one.duration_ms, Some(12));
    assert_eq!(one.error, None);
    assert!(one
        .headers()
        .contains(&("x-request-id".to_owned(), "req_1".to_owned())));
    // Another event's key finds nothing.
    assert!(store
        .reads()
        .attempts_of("stripe", "evt_2", 0, 10)
        .await
        .unwrap()
        .is_empty());
}

async fn a_delivery_whose_lease_was_lost_is_recorded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &["evt_1"]).await;
    // A lease of zero: due again at once, as after a relay stalled past its lease.
    let first = claim(&store, Duration::ZERO).await;
    let second = claim(&store, Duration::from_secs(30)).await;
    assert_eq!(second.len(), 1);
    assert_ne!(first[0].claim_token, second[0].claim_token);
    let late = [attempt(&first[0], 200, "ok")];
    assert_eq!(
        store.outbox().mark_delivered(&late, LANE).await.unwrap(),
        0,
        "the row is the second claim's"
    );
    let failed = [FailedMark {
        attempt: attempt(&second[0], 500, r#"{"error":"boom"}"#),
        delay: Duration::ZERO,
        max_attempts: 10,
    }];
    assert_eq!(store.outbox().mark_failed(&failed, LANE).await.unwrap(), 1);
    let recorded = store
        .reads()
        .attempts_of("stripe", "evt_1", 0, 10)
        .await
        .unwrap();
    let seen: Vec<(&str, i32)> = recorded
        .iter()
        .map(|a| (a.kind.as_str(), a.attempt))
        .collect();
    assert_eq!(seen, [("delivered", 1), ("failed", 2)]);
}

async fn a_batchs_failures_are_marked_at_once_each_recorded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &["evt_1", "evt_2"]).await;
    let rows = claim(&store, Duration::from_secs(30)).await;
    let failures: Vec<FailedMark> = rows
        .iter()
        .zip([1, 5])
        .map(|(row, max_attempts)| FailedMark {
            attempt: attempt(row, 500, r#"{"error":"boom"}"#),
            delay: Duration::from_secs(60),
            max_attempts,
        })
        .collect();
    assert_eq!(
        store.outbox().mark_failed(&failures, LANE).await.unwrap(),
        2
    );
    let kinds = |id: &'static str| {
        let store = store.clone();
        async move {
            let recorded = store
                .reads()
                .attempts_of("stripe", id, 0, 10)
                .await
                .unwrap();
            recorded
                .into_iter()
                .map(|a| (a.kind, a.status, a.error))
                .collect::<Vec<_>>()
        }
    };
    let error = Some("receiver answered 500".to_owned());
    assert_eq!(
        kinds("evt_1").await,
        [("gave_up".to_owned(), Some(500), error.clone())]
    );
    assert_eq!(
        kinds("evt_2").await,
        [("failed".to_owned(), Some(500), error)]
    );
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!((counts.pending, counts.failed), (1, 1));
    // A throttled answer, deferred: recorded by a statement of its own.
    let recorded = store
        .outbox()
        .record_attempts(&[attempt(&rows[1], 429, "")], AttemptKind::Throttled, LANE)
        .await
        .unwrap();
    assert_eq!(recorded, 1);
    assert_eq!(kinds("evt_2").await.len(), 2);
}

async fn recording_off_records_nothing_and_still_marks(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &["evt_1"]).await;
    let rows = claim(&store, Duration::from_secs(30)).await;
    let off = AttemptLane {
        record: false,
        ..LANE
    };
    let delivered = [attempt(&rows[0], 200, "ok")];
    assert_eq!(
        store
            .outbox()
            .mark_delivered(&delivered, off)
            .await
            .unwrap(),
        1
    );
    assert!(store
        .reads()
        .attempts_of("stripe", "evt_1", 0, 10)
        .await
        .unwrap()
        .is_empty());
}

async fn a_skip_is_recorded_with_who_after_the_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &["evt_1"]).await;
    let rows = claim(&store, Duration::from_secs(30)).await;
    let failed = [FailedMark {
        attempt: attempt(&rows[0], 500, "boom"),
        delay: Duration::ZERO,
        max_attempts: 1,
    }];
    assert_eq!(store.outbox().mark_failed(&failed, LANE).await.unwrap(), 1);
    let skipped = store
        .outbox()
        .skip(rows[0].id, "cli (alice)")
        .await
        .unwrap();
    assert_eq!(skipped.map(|(lane, _)| lane).as_deref(), Some("default"));
    let recorded = store
        .reads()
        .attempts_of("stripe", "evt_1", 0, 10)
        .await
        .unwrap();
    let seen: Vec<(&str, i32, Option<&str>)> = recorded
        .iter()
        .map(|a| (a.kind.as_str(), a.attempt, a.actor.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [("gave_up", 1, None), ("skip", 0, Some("cli (alice)"))]
    );
}

/// PostgreSQL: with today's partition gone (maintenance failed for days), the mark commits
/// and the history row is skipped, not the batch failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_missing_days_partition_skips_the_history_and_commits_the_mark() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let today = format!("outbox_attempts_p{}", Utc::now().format("%Y%m%d"));
    execute(
        &store,
        &format!("ALTER TABLE outbox_attempts DETACH PARTITION {today}"),
    )
    .await;
    execute(&store, &format!("DROP TABLE {today}")).await;
    write(&store, &["evt_1", "evt_2"]).await;
    let rows = claim(&store, Duration::from_secs(30)).await;
    let delivered = [attempt(&rows[0], 200, "ok")];
    assert_eq!(
        store
            .outbox()
            .mark_delivered(&delivered, LANE)
            .await
            .unwrap(),
        1
    );
    let failed = [FailedMark {
        attempt: attempt(&rows[1], 500, "boom"),
        delay: Duration::ZERO,
        max_attempts: 10,
    }];
    assert_eq!(store.outbox().mark_failed(&failed, LANE).await.unwrap(), 1);
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!((counts.dispatched, counts.pending), (1, 1));
    for id in ["evt_1", "evt_2"] {
        assert!(store
            .reads()
            .attempts_of("stripe", id, 0, 10)
            .await
            .unwrap()
            .is_empty());
    }
}
