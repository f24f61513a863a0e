//! Issue 40: kept event bodies, on both stores. A handled event's body is kept once (its
//! duplicate delivery adds none), with its search keys, and reads back equal; the console's
//! event page shows it, and hides it with `admin.show_payloads = false`; SQLite's purge deletes
//! old bodies in bounded batches; the stale guard's records are pruned past the dedup window.

use std::time::Duration;

use dedup_worker::Service;
use dedup_worker_core::event::search_keys::SearchPointers;
use dedup_worker_core::store::bodies::NewEventBody;
use dedup_worker_core::store::Store;
use serde_json::{json, Value};

use crate::helpers::{
    post_signed, store_contract, test_settings, wait_for, Backend, TestApp, TestDb,
};

const TOKEN: &str = "test-admin-token";
const WAIT: Duration = Duration::from_secs(30);

store_contract!(
    a_handled_events_body_is_kept_once_and_shown_on_its_page,
    stale_records_are_pruned_past_the_dedup_window,
);

/// The app with its console on port 0, quick polls, and `values`.
async fn app(db: &TestDb, values: &[(&str, Value)]) -> TestApp {
    let mut all = vec![
        ("admin.listen", json!("127.0.0.1:0")),
        ("admin.token", json!(TOKEN)),
        ("consumer.poll_interval", json!("50ms")),
        ("outbox.poll_interval", json!("50ms")),
    ];
    all.extend(values.iter().cloned());
    TestApp::spawn(test_settings(&db.url, &all), Service::new()).await
}

fn invoice(id: &str) -> Vec<u8> {
    let object =
        json!({"id": "in_kept_1", "object": "invoice", "customer": "cus_A", "amount_due": 1200});
    dedup_worker::testing::stripe_event_with(id, "invoice.paid", object)
}

async fn post(app: &TestApp, body: Vec<u8>) {
    let client = reqwest::Client::new();
    let url = app.url("/webhooks/stripe");
    let secret = dedup_worker::testing::TEST_SECRET;
    let response = post_signed(&client, &url, secret, body).await.unwrap();
    assert_eq!(response.status(), 200);
}

/// How many bodies the store holds for `event_id`.
async fn bodies_of(store: &Store, event_id: &str) -> i64 {
    let sql = "SELECT count(*) FROM event_bodies WHERE event_id = $1";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_scalar(sql).bind(event_id).fetch_one(pool).await,
        (_, Some(pool)) => sqlx::query_scalar(sql).bind(event_id).fetch_one(pool).await,
        _ => unreachable!("one of the two stores"),
    }
    .unwrap()
}

/// The event page, read with the Bearer token.
async fn event_page(app: &TestApp, id: &str) -> String {
    let response = reqwest::Client::new()
        .get(app.admin_url(&format!("/events/stripe/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

async fn a_handled_events_body_is_kept_once_and_shown_on_its_page(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = app(&db, &[("admin.show_payloads", json!(true))]).await;
    let id = "evt_kept_1";
    let body = invoice(id);
    post(&app, body.clone()).await;
    wait_for("the event handled", WAIT, || async {
        app.store
            .dedup()
            .processed_record("stripe", id)
            .await
            .ok()?
            .map(drop)
    })
    .await;
    post(&app, body.clone()).await;
    wait_for("its duplicate recorded", WAIT, || async {
        let dups = app
            .store
            .dedup()
            .duplicates_of("stripe", id, 10)
            .await
            .ok()?;
        (dups.count == 1).then_some(())
    })
    .await;

    assert_eq!(bodies_of(&app.store, id).await, 1, "kept once");
    let kept = app
        .store
        .bodies()
        .kept("stripe", id)
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(kept.body, body, "reads back equal");
    assert_eq!(kept.event_type, "invoice.paid");
    assert_eq!(kept.object_id.as_deref(), Some("in_kept_1"));
    assert_eq!(kept.customer.as_deref(), Some("cus_A"));
    let processed = app
        .store
        .dedup()
        .processed_record("stripe", id)
        .await
        .unwrap();
    assert_eq!(Some(kept.kept_at), processed.map(|p| p.processed_at));

    let page = event_page(&app, id).await;
    assert!(page.contains("id=\"body\""), "{page}");
    assert!(
        page.contains("&quot;customer&quot;: &quot;cus_A&quot;")
            || page.contains("\"customer\": \"cus_A\""),
        "{page}"
    );
    app.stop().await;

    // The same database, payloads hidden: the page says so and shows none.
    let app = self::app(&db, &[("admin.show_payloads", json!(false))]).await;
    let page = event_page(&app, id).await;
    assert!(page.contains("body-hidden"), "{page}");
    assert!(!page.contains("cus_A"), "{page}");
    app.stop().await;
}

/// SQLite keeps bodies in a plain table: the purge deletes those past `payload_days`, 500 at a
/// time, the oldest first, and leaves the young ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_removes_old_bodies_in_bounded_batches() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let pool = store.sqlite_pool().unwrap();
    let day_ms: i64 = 86_400_000;
    let now = chrono::Utc::now().timestamp_millis();
    // 1,200 bodies 20 days old, then 3 from an hour ago.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1203)
         INSERT INTO event_bodies (kept_at, key, source, event_id, event_type, encoding, body)
         SELECT CASE WHEN i <= 1200 THEN $1 ELSE $2 END, randomblob(16), 'stripe',
                'evt_' || i, 'invoice.paid', 0, CAST('{}' AS BLOB) FROM n",
    )
    .bind(now - 20 * day_ms)
    .bind(now - 3_600_000)
    .execute(pool)
    .await
    .unwrap();
    let retention = store.retention();
    let fourteen_days = Duration::from_secs(14 * 86_400);
    let mut batches = Vec::new();
    loop {
        let n = retention.purge_bodies(fourteen_days, 500).await.unwrap();
        if n == 0 {
            break;
        }
        batches.push(n);
    }
    assert_eq!(batches, [500, 500, 200]);
    let left: Vec<String> = sqlx::query_scalar("SELECT event_id FROM event_bodies ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, ["evt_1201", "evt_1202", "evt_1203"]);
}

/// The stale guard's records name ids the dedup record forgets after the window: retention
/// deletes those older than it (they grew for ever before), and keeps the younger.
async fn stale_records_are_pruned_past_the_dedup_window(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let insert = "INSERT INTO stale_events (source, event_id, event_type, object_id, version,
                  newer_event_id, newer_version, recorded_at) VALUES ('stripe', $1, 't', 'o', 1, 'n', 2, ";
    let (old, young) = match backend {
        Backend::Postgres => ("now() - interval '40 days')", "now() - interval '1 day')"),
        Backend::Sqlite => (
            "CAST(unixepoch('subsec') * 1000 AS INTEGER) - 40 * 86400000)",
            "CAST(unixepoch('subsec') * 1000 AS INTEGER) - 86400000)",
        ),
    };
    for (id, when) in [("evt_old_1", old), ("evt_old_2", old), ("evt_young", young)] {
        let sql = format!("{insert}{when}");
        match (store.postgres_pool(), store.sqlite_pool()) {
            (Some(pool), _) => sqlx::query(&sql).bind(id).execute(pool).await.map(drop),
            (_, Some(pool)) => sqlx::query(&sql).bind(id).execute(pool).await.map(drop),
            _ => unreachable!(),
        }
        .unwrap();
    }
    let window = Duration::from_secs(30 * 86_400);
    let retention = store.retention();
    // A batch of one: two passes for the two old records, the third finds nothing.
    assert_eq!(retention.purge_expired(window, window, 1).await.unwrap(), 1);
    assert_eq!(retention.purge_expired(window, window, 1).await.unwrap(), 1);
    assert_eq!(retention.purge_expired(window, window, 1).await.unwrap(), 0);
    let left: Vec<String> = match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => {
            sqlx::query_scalar("SELECT event_id FROM stale_events")
                .fetch_all(pool)
                .await
        }
        (_, Some(pool)) => {
            sqlx::query_scalar("SELECT event_id FROM stale_events")
                .fetch_all(pool)
                .await
        }
        _ => unreachable!(),
    }
    .unwrap();
    assert_eq!(left, ["evt_young"]);
}

/// PostgreSQL: with today's partition gone (maintenance failed for days), the guard skips the
/// bodies and the batch's transaction still commits its ids (without it the insert fails "no
/// partition of relation found", and the batch with it, for ever). At the store, since a
/// running app's retention would make the day again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_todays_partition_the_batch_commits_and_keeps_no_body() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let pool = store.postgres_pool().unwrap();
    let today: String = sqlx::query_scalar(
        "SELECT 'event_bodies_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    for sql in [
        format!("ALTER TABLE event_bodies DETACH PARTITION {today}"),
        format!("DROP TABLE {today}"),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
    let id = "evt_no_partition";
    let event = dedup_worker_core::testing::event("stripe", id, "invoice.paid", &invoice(id));
    let pointers = SearchPointers {
        object: "/data/object/id".into(),
        customer: "/data/object/customer".into(),
    };
    let mut tx = store.begin().await.unwrap();
    let new = tx
        .insert_processed("stripe", &[(id.to_owned(), "invoice.paid".to_owned())])
        .await
        .unwrap();
    assert_eq!(new, [id]);
    let body = NewEventBody::of(&event, None, &pointers);
    assert_eq!(
        tx.insert_event_bodies(&[body]).await.unwrap(),
        0,
        "none kept"
    );
    tx.commit().await.unwrap();
    let processed = store.dedup().processed_record("stripe", id).await.unwrap();
    assert!(processed.is_some(), "the batch committed");
    assert_eq!(bodies_of(&store, id).await, 0);
}
