//! The dedup window as a ring of generations (`store::dedup`), on both stores: an id recorded
//! just before a generation is sealed is a duplicate just after it, and after every later seal
//! while it is inside the window; a rotation never reuses a slot whose ids are inside the window;
//! an expired generation is emptied and its slot reused. On PostgreSQL a seal waits for a batch
//! that is still inserting into the old generation, so the two cannot both take an id. An upgrade
//! from the single-table schema keeps every processed id. And through the binary: an event
//! handled before a seal is not handled again after it.

use std::path::Path;
use std::time::Duration;

use dedup_worker_core::store::Store;

use crate::helpers::{
    ledger_counts, post_signed, stripe_event, wait_for, Backend, RunningBinary, TestDb, TestQueue,
    Transport,
};

const WINDOW: Duration = Duration::from_secs(30 * 86_400);

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Postgres).await } )*
        }
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
    };
}

on_both_stores!(
    an_id_recorded_before_a_seal_is_a_duplicate_after_every_seal_inside_the_window,
    an_expired_generation_is_emptied_and_the_ring_wraps,
    the_upgrade_from_one_table_keeps_every_processed_id,
    an_event_handled_before_a_seal_is_not_handled_again_after_it,
);

fn pair(id: &str) -> (String, String) {
    (id.to_owned(), "test.event".to_owned())
}

/// Records `ids` in one committed batch; returns those that were new.
async fn record(store: &Store, source: &str, ids: &[&str]) -> Vec<String> {
    let mut tx = store.begin().await.unwrap();
    let pairs: Vec<_> = ids.iter().map(|id| pair(id)).collect();
    let mut new = tx.insert_processed(source, &pairs).await.unwrap();
    tx.commit().await.unwrap();
    new.sort();
    new
}

/// `(slot, sealed)` of each generation in use, by slot.
async fn generations(store: &Store) -> Vec<(i64, bool)> {
    let sql =
        "SELECT CAST(slot AS BIGINT), sealed_at IS NOT NULL FROM dedup_generations ORDER BY slot";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
        (None, None) => unreachable!(),
    }
    .unwrap()
}

async fn scalar(store: &Store, sql: &str) -> i64 {
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_scalar(sql).fetch_one(pool).await,
        (_, Some(pool)) => sqlx::query_scalar(sql).fetch_one(pool).await,
        (None, None) => unreachable!(),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn an_id_recorded_before_a_seal_is_a_duplicate_after_every_seal_inside_the_window(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    assert_eq!(record(&store, "stripe", &["evt_a"]).await, ["evt_a"]);

    let sealed = store.dedup().seal(WINDOW).await.unwrap();
    assert!(sealed.sealed && sealed.expired == 0);
    assert_eq!(generations(&store).await, [(0, true), (1, false)]);
    // Just after the boundary: a duplicate, also in a batch with a new id, and for another
    // source the same id is another event.
    assert_eq!(
        record(&store, "stripe", &["evt_a"]).await,
        Vec::<String>::new()
    );
    assert_eq!(
        record(&store, "stripe", &["evt_b", "evt_a"]).await,
        ["evt_b"]
    );
    assert_eq!(record(&store, "github", &["evt_a"]).await, ["evt_a"]);

    // Sealed three more times: evt_a's generation is four back, evt_b's three.
    for _ in 0..3 {
        assert!(store.dedup().seal(WINDOW).await.unwrap().sealed);
        assert_eq!(
            record(&store, "stripe", &["evt_a", "evt_b"]).await,
            Vec::<String>::new()
        );
    }
    assert_eq!(
        generations(&store).await,
        [(0, true), (1, true), (2, true), (3, true), (4, false)]
    );
    // The next slot is evt_a's, sealed inside the window: no rotation, nothing dropped.
    let refused = store.dedup().seal(WINDOW).await.unwrap();
    assert!(!refused.sealed && refused.next_slot_busy && refused.expired == 0);
    assert_eq!(
        record(&store, "stripe", &["evt_a", "evt_b", "evt_c"]).await,
        ["evt_c"]
    );
    let mut among = store
        .dedup()
        .processed_among(
            "stripe",
            &[
                "evt_a".into(),
                "evt_b".into(),
                "evt_c".into(),
                "evt_d".into(),
            ],
        )
        .await
        .unwrap();
    among.sort();
    assert_eq!(among, ["evt_a", "evt_b", "evt_c"]);
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM processed_events").await,
        4
    );
}

async fn an_expired_generation_is_emptied_and_the_ring_wraps(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    assert_eq!(record(&store, "stripe", &["evt_old"]).await, ["evt_old"]);
    assert!(store.dedup().seal(WINDOW).await.unwrap().sealed);
    // Inside a window of an hour it stays.
    let kept = store
        .dedup()
        .maintain(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(kept.expired, 0);
    assert!(record(&store, "stripe", &["evt_old"]).await.is_empty());
    // Past a zero window its generation is emptied (once the clock has moved past the seal).
    wait_for(
        "the sealed generation to expire",
        Duration::from_secs(10),
        || async {
            let done = store.dedup().maintain(Duration::ZERO).await.unwrap();
            (done.expired > 0).then_some(())
        },
    )
    .await;
    assert_eq!(record(&store, "stripe", &["evt_old"]).await, ["evt_old"]);

    // Twelve rotations go round the ring more than twice; each id is a duplicate until its
    // generation expires, and there is always exactly one current generation.
    for round in 0..12 {
        let id = format!("evt_round_{round}");
        assert_eq!(record(&store, "stripe", &[&id]).await, [id.as_str()]);
        assert!(record(&store, "stripe", &[&id]).await.is_empty());
        wait_for("a seal", Duration::from_secs(10), || async {
            let done = store.dedup().seal(Duration::ZERO).await.unwrap();
            done.sealed.then_some(())
        })
        .await;
        let current: Vec<_> = generations(&store)
            .await
            .into_iter()
            .filter(|(_, sealed)| !sealed)
            .collect();
        assert_eq!(
            current.len(),
            1,
            "one current generation after round {round}"
        );
    }
}

/// The migrations of the single-table schema (before `20261201000003_dedup_generations`).
async fn old_migrator(backend: Backend) -> sqlx::migrate::Migrator {
    let dir = match backend {
        Backend::Postgres => "crates/dedup-worker-core/migrations/postgres",
        Backend::Sqlite => "crates/dedup-worker-core/migrations/sqlite",
    };
    let mut migrator =
        sqlx::migrate::Migrator::new(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
            .await
            .unwrap();
    migrator.migrations = migrator
        .migrations
        .iter()
        .filter(|m| m.version < 20261201000003)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    migrator
}

async fn the_upgrade_from_one_table_keeps_every_processed_id(backend: Backend) {
    const RECENT: i64 = 20_000;
    const OLD: i64 = 100;
    let db = TestDb::new(backend).await;
    let store = Store::connect_url(&db.url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    let migrator = old_migrator(backend).await;
    // Today's schema with today's rows: recent ids of two sources, and ids past the window.
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => {
            migrator.run(pool).await.unwrap();
            sqlx::query(
                "INSERT INTO processed_events (source, event_id, event_type, processed_at)
                 SELECT CASE WHEN g % 2 = 0 THEN 'stripe' ELSE 'github' END, 'evt_up_' || g,
                        'invoice.paid', now() - (g % 29) * interval '1 day'
                   FROM generate_series(1, $1) AS g
                 UNION ALL
                 SELECT 'stripe', 'evt_gone_' || g, 'invoice.paid', now() - interval '40 days'
                   FROM generate_series(1, $2) AS g",
            )
            .bind(RECENT)
            .bind(OLD)
            .execute(pool)
            .await
            .unwrap();
        }
        (_, Some(pool)) => {
            migrator.run(pool).await.unwrap();
            sqlx::query(
                "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < $1)
                 INSERT INTO processed_events (source, event_id, event_type, processed_at)
                 SELECT CASE WHEN x % 2 = 0 THEN 'stripe' ELSE 'github' END, 'evt_up_' || x,
                        'invoice.paid', $3 - (x % 29) * 86400000 FROM g
                 UNION ALL
                 SELECT 'stripe', 'evt_gone_' || x, 'invoice.paid', $3 - 40 * 86400000
                   FROM g WHERE x <= $2",
            )
            .bind(RECENT)
            .bind(OLD)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(pool)
            .await
            .unwrap();
        }
        (None, None) => unreachable!(),
    }

    store.migrate().await.unwrap();
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM processed_events").await,
        RECENT + OLD,
        "every id is still recorded after the upgrade"
    );
    // Every recorded id is a duplicate, in batches as the consumer sends them.
    for source in ["stripe", "github"] {
        let ids: Vec<String> = (1..=RECENT)
            .filter(|g| (g % 2 == 0) == (source == "stripe"))
            .map(|g| format!("evt_up_{g}"))
            .collect();
        for batch in ids.chunks(500) {
            let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
            assert!(
                record(&store, source, &refs).await.is_empty(),
                "ids recorded before the upgrade are duplicates after it"
            );
            assert_eq!(
                store
                    .dedup()
                    .processed_among(source, batch)
                    .await
                    .unwrap()
                    .len(),
                batch.len()
            );
        }
    }
    // Retention deletes the legacy ids past the window, and only those.
    while store
        .retention()
        .purge_expired(WINDOW, WINDOW, 1_000)
        .await
        .unwrap()
        > 0
    {}
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM processed_events").await,
        RECENT
    );
    assert_eq!(
        record(&store, "stripe", &["evt_gone_1"]).await,
        ["evt_gone_1"]
    );
    assert!(record(&store, "stripe", &["evt_up_2"]).await.is_empty());
    // And a second run of the migrations changes nothing.
    store.migrate().await.unwrap();
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM processed_events").await,
        RECENT + 1
    );
}

async fn an_event_handled_before_a_seal_is_not_handled_again_after_it(backend: Backend) {
    const SECRET: &str = "whsec_dedup_window";
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(Transport::Database).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
        ],
        work.path(),
    );
    let store = db.store().await;
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    let deliver = |id: &'static str| {
        let (client, url, store, queue, bin) = (&client, &url, &store, &queue, &bin);
        async move {
            let status = post_signed(client, url, SECRET, stripe_event(id, "invoice.paid"))
                .await
                .expect("request")
                .status();
            assert_eq!(status, 200);
            bin.wait_for(
                "the delivery to be consumed",
                Duration::from_secs(30),
                || async { queue.drained(store).await.then_some(()) },
            )
            .await;
        }
    };

    deliver("evt_before_seal").await;
    for seal in 0..4 {
        assert!(store.dedup().seal(WINDOW).await.unwrap().sealed);
        deliver("evt_before_seal").await;
        deliver(["evt_after_1", "evt_after_2", "evt_after_3", "evt_after_4"][seal]).await;
    }
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.get("evt_before_seal"), Some(&1), "{ledger:?}");
    assert_eq!(ledger.len(), 5, "{ledger:?}");
    assert!(ledger.values().all(|n| *n == 1), "{ledger:?}");
}

/// PostgreSQL, where batches run concurrently: a seal waits for a batch that read the old
/// generation and has not committed, so a batch that starts after the seal finds the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_waits_for_a_batch_still_inserting_into_the_old_generation() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let mut first = store.begin().await.unwrap();
    assert_eq!(
        first
            .insert_processed("stripe", &[pair("evt_race")])
            .await
            .unwrap(),
        ["evt_race"]
    );
    let sealing = tokio::spawn({
        let store = store.clone();
        async move { store.dedup().seal(WINDOW).await }
    });
    // The seal waits on the generation lock while the first batch is open.
    let pool = store.postgres_pool().unwrap().clone();
    wait_for(
        "the seal to wait for the open batch",
        Duration::from_secs(10),
        || {
            let pool = pool.clone();
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
    assert!(!sealing.is_finished());
    first.commit().await.unwrap();
    let sealed = sealing.await.unwrap().unwrap();
    assert!(sealed.sealed, "the seal completes once the batch committed");
    assert_eq!(
        record(&store, "stripe", &["evt_race"]).await,
        Vec::<String>::new(),
        "the id committed into the old generation is a duplicate in the new one"
    );
}
