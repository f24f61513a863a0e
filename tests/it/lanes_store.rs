//! The lanes' store contract (issue 39), on PostgreSQL and SQLite: a lane claims only its own
//! rows; the lanes with pending rows are found; a deferral gives the attempt back under the
//! claim that took it only; a circuit opens once however many relays trip it, one relay takes
//! each probe; the longer hold stands; pause and resume say whether they changed anything. An
//! ordered lane claims one row of a key at a time, in id order; a row failed for good holds its
//! key until skipped; on PostgreSQL a later transaction writing a key waits for the earlier one
//! to commit, so ids are commit order.

use std::time::Duration;

use crate::helpers::{store_contract, Backend, TestDb};
use dedup_worker_core::store::{Circuit, NewOutboxRow, Store};

store_contract!(
    a_lane_claims_only_its_own_rows,
    a_deferral_gives_the_attempt_back_under_its_claim_only,
    a_circuit_opens_once_and_one_relay_takes_each_probe,
    the_longer_hold_stands_and_pause_resume_say_what_changed,
    an_ordered_lane_claims_a_key_one_row_at_a_time_and_a_failed_row_holds_it_until_skipped,
);

const LEASE: Duration = Duration::from_secs(30);

fn row(id: &str, destination: Option<&str>) -> NewOutboxRow {
    NewOutboxRow {
        source: "stripe".into(),
        event_id: id.into(),
        destination: destination.map(str::to_owned),
        idempotency_key: id.into(),
        event_type: "payout.paid".into(),
        payload: format!(r#"{{"id":"{id}"}}"#).into_bytes(),
        traceparent: None,
        ordering_key: None,
    }
}

async fn write(store: &Store, rows: &[NewOutboxRow]) {
    let mut tx = store.begin().await.unwrap();
    tx.insert_outbox(rows).await.unwrap();
    tx.commit().await.unwrap();
}

fn keys(rows: &[dedup_worker_core::store::OutboxRow]) -> Vec<String> {
    let mut keys: Vec<String> = rows.iter().map(|r| r.idempotency_key.clone()).collect();
    keys.sort();
    keys
}

async fn a_lane_claims_only_its_own_rows(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let spec = "file:/tmp/adhoc.jsonl";
    write(
        &store,
        &[
            row("evt_d1", None),
            row("evt_b1", Some("billing")),
            row("evt_a1", Some(spec)),
            row("evt_d2", None),
        ],
    )
    .await;
    let mut lanes = store.outbox().pending_lanes().await.unwrap();
    lanes.sort();
    assert_eq!(lanes, vec!["billing", "default", spec]);
    let outbox = store.outbox();
    let default = outbox
        .claim_lane("default", 10, LEASE, false)
        .await
        .unwrap();
    assert_eq!(keys(&default), vec!["evt_d1", "evt_d2"]);
    let billing = outbox
        .claim_lane("billing", 10, LEASE, false)
        .await
        .unwrap();
    assert_eq!(keys(&billing), vec!["evt_b1"]);
    let adhoc = outbox.claim_lane(spec, 10, LEASE, false).await.unwrap();
    assert_eq!(keys(&adhoc), vec!["evt_a1"]);
    assert!(outbox
        .claim_lane("nosuch", 10, LEASE, false)
        .await
        .unwrap()
        .is_empty());
    // Leased rows are still pending: their lanes are still found.
    assert_eq!(store.outbox().pending_lanes().await.unwrap().len(), 3);
    let claims: Vec<_> = default.iter().map(|r| r.claim()).collect();
    outbox.mark_dispatched(&claims).await.unwrap();
    let mut lanes = store.outbox().pending_lanes().await.unwrap();
    lanes.sort();
    assert_eq!(lanes, vec!["billing", spec]);
}

async fn a_deferral_gives_the_attempt_back_under_its_claim_only(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    write(&store, &[row("evt_1", None), row("evt_2", None)]).await;
    let outbox = store.outbox();
    let claimed = outbox
        .claim_lane("default", 10, LEASE, false)
        .await
        .unwrap();
    assert!(claimed.iter().all(|r| r.attempts == 1));
    let token = claimed[0].claim_token;
    let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    // Another claim's token changes nothing.
    assert_eq!(
        outbox
            .defer(token + 1, &ids, Duration::ZERO, "x")
            .await
            .unwrap(),
        0
    );
    let deferred = outbox
        .defer(
            token,
            &ids,
            Duration::from_secs(3_600),
            "held: the receiver asked",
        )
        .await
        .unwrap();
    assert_eq!(deferred, 2);
    // Not due for an hour.
    assert!(outbox
        .claim_lane("default", 10, LEASE, false)
        .await
        .unwrap()
        .is_empty());
    outbox.release_leases(token, &ids).await.unwrap();
    let again = outbox
        .claim_lane("default", 10, LEASE, false)
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|r| r.attempts == 1),
        "the deferred claim's attempt was given back: {again:?}"
    );
}

async fn a_circuit_opens_once_and_one_relay_takes_each_probe(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let sinks = store.sinks();
    assert_eq!(
        sinks.gate("billing").await.unwrap().circuit,
        Circuit::Closed
    );
    let later = Duration::from_secs(3_600);
    assert_eq!(sinks.trip("billing", later, "boom").await.unwrap(), Some(1));
    assert_eq!(sinks.trip("billing", later, "again").await.unwrap(), None);
    let state = sinks.gate("billing").await.unwrap();
    assert_eq!(state.circuit, Circuit::Open);
    assert_eq!(state.last_error.as_deref(), Some("boom"));
    assert!(state.probe_in() > Duration::from_secs(3_500));
    assert_eq!(
        sinks.take_probe("billing", LEASE).await.unwrap(),
        None,
        "not due"
    );
    // Closed and opened again with the probe due at once.
    assert!(sinks.close("billing").await.unwrap());
    assert!(!sinks.close("billing").await.unwrap());
    assert_eq!(
        sinks.trip("billing", Duration::ZERO, "boom").await.unwrap(),
        Some(2)
    );
    let (a, b) = tokio::join!(
        sinks.take_probe("billing", LEASE),
        sinks.take_probe("billing", LEASE)
    );
    let taken = [a.unwrap(), b.unwrap()];
    assert_eq!(taken.iter().filter(|t| t.is_some()).count(), 1, "{taken:?}");
    assert_eq!(
        sinks.gate("billing").await.unwrap().circuit,
        Circuit::HalfOpen
    );
    sinks
        .probe_failed("billing", Duration::ZERO, "still down")
        .await
        .unwrap();
    let state = sinks.gate("billing").await.unwrap();
    assert_eq!(state.circuit, Circuit::Open);
    assert_eq!(state.last_error.as_deref(), Some("still down"));
    // A paused lane gives no probe.
    sinks.pause("billing", "test").await.unwrap();
    assert_eq!(sinks.take_probe("billing", LEASE).await.unwrap(), None);
}

async fn the_longer_hold_stands_and_pause_resume_say_what_changed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let sinks = store.sinks();
    sinks.hold("b", Duration::from_secs(3_600)).await.unwrap();
    sinks.hold("b", Duration::from_secs(1)).await.unwrap();
    let held = sinks.gate("b").await.unwrap().held_for().unwrap();
    assert!(held > Duration::from_secs(3_500), "{held:?}");
    assert!(sinks.pause("b", "cli (ops)").await.unwrap());
    assert!(!sinks.pause("b", "cli (ops)").await.unwrap());
    let state = sinks.gate("b").await.unwrap();
    assert!(state.paused);
    assert_eq!(state.paused_by.as_deref(), Some("cli (ops)"));
    assert!(sinks.resume("b").await.unwrap());
    assert!(!sinks.resume("b").await.unwrap());
    let state = sinks.gate("b").await.unwrap();
    assert!(!state.paused && state.held_for().is_none());
    assert_eq!(state.circuit, Circuit::Closed);
    let listed: Vec<String> = sinks
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.sink)
        .collect();
    assert_eq!(listed, vec!["b"]);
}

fn keyed(id: &str, key: Option<&str>) -> NewOutboxRow {
    NewOutboxRow {
        ordering_key: key.map(str::to_owned),
        ..row(id, Some("ledger"))
    }
}

async fn an_ordered_lane_claims_a_key_one_row_at_a_time_and_a_failed_row_holds_it_until_skipped(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let outbox = store.outbox();
    write(
        &store,
        &[
            keyed("evt_k1_a", Some("k1")),
            keyed("evt_k2_a", Some("k2")),
            keyed("evt_k1_b", Some("k1")),
            keyed("evt_free", None),
        ],
    )
    .await;
    let first = outbox.claim_lane("ledger", 10, LEASE, true).await.unwrap();
    assert_eq!(keys(&first), vec!["evt_free", "evt_k1_a", "evt_k2_a"]);
    // k1's first row is leased (pending): its second waits, for every relay.
    let none = outbox.claim_lane("ledger", 10, LEASE, true).await.unwrap();
    assert!(none.is_empty(), "{:?}", keys(&none));
    let k1_a = first.iter().find(|r| r.event_id == "evt_k1_a").unwrap();
    // Fails for good (its one attempt spent), and still holds k1.
    let marked = outbox
        .mark_delivery_failed(k1_a.claim(), "HTTP 500", Duration::ZERO, 1)
        .await
        .unwrap();
    assert_eq!(marked, 1);
    let none = outbox.claim_lane("ledger", 10, LEASE, true).await.unwrap();
    assert!(none.is_empty(), "{:?}", keys(&none));
    let held = outbox.held_keys(10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].id, held[0].ordering_key.as_str(), held[0].waiting),
        (k1_a.id, "k1", 1)
    );
    assert_eq!(
        outbox.skip(k1_a.id + 1_000_000, "test").await.unwrap(),
        None
    );
    let skipped = outbox.skip(k1_a.id, "test").await.unwrap();
    assert_eq!(skipped, Some(("ledger".to_owned(), Some("k1".to_owned()))));
    assert_eq!(
        outbox.skip(k1_a.id, "test").await.unwrap(),
        None,
        "skipped twice"
    );
    let next = outbox.claim_lane("ledger", 10, LEASE, true).await.unwrap();
    assert_eq!(keys(&next), vec!["evt_k1_b"]);
    assert!(outbox.held_keys(10).await.unwrap().is_empty());
    store.close().await;
    db.remove().await;
}

/// Two transactions write a row of one key: the later waits (on the key's advisory lock) until
/// the earlier commits, so its id is larger and it is never claimable first. Without the lock,
/// the later one would commit at once, and an ordered claim would deliver it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_transaction_of_a_key_waits_for_the_earlier_to_commit_on_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let mut earlier = store.begin().await.unwrap();
    earlier
        .insert_outbox(&[keyed("evt_earlier", Some("k"))])
        .await
        .unwrap();
    let later = tokio::spawn({
        let store = store.clone();
        async move { write(&store, &[keyed("evt_later", Some("k"))]).await }
    });
    let pool = store.postgres_pool().unwrap().clone();
    let waiting = crate::helpers::wait_for(
        "the later transaction to wait or commit",
        Duration::from_secs(10),
        || {
            let (pool, later) = (&pool, &later);
            async move {
                let waits: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                )
                .fetch_one(pool)
                .await
                .ok()?;
                match (waits, later.is_finished()) {
                    (1.., _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                }
            }
        },
    )
    .await;
    assert!(
        waiting,
        "the later transaction committed before the earlier"
    );
    earlier.commit().await.unwrap();
    later.await.unwrap();
    let outbox = store.outbox();
    let first = outbox.claim_lane("ledger", 10, LEASE, true).await.unwrap();
    assert_eq!(keys(&first), vec!["evt_earlier"]);
    store.close().await;
    db.remove().await;
}
