//! Issue 40: the history tables' day partitions on PostgreSQL (`store.partitions()`), with
//! partitions for fixed days in the past, so nothing waits for a real day to pass:
//!
//! * two processes making the same days at once make each day once;
//! * dropping an expired day while another transaction holds an insert open on the parent:
//!   other inserts go on meanwhile, and the drop completes once that transaction commits
//!   (`DETACH … CONCURRENTLY`; a plain detach or drop would queue every insert behind it);
//! * a detach interrupted by its statement timeout (an old snapshot held) is left pending and
//!   finished (`FINALIZE`) by the next pass, which then drops the day.

use std::time::Duration;

use chrono::NaiveDate;
use dedup_worker_core::store::Store;
use sqlx::PgPool;

use crate::helpers::{wait_for, Backend, TestDb};

const PARENT: &str = "event_bodies";
const WAIT: Duration = Duration::from_secs(30);

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).unwrap()
}

/// The names of `PARENT`'s attached partitions starting with `prefix`.
async fn attached(pool: &PgPool, prefix: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'event_bodies'::regclass AND c.relname LIKE $1 || '%'
          ORDER BY 1",
    )
    .bind(prefix)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Whether a table of that name exists.
async fn exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One body kept now (today's partition), as the consumer keeps it.
const INSERT_NOW: &str = "INSERT INTO event_bodies (kept_at, key, source, event_id, event_type,
                          encoding, body) VALUES (now(), gen_random_uuid(), 'stripe', $1, 't', 0, '\\x7b7d')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn making_the_same_days_at_once_from_two_processes_makes_each_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let (one, two): (Store, Store) = (db.store().await, db.store().await);
    // The migration made today to today + 3.
    assert_eq!(one.partitions().days_ahead(PARENT).await.unwrap(), Some(3));
    let (first, last) = (day(2020, 2, 1), day(2020, 2, 10));
    let (a, b) = tokio::join!(
        one.partitions().ensure_days(PARENT, first, last),
        two.partitions().ensure_days(PARENT, first, last),
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(a + b, 10, "each day made once, by one of them");
    let pool = one.postgres_pool().unwrap();
    let made = attached(pool, "event_bodies_p202002").await;
    assert_eq!(made.len(), 10, "{made:?}");
    // Again: nothing to do.
    assert_eq!(
        two.partitions()
            .ensure_days(PARENT, first, last)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_expired_day_lets_inserts_go_on_and_ends_after_an_open_insert_commits() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let pool = store.postgres_pool().unwrap().clone();
    let partitions = store.partitions();
    partitions
        .ensure_days(PARENT, day(2020, 1, 1), day(2020, 1, 2))
        .await
        .unwrap();
    // A consumer's batch, inserting, not committed yet.
    let mut open = pool.begin().await.unwrap();
    sqlx::query(INSERT_NOW)
        .bind("evt_open")
        .execute(&mut *open)
        .await
        .unwrap();

    let dropping = {
        let store = store.clone();
        tokio::spawn(async move {
            let partitions = store.partitions();
            partitions
                .drop_expired(PARENT, 14, Duration::from_secs(60))
                .await
        })
    };
    wait_for("the detach waiting for the open insert", WAIT, || async {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                             WHERE query LIKE '%DETACH PARTITION%'
                               AND wait_event IS NOT NULL AND pid <> pg_backend_pid())",
        )
        .fetch_one(&pool)
        .await
        .ok()?;
        waiting.then_some(())
    })
    .await;
    // Inserts go on meanwhile (a plain DETACH or DROP would queue them behind itself).
    for i in 0..5 {
        let insert = sqlx::query(INSERT_NOW)
            .bind(format!("evt_during_{i}"))
            .execute(&pool);
        tokio::time::timeout(Duration::from_secs(10), insert)
            .await
            .expect("an insert during the detach is not blocked")
            .unwrap();
    }
    assert!(
        !dropping.is_finished(),
        "the detach waits for the open insert"
    );
    open.commit().await.unwrap();

    let done = tokio::time::timeout(WAIT, dropping)
        .await
        .expect("the drop ends after the commit")
        .unwrap()
        .expect("the drop succeeds");
    assert_eq!(
        done.dropped,
        ["event_bodies_p20200101", "event_bodies_p20200102"]
    );
    assert!(!exists(&pool, "event_bodies_p20200101").await);
    assert!(attached(&pool, "event_bodies_p2020").await.is_empty());
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM event_bodies")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kept, 6, "today's bodies stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_interrupted_by_its_timeout_is_finished_by_the_next_pass() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let pool = store.postgres_pool().unwrap().clone();
    let partitions = store.partitions();
    partitions
        .ensure_days(PARENT, day(2020, 3, 1), day(2020, 3, 1))
        .await
        .unwrap();
    // A long read (a console page, an export) holding its snapshot on the parent.
    let mut reader = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *reader)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM event_bodies")
        .execute(&mut *reader)
        .await
        .unwrap();

    let interrupted = partitions
        .drop_expired(PARENT, 14, Duration::from_secs(1))
        .await;
    assert!(interrupted.is_err(), "{interrupted:?}");
    let pending: bool = sqlx::query_scalar(
        "SELECT inhdetachpending FROM pg_inherits
          WHERE inhrelid = 'event_bodies_p20200301'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(pending, "left pending detach");
    reader.rollback().await.unwrap();

    let done = partitions
        .drop_expired(PARENT, 14, Duration::from_secs(60))
        .await
        .expect("the next pass");
    assert_eq!(done.finalized, ["event_bodies_p20200301"]);
    assert_eq!(done.dropped, ["event_bodies_p20200301"]);
    assert!(!exists(&pool, "event_bodies_p20200301").await);
    // Today's and the days ahead are untouched.
    assert_eq!(partitions.days_ahead(PARENT).await.unwrap(), Some(3));
}

/// `dedup-worker retention run` (the whole pass, as the service's task runs it): an expired day
/// dropped, today to today + 3 present, what it did printed as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_run_drops_expired_days_and_says_so() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let partitions = store.partitions();
    partitions
        .ensure_days(PARENT, day(2020, 4, 1), day(2020, 4, 1))
        .await
        .unwrap();
    let env = [("DATABASE_URL", db.url.clone())];
    let printed = crate::helpers::run_cli(&env, &["retention", "run"]);
    let mut pass: serde_json::Value = serde_json::from_str(&printed).expect("JSON");
    // How long it took varies; that it is said, once per dropped partition, does not.
    let timings = pass["partitions"][0][1]
        .as_object_mut()
        .expect("the parent's record")
        .remove("timings")
        .expect("timings");
    assert_eq!(timings.as_array().map(Vec::len), Some(1), "{printed}");
    assert!(
        timings[0]["detach_micros"].is_u64() && timings[0]["drop_micros"].is_u64(),
        "{printed}"
    );
    assert_eq!(
        pass["partitions"],
        serde_json::json!([["event_bodies", {"finalized": [], "dropped": ["event_bodies_p20200401"], "busy": false}]]),
        "{printed}"
    );
    assert_eq!(pass["errors"], serde_json::json!([]), "{printed}");
    assert_eq!(partitions.days_ahead(PARENT).await.unwrap(), Some(3));
}
