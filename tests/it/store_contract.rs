//! One contract, two stores: every test here runs against PostgreSQL and SQLite, each on a
//! database of its own.

use std::collections::HashSet;
use std::time::Duration;

use crate::helpers::{store_contract, wait_for, Backend, TestDb};
use dedup_worker_core::store::{NewDeadLetter, NewOutboxRow, NewQueueMessage, Store};

store_contract!(
    dedup_insert_returns_only_new_ids,
    dedup_row_rolls_back_with_its_transaction,
    a_transaction_that_read_first_writes_after_another_commit,
    outbox_write_claim_mark,
    outbox_claim_comes_back_after_lease,
    outbox_rows_fail_after_the_limit,
    outbox_marks_apply_only_under_the_current_claim,
    queue_enqueue_claim_ack,
    queue_redelivers_after_expired_lease,
    queue_concurrent_claims_never_overlap,
    queue_release_applies_only_under_the_current_claim,
    dead_letters_list_and_redrive,
    two_batches_moving_one_event_at_once_list_it_once,
    retention_purges_old_rows,
);

fn pair(id: &str) -> (String, String) {
    (id.to_owned(), "test.event".to_owned())
}

fn outbox_row(id: &str) -> NewOutboxRow {
    NewOutboxRow {
        source: "stripe".into(),
        event_id: id.into(),
        destination: None,
        idempotency_key: id.into(),
        event_type: "test.event".into(),
        payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        traceparent: None,
        ordering_key: None,
    }
}

fn message(id: &str) -> NewQueueMessage {
    NewQueueMessage {
        source: Some("stripe".into()),
        message_id: Some(id.into()),
        message_type: Some("test.event".into()),
        payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        traceparent: None,
        stripe_signature: None,
        sender_headers: None,
    }
}

async fn dedup_insert_returns_only_new_ids(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    let mut new = tx
        .insert_processed("stripe", &[pair("evt_a"), pair("evt_b"), pair("evt_a")])
        .await
        .unwrap();
    new.sort();
    assert_eq!(new, vec!["evt_a", "evt_b"]);
    tx.commit().await.unwrap();

    let mut tx = store.begin().await.unwrap();
    let new = tx
        .insert_processed("stripe", &[pair("evt_b"), pair("evt_c")])
        .await
        .unwrap();
    assert_eq!(new, vec!["evt_c"]);
    // Another source is another key.
    let other = tx
        .insert_processed("github", &[pair("evt_a")])
        .await
        .unwrap();
    assert_eq!(other, vec!["evt_a"]);
    tx.commit().await.unwrap();
}

async fn dedup_row_rolls_back_with_its_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        tx.insert_processed("stripe", &[pair("evt_x")])
            .await
            .unwrap(),
        vec!["evt_x"]
    );
    tx.rollback().await.unwrap();
    // Never "seen" unless committed.
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        tx.insert_processed("stripe", &[pair("evt_x")])
            .await
            .unwrap(),
        vec!["evt_x"]
    );
    // Savepoint semantics: undone with its event only.
    tx.savepoint().await.unwrap();
    tx.insert_processed("stripe", &[pair("evt_y")])
        .await
        .unwrap();
    tx.rollback_to_savepoint().await.unwrap();
    tx.release_savepoint().await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let new = tx
        .insert_processed("stripe", &[pair("evt_x"), pair("evt_y")])
        .await
        .unwrap();
    assert_eq!(new, vec!["evt_y"]);
    tx.rollback().await.unwrap();
}

/// A batch transaction that reads before it writes (the dedup insert looks up its
/// generations first; a handler reads its own tables) while another writer commits, as the
/// ingress and the relay do all the time. On SQLite a deferred transaction would then fail
/// its first write at once with `database is locked` (its read snapshot is stale, which no busy
/// timeout waits out), and the batch would go back to the transport; so it must take the write
/// lock when it begins, and the other writer waits its turn instead.
async fn a_transaction_that_read_first_writes_after_another_commit(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    let queued: i64 = dedup_worker::with_connection!(tx.conn(), |conn| {
        sqlx::query_scalar("SELECT count(*) FROM queue_messages")
            .fetch_one(&mut *conn)
            .await
    })
    .unwrap();
    assert_eq!(queued, 0);
    let other_writer = tokio::spawn({
        let store = store.clone();
        async move { store.queue().enqueue("q", &[message("evt_other")]).await }
    });
    // The other writer commits now (PostgreSQL; SQLite with a deferred transaction) or waits
    // for this one (SQLite, write lock taken at begin): either way this one writes next.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while !other_writer.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let new = tx
        .insert_processed("stripe", &[pair("evt_read_first")])
        .await;
    assert_eq!(new.expect("the write after a read"), vec!["evt_read_first"]);
    tx.commit().await.unwrap();
    other_writer
        .await
        .unwrap()
        .expect("the other writer, in its turn");
}

async fn outbox_write_claim_mark(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // Rolled back: nothing to claim.
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[outbox_row("evt_0")]).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store
        .outbox()
        .claim_lane("default", 10, Duration::from_secs(30), false)
        .await
        .unwrap()
        .is_empty());

    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[
        outbox_row("evt_1"),
        outbox_row("evt_2"),
        outbox_row("evt_3"),
    ])
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let first = store
        .outbox()
        .claim_lane("default", 2, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert!(first
        .iter()
        .all(|r| r.attempts == 1 && r.idempotency_key == r.event_id));
    // Leased rows are not handed out again.
    let second = store
        .outbox()
        .claim_lane("default", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    let claims: Vec<_> = first.iter().chain(&second).map(|r| r.claim()).collect();
    assert_eq!(claims.iter().map(|c| c.id).collect::<HashSet<_>>().len(), 3);
    assert_eq!(store.outbox().mark_dispatched(&claims).await.unwrap(), 3);
    // Marking again under the same claims (a retry after an outage hid the commit) is no
    // lost lease: the rows count as marked and stay as they are.
    assert_eq!(store.outbox().mark_dispatched(&claims).await.unwrap(), 3);
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.dispatched, counts.failed),
        (0, 3, 0)
    );
    assert!(store
        .outbox()
        .claim_lane("default", 10, Duration::from_secs(0), false)
        .await
        .unwrap()
        .is_empty());
}

async fn outbox_claim_comes_back_after_lease(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[outbox_row("evt_lease")]).await.unwrap();
    tx.commit().await.unwrap();
    let claimed = store
        .outbox()
        .claim_lane("default", 10, Duration::from_millis(300), false)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(store
        .outbox()
        .claim_lane("default", 10, Duration::from_millis(300), false)
        .await
        .unwrap()
        .is_empty());
    // The relay "died": after the lease the row is claimable again, same key, attempt 2.
    let again = wait_for("the lease to expire", Duration::from_secs(10), || async {
        let rows = store
            .outbox()
            .claim_lane("default", 10, Duration::from_secs(30), false)
            .await
            .unwrap();
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(again[0].id, claimed[0].id);
    assert_eq!(again[0].idempotency_key, "evt_lease");
    assert_eq!(again[0].attempts, 2);
}

async fn outbox_rows_fail_after_the_limit(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[outbox_row("evt_fail")]).await.unwrap();
    tx.commit().await.unwrap();
    let row = store
        .outbox()
        .claim_lane("default", 1, Duration::from_secs(30), false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        store
            .outbox()
            .mark_delivery_failed(row.claim(), "receiver answered 500", Duration::ZERO, 2)
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.outbox().counts().await.unwrap().pending, 1);
    let row = store
        .outbox()
        .claim_lane("default", 1, Duration::from_secs(30), false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(row.attempts, 2);
    assert_eq!(
        store
            .outbox()
            .mark_delivery_failed(row.claim(), "receiver answered 500", Duration::ZERO, 2)
            .await
            .unwrap(),
        1
    );
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!((counts.pending, counts.failed), (0, 1));
    let failed = store.outbox().failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].event_id, "evt_fail");
}

/// A relay whose lease expired (a slow sink, a paused process) and whose rows another relay
/// claimed meanwhile can no longer mark them: not dispatched (the other relay may still fail),
/// not failed or due again (the other relay may have delivered, and its attempts count).
async fn outbox_marks_apply_only_under_the_current_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(&[outbox_row("evt_a"), outbox_row("evt_b")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut stale = store
        .outbox()
        .claim_lane("default", 10, Duration::from_millis(300), false)
        .await
        .unwrap();
    assert_eq!(stale.len(), 2);
    let mut current = wait_for(
        "another relay to claim the rows after the lease",
        Duration::from_secs(10),
        || async {
            let rows = store
                .outbox()
                .claim_lane("default", 10, Duration::from_secs(30), false)
                .await
                .unwrap();
            (!rows.is_empty()).then_some(rows)
        },
    )
    .await;
    assert_eq!(current.len(), 2);
    stale.sort_by_key(|r| r.id);
    current.sort_by_key(|r| r.id);
    for (old, new) in stale.iter().zip(&current) {
        assert_eq!((old.id, old.attempts + 1), (new.id, new.attempts));
        assert_ne!(
            old.claim_token, new.claim_token,
            "each claim has its own token"
        );
    }

    // The stale relay's marks change nothing, and say so.
    let stale_claims: Vec<_> = stale.iter().map(|r| r.claim()).collect();
    assert_eq!(
        store.outbox().mark_dispatched(&stale_claims).await.unwrap(),
        0
    );
    for row in &stale {
        for max_attempts in [1, 100] {
            assert_eq!(
                store
                    .outbox()
                    .mark_delivery_failed(row.claim(), "stale", Duration::ZERO, max_attempts)
                    .await
                    .unwrap(),
                0
            );
        }
    }
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.dispatched, counts.failed),
        (2, 0, 0)
    );
    // Not made due early either: the current relay still holds both leases.
    assert!(store
        .outbox()
        .claim_lane("default", 10, Duration::from_secs(30), false)
        .await
        .unwrap()
        .is_empty());

    // The current relay's marks work.
    assert_eq!(
        store
            .outbox()
            .mark_dispatched(&[current[0].claim()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .outbox()
            .mark_delivery_failed(
                current[1].claim(),
                "receiver answered 500",
                Duration::ZERO,
                100
            )
            .await
            .unwrap(),
        1
    );
    let counts = store.outbox().counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.dispatched, counts.failed),
        (1, 1, 0)
    );
    // A row the current relay dispatched stays dispatched whatever the stale one says.
    assert_eq!(
        store
            .outbox()
            .mark_delivery_failed(stale[0].claim(), "stale", Duration::ZERO, 1)
            .await
            .unwrap(),
        0
    );
    let again = store
        .outbox()
        .claim_lane("default", 10, Duration::from_secs(30), false)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempts), (current[1].id, 3));
}

async fn queue_enqueue_claim_ack(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .queue()
        .enqueue(
            "q1",
            &[message("evt_1"), message("evt_2"), message("evt_3")],
        )
        .await
        .unwrap();
    store
        .queue()
        .enqueue("q2", &[message("evt_other")])
        .await
        .unwrap();
    assert_eq!(store.queue().depth("q1").await.unwrap(), 3);
    let first = store
        .queue()
        .claim("q1", 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].message_id.as_deref(), Some("evt_1"));
    assert_eq!(first[0].source.as_deref(), Some("stripe"));
    assert_eq!(first[0].payload, br#"{"id":"evt_1"}"#);
    assert_eq!(first[0].attempts, 1);
    let second = store
        .queue()
        .claim("q1", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    store
        .queue()
        .ack(&first.iter().map(|m| m.id).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(store.queue().depth("q1").await.unwrap(), 1);
    // A released message is visible again at once with delay 0.
    assert_eq!(
        store
            .queue()
            .release(second[0].id, second[0].claim_token, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    let again = store
        .queue()
        .claim("q1", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(store.queue().depth("q2").await.unwrap(), 1);
}

async fn queue_redelivers_after_expired_lease(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .queue()
        .enqueue("q", &[message("evt_1")])
        .await
        .unwrap();
    let claimed = store
        .queue()
        .claim("q", 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(store
        .queue()
        .claim("q", 10, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    let again = wait_for(
        "the queue lease to expire",
        Duration::from_secs(10),
        || async {
            let rows = store
                .queue()
                .claim("q", 10, Duration::from_secs(30))
                .await
                .unwrap();
            (!rows.is_empty()).then_some(rows)
        },
    )
    .await;
    assert_eq!(again[0].id, claimed[0].id);
    assert_eq!(again[0].attempts, 2);
}

async fn queue_concurrent_claims_never_overlap(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let messages: Vec<_> = (0..200).map(|i| message(&format!("evt_{i}"))).collect();
    store.queue().enqueue("q", &messages).await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..4 {
        let store: Store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = store
                    .queue()
                    .claim("q", 7, Duration::from_secs(60))
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|m| m.id));
            }
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    assert_eq!(all.len(), 200, "every message claimed once");
    assert_eq!(
        all.iter().collect::<HashSet<_>>().len(),
        200,
        "no message claimed twice"
    );
}

/// A consumer whose lease expired and whose message another consumer claimed cannot move the
/// message's visibility (a backoff it retries with would cut the other's lease short, or
/// postpone it). Its ack still deletes the message: it acks only a committed outcome, which
/// the other consumer's dedup insert would find (see `store.queue().ack`).
async fn queue_release_applies_only_under_the_current_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .queue()
        .enqueue("q", &[message("evt_1")])
        .await
        .unwrap();
    let stale = store
        .queue()
        .claim("q", 10, Duration::from_millis(300))
        .await
        .unwrap()
        .remove(0);
    let current = wait_for(
        "another consumer to claim the message after the lease",
        Duration::from_secs(10),
        || async {
            let rows = store
                .queue()
                .claim("q", 10, Duration::from_secs(30))
                .await
                .unwrap();
            (!rows.is_empty()).then_some(rows)
        },
    )
    .await
    .remove(0);
    assert_eq!((current.id, current.attempts), (stale.id, 2));
    assert_ne!(current.claim_token, stale.claim_token);

    assert_eq!(
        store
            .queue()
            .release(stale.id, stale.claim_token, Duration::ZERO)
            .await
            .unwrap(),
        0,
        "the stale consumer's release changes nothing"
    );
    assert!(
        store
            .queue()
            .claim("q", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "the current consumer still holds the lease"
    );
    assert_eq!(
        store
            .queue()
            .release(current.id, current.claim_token, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    let again = store
        .queue()
        .claim("q", 10, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(again.attempts, 3);

    store.queue().ack(&[stale.id]).await.unwrap();
    assert_eq!(store.queue().depth("q").await.unwrap(), 0);
}

async fn dead_letters_list_and_redrive(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = |id: &str, error: &str| NewDeadLetter {
        source: "stripe".into(),
        event_id: id.into(),
        event_type: "test.event".into(),
        queue: "q".into(),
        payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        error: error.into(),
        attempts: 3,
    };
    let mut tx = store.begin().await.unwrap();
    tx.insert_dead_letter(&row("evt_dead", "fatal: no such account"))
        .await
        .unwrap();
    tx.insert_dead_letter(&row("evt_other", "fatal"))
        .await
        .unwrap();
    // Once per event and queue: a repeated move adds nothing; an unknown id is never merged.
    assert!(!tx
        .insert_dead_letter_once(&row("evt_dead", "moved again"))
        .await
        .unwrap());
    assert!(tx.insert_dead_letter_once(&row("", "no id")).await.unwrap());
    assert!(tx.insert_dead_letter_once(&row("", "no id")).await.unwrap());
    tx.commit().await.unwrap();
    let listed = store.dead_letters().list(10).await.unwrap();
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[0].error, "fatal: no such account");

    // A redrive pages through the selection in id order, then deletes what it published.
    let ids = [listed[0].id, listed[2].id];
    let first = store.dead_letters().selected(&ids, 0, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].event_id, "evt_dead");
    assert_eq!(first[0].source, "stripe");
    let next = store
        .dead_letters()
        .selected(&ids, first[0].id, 10)
        .await
        .unwrap();
    assert_eq!(next.iter().map(|d| d.id).collect::<Vec<_>>(), [ids[1]]);
    let all = store.dead_letters().selected(&[], 0, 10).await.unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(store.dead_letters().delete(ids[0]).await.unwrap(), 1);
    assert_eq!(store.dead_letters().delete(ids[0]).await.unwrap(), 0);
    assert_eq!(store.dead_letters().list(10).await.unwrap().len(), 3);
}

/// SQS may hand one message to two receivers at once, so two batches may dead-letter one event
/// side by side: the second waits for the first and then adds nothing, though neither saw the
/// other's row when it began.
async fn two_batches_moving_one_event_at_once_list_it_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = NewDeadLetter {
        source: "stripe".into(),
        event_id: "evt_twice".into(),
        event_type: "test.event".into(),
        queue: "q".into(),
        payload: b"{}".to_vec(),
        error: "fatal".into(),
        attempts: 1,
    };
    let mut first = store.begin().await.unwrap();
    assert!(first.insert_dead_letter_once(&row).await.unwrap());
    let second = tokio::spawn({
        let (store, row) = (store.clone(), row.clone());
        async move {
            let mut tx = store.begin().await?;
            let inserted = tx.insert_dead_letter_once(&row).await?;
            tx.commit().await?;
            Ok::<_, dedup_worker_core::store::StoreError>(inserted)
        }
    });
    // Let the second reach its wait (PostgreSQL: the event's lock; SQLite: the write lock).
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while !second.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    first.commit().await.unwrap();
    assert!(
        !second.await.unwrap().expect("the second move"),
        "the second move inserted a row"
    );
    assert_eq!(store.dead_letters().list(10).await.unwrap().len(), 1);
}

async fn retention_purges_old_rows(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_processed("stripe", &[pair("evt_old")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // A long window keeps it.
    store
        .dedup()
        .maintain(Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .retention()
        .purge_expired(Duration::from_secs(3600), Duration::from_secs(3600), 100)
        .await
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    assert!(tx
        .insert_processed("stripe", &[pair("evt_old")])
        .await
        .unwrap()
        .is_empty());
    tx.rollback().await.unwrap();
    // A zero window deletes it (once the clock has moved past its timestamp).
    wait_for(
        "retention to delete the row",
        Duration::from_secs(10),
        || async {
            // Seals the id's generation, then (on a later pass, once the clock has moved)
            // empties it.
            store.dedup().maintain(Duration::ZERO).await.unwrap();
            store
                .retention()
                .purge_expired(Duration::ZERO, Duration::ZERO, 100)
                .await
                .unwrap();
            let mut tx = store.begin().await.unwrap();
            let new = tx
                .insert_processed("stripe", &[pair("evt_old")])
                .await
                .unwrap();
            tx.rollback().await.unwrap();
            (!new.is_empty()).then_some(())
        },
    )
    .await;
}
