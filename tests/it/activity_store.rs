//! The per-minute counts (`activity_minutes`) at the store, on both stores: counting began with
//! the migration; writers that share a
//! shard add up in one row (on PostgreSQL the second waits for the first's commit), a redrive
//! counts in its own minute and leaves a past minute as it was, and retention deletes old
//! minutes in bounded batches.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::helpers::db::execute;
use crate::helpers::{store_contract, wait_for, Backend, TestDb};
use dedup_worker_core::store::{Counts, NewDeadLetter, Series, Shard, Store};

store_contract!(
    counts_add_up_per_minute_across_two_writers_on_one_shard,
    a_redrive_counts_in_its_minute_and_leaves_a_past_minute_alone,
    old_minutes_are_purged_in_bounded_batches,
);

/// `(minute, series) → n` since `since_ms`, as the overview reads them.
async fn minutes(store: &Store, since_ms: i64) -> BTreeMap<(i64, String), i64> {
    let counts = store.reads().minute_counts(since_ms).await.expect("counts");
    counts
        .into_iter()
        .map(|c| ((c.minute_ms, c.series), c.count))
        .collect()
}

/// Each series' total over the minutes of `counts`.
fn totals(counts: &BTreeMap<(i64, String), i64>) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for ((_, series), n) in counts {
        *totals.entry(series.clone()).or_default() += n;
    }
    totals
}

fn hour_ago() -> i64 {
    chrono::Utc::now().timestamp_millis() - 3_600_000
}

/// The counter rows of `shard`: `(series, n)`, by series.
async fn shard_rows(store: &Store, shard: i16) -> Vec<(String, i64)> {
    let sql = "SELECT series, n FROM activity_minutes WHERE shard = $1 ORDER BY series, minute";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).bind(shard).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).bind(shard).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("read the rows")
}

/// Moves every counter row an hour back: what was counted now becomes a past minute.
async fn age_an_hour(store: &Store) {
    execute(
        store,
        match store.backend() {
            dedup_worker_core::store::Backend::Postgres => {
                "UPDATE activity_minutes SET minute = minute - interval '1 hour'"
            }
            dedup_worker_core::store::Backend::Sqlite => {
                "UPDATE activity_minutes SET minute = minute - 3600000"
            }
        },
    )
    .await;
}

async fn counts_add_up_per_minute_across_two_writers_on_one_shard(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // A new database: counting began when its migrations ran, a moment ago.
    let since = store.reads().counting_since().await.expect("read");
    let since = since.expect("the migration's time, from the history");
    let ago = chrono::Utc::now().timestamp_millis() - since;
    assert!(
        (-5_000..600_000).contains(&ago),
        "counting since {ago} ms ago"
    );
    let shared = Shard::of(7);
    let mut first = store.begin().await.expect("begin");
    let mut counts = Counts::default();
    counts.add(Series::Handled, 3).add(Series::Duplicates, 1);
    first.add_counts(&counts, shared).await.expect("count");

    // The second writer names its series in the other order; the statement sorts them, so
    // it waits for the first writer's rows in the same order (never a deadlock).
    let second = tokio::spawn({
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.expect("begin");
            let mut counts = Counts::default();
            counts.add(Series::Duplicates, 2).add(Series::Handled, 4);
            tx.add_counts(&counts, shared).await.expect("count");
            tx.commit().await.expect("commit");
        }
    });
    if let Some(pool) = store.postgres_pool() {
        // Same shard, same rows: the second writer waits for the first one's commit.
        wait_for(
            "the second writer waiting",
            Duration::from_secs(10),
            || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0",
                )
                .fetch_one(pool)
                .await
                .ok()?;
                (waiting == 1).then_some(())
            },
        )
        .await;
    }
    first.commit().await.expect("commit");
    second.await.expect("the second writer");
    // A third writer on another shard: its own rows, summed in by the read.
    let mut third = store.begin().await.expect("begin");
    third
        .add_counts(&Counts::of(Series::Handled, 5), Shard::of(8))
        .await
        .expect("count");
    third.commit().await.expect("commit");

    let counted = minutes(&store, hour_ago()).await;
    let sums = totals(&counted);
    assert_eq!(sums.get("handled"), Some(&12), "{counted:?}");
    assert_eq!(sums.get("duplicates"), Some(&3), "{counted:?}");
    // The shared shard's writers added to one row per series (two, unless the minute turned
    // between the writers: then two per minute).
    let shared_rows = shard_rows(&store, shared.number()).await;
    if shared_rows.len() == 2 {
        assert_eq!(
            shared_rows,
            [("duplicates".to_owned(), 3), ("handled".to_owned(), 7)]
        );
    } else {
        assert_eq!(shared_rows.len(), 4, "{shared_rows:?}");
    }
    assert_eq!(
        shard_rows(&store, 8).await,
        [("handled".to_owned(), 5)],
        "another shard, its own row"
    );
    db.remove().await;
}

async fn a_redrive_counts_in_its_minute_and_leaves_a_past_minute_alone(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.expect("begin");
    for id in ["evt_past_1", "evt_past_2"] {
        tx.insert_dead_letter(&NewDeadLetter {
            source: "stripe".into(),
            event_id: id.into(),
            event_type: "test.event".into(),
            queue: "q".into(),
            payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
            error: "fatal".into(),
            attempts: 1,
        })
        .await
        .expect("dead letter");
    }
    let mut counts = Counts::default();
    counts
        .add(Series::DeadLettered, 2)
        .add(Series::Handled, 5)
        .add(Series::Stale, 0);
    tx.add_counts(&counts, Shard::random())
        .await
        .expect("count");
    tx.commit().await.expect("commit");
    age_an_hour(&store).await;
    let since = hour_ago() - 3_600_000;
    let past = minutes(&store, since).await;
    assert_eq!(
        past.values().sum::<i64>(),
        7,
        "a zero count writes nothing: {past:?}"
    );

    let now = chrono::Utc::now().timestamp_millis();
    let now_minute = now - now.rem_euclid(60_000);
    let dead = store.dead_letters().list(10).await.expect("list");
    assert_eq!(dead.len(), 2);
    assert_eq!(
        store
            .dead_letters()
            .redrive(dead[0].id, "q")
            .await
            .expect("redrive"),
        1
    );
    // Gone already: nothing recorded, nothing counted.
    assert_eq!(
        store
            .dead_letters()
            .redrive(dead[0].id, "q")
            .await
            .expect("redrive"),
        0
    );

    let after = minutes(&store, since).await;
    let (before_now, since_now): (BTreeMap<_, _>, BTreeMap<_, _>) = after
        .into_iter()
        .partition(|((minute, _), _)| *minute < now_minute);
    assert_eq!(before_now, past, "the past minute as it was");
    assert_eq!(
        since_now.into_values().collect::<Vec<_>>(),
        [1],
        "one redrive, counted now"
    );
    assert_eq!(
        totals(&minutes(&store, since).await).get("redriven"),
        Some(&1)
    );
    db.remove().await;
}

async fn old_minutes_are_purged_in_bounded_batches(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut tx = store.begin().await.expect("begin");
    for shard in 0..5 {
        tx.add_counts(&Counts::of(Series::Handled, 1), Shard::of(shard))
            .await
            .expect("count");
    }
    tx.commit().await.expect("commit");
    age_an_hour(&store).await;
    let mut tx = store.begin().await.expect("begin");
    tx.add_counts(&Counts::of(Series::Duplicates, 1), Shard::of(0))
        .await
        .expect("count");
    tx.commit().await.expect("commit");

    let half_an_hour_ago = chrono::Utc::now().timestamp_millis() - 1_800_000;
    let mut deleted = Vec::new();
    loop {
        let n = store
            .activity()
            .purge_before(half_an_hour_ago, 2)
            .await
            .expect("purge");
        deleted.push(n);
        if n < 2 {
            break;
        }
    }
    assert_eq!(deleted, [2, 2, 1], "five old rows, two at a time");
    let left = minutes(&store, hour_ago() - 3_600_000).await;
    assert_eq!(
        totals(&left).into_iter().collect::<Vec<_>>(),
        [("duplicates".to_owned(), 1)],
        "this minute's row stays"
    );
    db.remove().await;
}
