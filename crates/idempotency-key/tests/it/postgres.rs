//! PostgreSQL under the layer: the grouped writes keep probing the primary key as the table
//! grows; a PostgreSQL that stops answering is a 503 (never a success, never a hang) and the
//! writer's breaker refuses the queue behind it; a grouped claim PostgreSQL refuses (an account
//! too long to index) fails only its own request.
use std::time::Duration;

use futures::stream::{self, StreamExt};
use http::StatusCode;
use idempotency_key::test_util::{Claim, Ownership, StoreProtocol};
use idempotency_key::{Fingerprint, GroupOptions, PgIdempotencyStore};

use super::{app, http, layer_on, post, stored};
use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::wait_for;
use crate::helpers::{Counting, TestEnv};

/// `(seq_tup_read, idx_scan)` of `idempotency_keys` as PostgreSQL's statistics last saw them:
/// rows read by sequential scans, and index scans.
async fn table_reads(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT seq_tup_read, COALESCE(idx_scan, 0) FROM pg_stat_user_tables
          WHERE relname = 'idempotency_keys'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// One request's claim and completion through the store (grouped with whatever runs beside it).
async fn claim_and_complete(store: &PgIdempotencyStore, key: String) {
    let fp = Fingerprint([3; 32]);
    let (lease, ttl) = (Duration::from_secs(60), Duration::from_secs(3600));
    let Claim::Acquired(token) = store.claim("acct", &key, &fp, lease, ttl).await.unwrap() else {
        panic!("a new key is claimed")
    };
    assert!(matches!(
        store
            .complete("acct", &key, token, &stored(201, "ok"))
            .await
            .unwrap(),
        Ownership::Owned { .. }
    ));
}

/// The grouped statement's plan is made while the table is empty and then reused. Grown to
/// 50,000 rows, the table must still be probed by its primary key, never read whole: left to
/// the planner, that cached plan was a sequential scan feeding a hash join, and first
/// executions slowed down as the table grew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_writes_probe_the_primary_key_after_the_table_has_grown() {
    let env = TestEnv::new().await;
    let store = env.store();
    // Enough statements on the empty table for PostgreSQL to cache a generic plan on every
    // writer connection (it switches after five).
    for i in 0..24 {
        claim_and_complete(&store, format!("warm-{i}")).await;
    }
    sqlx::query(
        "INSERT INTO dedup_worker.idempotency_keys (account, key, fingerprint, status, response_status,
                                       response_headers, response_body, expires_at)
         SELECT 'other', 'k' || g, '\\x00', 'completed', 201, '[]', '\\x00',
                now() + interval '1 hour'
           FROM generate_series(1, 50000) g",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let (read_before, idx_before) = table_reads(&env.pool).await;
    let requests = 32;
    let all: Vec<_> = (0..requests)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { claim_and_complete(&store, format!("grown-{i}")).await })
        })
        .collect();
    for request in all {
        request.await.unwrap();
    }
    // Backends report their statistics when idle (within about ten seconds). Each claim
    // probes the index for a conflict and each completion probes it for its row, so
    // `requests * 2` more index scans say the writers' statistics have arrived. (Rows read
    // by sequential scans, not their number, tell a whole-table read: the migration's index
    // builds are sequential scans of the empty table that may be reported late.)
    let (read_after, idx_after) = wait_for(
        "the writers' statistics to arrive",
        Duration::from_secs(60),
        || {
            let pool = env.pool.clone();
            async move {
                let (read, idx) = table_reads(&pool).await;
                (read >= read_before + 50_000 || idx >= idx_before + requests * 2)
                    .then_some((read, idx))
            }
        },
    )
    .await;
    assert!(
        read_after - read_before < 50_000,
        "grouped writes read the whole table ({} rows by sequential scans, {} index scans)",
        read_after - read_before,
        idx_after - idx_before
    );
    env.cleanup().await;
}

/// A store outage must be a 503 the client retries, never a success and never a hang: requests
/// made while PostgreSQL has stopped answering are told 503 (problem+json, `Retry-After`) after
/// at most one statement timeout, with nothing executed. The requests queued behind the statement
/// that timed out are refused by the writer's breaker at once, without a statement or a new
/// connection each. When PostgreSQL answers again the same keys execute, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn postgres_that_stops_answering_is_503_and_the_breaker_refuses_the_queue() {
    use std::str::FromStr;
    let env = TestEnv::new().await;
    let target = sqlx::postgres::PgConnectOptions::from_str(&env.url).expect("url");
    let proxy = FaultProxy::start(&format!("{}:{}", target.get_host(), target.get_port())).await;
    let through_proxy = target.host("127.0.0.1").port(proxy.port);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(through_proxy);
    let grouped = PgIdempotencyStore::new(pool.clone()).with_grouping(Some(GroupOptions {
        writers: 1,
        statement_timeout: Duration::from_secs(2),
        ..GroupOptions::default()
    }));
    let h = Counting::default();
    let addr = app(&env, &h, layer_on(grouped.clone()).build()).await;
    let c = http();
    let body = r#"{"amount":100}"#;

    let before = post(&c, addr, Some("before"), None, body).await;
    assert_eq!(before.status, StatusCode::CREATED);
    assert_eq!(h.runs(), 1);

    // PostgreSQL stops answering: connections held open, nothing forwarded either way.
    proxy.set(Mode::BlackHole).await;
    let attempts_before = proxy.accepted();
    let statements = grouped.query_count();
    let send = |key: String| {
        let c = c.clone();
        tokio::spawn(async move { post(&c, addr, Some(&key), None, body).await })
    };
    // The first request's statement goes out on the writer's connection and is never answered.
    let mut waiting = vec![send("during-0".into())];
    wait_for(
        "the first statement to go out",
        Duration::from_secs(10),
        || async { (grouped.query_count() > statements).then_some(()) },
    )
    .await;
    // These queue behind it.
    waiting.extend((1..=8).map(|i| send(format!("during-{i}"))));
    for reply in waiting {
        let reply = reply.await.expect("request task");
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert!(!reply.replayed());
    }
    assert_eq!(h.runs(), 1, "nothing executed during the outage");
    assert_eq!(
        grouped.query_count() - statements,
        1,
        "the queued requests were refused by the breaker, not sent one statement each"
    );
    assert_eq!(
        proxy.accepted() - attempts_before,
        0,
        "no connection attempt while the breaker is open"
    );

    // The same outage without grouping: the pool's acquire timeout bounds it.
    let ungrouped = PgIdempotencyStore::new(pool.clone()).with_grouping(None);
    let single = app(&env, &h, layer_on(ungrouped).build()).await;
    let reply = post(&c, single, Some("during-single"), None, body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.runs(), 1);

    // PostgreSQL answers again: once the breaker lets a group through, the refused keys execute.
    proxy.set(Mode::Pass).await;
    let after = wait_for(
        "the refused key to be answered after the outage",
        Duration::from_secs(30),
        || async {
            let reply = post(&c, addr, Some("during-0"), None, body).await;
            (reply.status != StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
        },
    )
    .await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed());
    assert_eq!(h.runs(), 2);
    let replay = post(&c, addr, Some("during-0"), None, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, after.body);
    let other = post(&c, addr, Some("during-1"), None, body).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(
        h.runs(),
        3,
        "each refused key executes once, after the outage"
    );
    drop(proxy);
    pool.close().await;
    env.cleanup().await;
}

/// A 4 KB account, random so that PostgreSQL cannot compress it into an index entry.
fn account_of_4kb() -> String {
    (0..128)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_claim_the_database_refuses_fails_only_its_own_request() {
    // Past the layer's own checks (the store's protocol called directly): claims for 4 KB
    // accounts, whose index entries PostgreSQL refuses, written at once with 60 ordinary claims.
    let env = TestEnv::new().await;
    let store = env.store();
    let fingerprint = Fingerprint([7; 32]);
    let huge = account_of_4kb();
    let accounts: Vec<String> = (0..64)
        .map(|i| {
            if i % 16 == 5 {
                format!("{huge}{i}")
            } else {
                format!("acct_{i}")
            }
        })
        .collect();
    let results: Vec<(String, bool)> = stream::iter(accounts)
        .map(|account| {
            let store = store.clone();
            async move {
                let claim = store
                    .claim(
                        &account,
                        "key",
                        &fingerprint,
                        Duration::from_secs(30),
                        Duration::from_secs(600),
                    )
                    .await;
                (account, matches!(claim, Ok(Claim::Acquired(_))))
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for (account, acquired) in &results {
        assert_eq!(
            *acquired,
            account.len() < 100,
            "account of {} bytes",
            account.len()
        );
    }
    env.cleanup().await;
}
