//! A message keyed differently by an earlier release or another setting (issue 26, item 8):
//! the key it had before is its alias, which the dedup insert looks up in every generation and
//! the legacy table, and never records. On both stores:
//! * the store: an alias found in a sealed generation (even for an event whose creation time
//!   would skip it), the current one or the legacy table makes the event a duplicate; one found
//!   nowhere (or only under another source) does not, and is not recorded;
//! * the binary: a thin event the previous release recorded under its own id, delivered again
//!   (keyed now by its snapshot event), is not handled again; nor is a message the previous
//!   release published (keyed by the thin event's own id) whose snapshot event was handled;
//! * the binary: an EventBridge envelope a release before the change keying handled with
//!   `consumer.envelope = "none"` (keyed by the envelope's id), delivered again (keyed now by its
//!   `detail`, with either setting), is not handled again; one handled with either setting is a
//!   duplicate with the other.

use std::path::Path;
use std::time::Duration;

use dedup_worker_core::store::{NewQueueMessage, ProcessedEvent, Store};
use serde_json::Value;

use crate::helpers::stripe_channels::{eventbridge_envelope, snapshot_event, thin_event};
use crate::helpers::{ledger_counts, post_signed_until_not_503, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_aliases";
const WINDOW: Duration = Duration::from_secs(30 * 86_400);
const QUEUE: &str = "dedup.events";

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
    an_alias_is_looked_up_everywhere_and_never_recorded,
    a_thin_event_keyed_by_the_previous_release_is_not_handled_again,
    an_eventbridge_envelope_is_not_handled_again_after_a_change_of_setting,
);

fn processed(id: &str, alias: Option<&str>) -> ProcessedEvent {
    ProcessedEvent {
        id: id.into(),
        event_type: "invoice.paid".into(),
        alias: alias.map(str::to_owned),
        ..ProcessedEvent::default()
    }
}

/// Records `events` under `source` in one committed batch; the ids that were new, sorted.
async fn record(store: &Store, source: &str, events: &[ProcessedEvent]) -> Vec<String> {
    let mut tx = store.begin().await.unwrap();
    let mut new = tx.insert_processed_events(source, events).await.unwrap();
    tx.commit().await.unwrap();
    new.sort();
    new
}

async fn an_alias_is_looked_up_everywhere_and_never_recorded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // Earlier records: one in a generation then sealed, one in the current generation, one in
    // the legacy table of the single-table schema, one under another source.
    record(&store, "stripe", &[processed("evt_old_sealed", None)]).await;
    assert!(store.dedup().seal(WINDOW).await.unwrap().sealed);
    record(&store, "stripe", &[processed("evt_old_current", None)]).await;
    record(&store, "github", &[processed("evt_old_github", None)]).await;
    let legacy = match backend {
        Backend::Postgres => {
            "INSERT INTO processed_events_legacy (source, event_id, event_type)
             VALUES ('stripe', 'evt_old_legacy', 'invoice.paid')"
        }
        Backend::Sqlite => {
            "INSERT INTO processed_events_legacy (source, event_id, event_type, processed_at)
             VALUES ('stripe', 'evt_old_legacy', 'invoice.paid',
                     CAST(strftime('%s', 'now') AS INTEGER) * 1000)"
        }
    };
    crate::helpers::db::execute(&store, legacy).await;

    let new = record(
        &store,
        "stripe",
        &[
            processed("evt_new_1", Some("evt_old_sealed")),
            processed("evt_new_2", Some("evt_old_current")),
            processed("evt_new_3", Some("evt_old_legacy")),
            processed("evt_new_4", Some("evt_old_github")),
            processed("evt_new_5", Some("evt_never_recorded")),
            processed("evt_new_6", None),
        ],
    )
    .await;
    assert_eq!(new, ["evt_new_4", "evt_new_5", "evt_new_6"]);
    let ids = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
    assert!(
        store
            .dedup()
            .processed_among(
                "stripe",
                &ids(&["evt_never_recorded", "evt_new_1", "evt_new_2"])
            )
            .await
            .unwrap()
            .is_empty(),
        "neither the alias nor a duplicate is recorded"
    );
    // After a seal too, the keys recorded are duplicates, and an alias that is a recorded key
    // makes another event one.
    assert!(store.dedup().seal(WINDOW).await.unwrap().sealed);
    let new = record(
        &store,
        "stripe",
        &[
            processed("evt_new_4", None),
            processed("evt_new_7", Some("evt_new_5")),
            processed("evt_new_8", Some("evt_new_8_other")),
        ],
    )
    .await;
    assert_eq!(new, ["evt_new_8"]);
}

/// The binary on the database queue, with the ledger handler and `env` added.
fn start(db: &TestDb, work: &Path, env: &[(&'static str, &str)]) -> RunningBinary {
    let mut all = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ("DEDUP_QUEUE", QUEUE.to_owned()),
    ];
    all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    RunningBinary::start(&all, work)
}

/// Waits until `deliveries` deliveries of `key` were settled, each handled (a ledger row) or
/// recognised as a duplicate; then how many times it was handled.
async fn handled(bin: &RunningBinary, store: &Store, key: &str, deliveries: i64) -> i64 {
    bin.wait_for(
        &format!("{deliveries} deliveries of {key} settled"),
        Duration::from_secs(30),
        || async {
            // Duplicates first: one is recorded only after the delivery it repeats committed.
            let duplicates = store.dedup().duplicates_of("stripe", key, 100).await.ok()?;
            let handled = *ledger_counts(store).await.get(key).unwrap_or(&0);
            (handled + duplicates.count >= deliveries).then_some(handled)
        },
    )
    .await
}

/// Puts `payload` on the queue as another producer (or an earlier release) would.
async fn enqueue(store: &Store, source: Option<&str>, message_id: Option<&str>, payload: &Value) {
    let message = NewQueueMessage {
        source: source.map(str::to_owned),
        message_id: message_id.map(str::to_owned),
        message_type: None,
        payload: serde_json::to_vec(payload).unwrap(),
        traceparent: None,
        stripe_signature: None,
        sender_headers: None,
    };
    store.queue().enqueue(QUEUE, &[message]).await.unwrap();
}

async fn post(bin: &RunningBinary, body: &Value) {
    let body = serde_json::to_vec(body).unwrap();
    let url = bin.url("/webhooks/stripe");
    // A 503 is the right answer when the store is slow on a loaded machine; Stripe retries it.
    let response = post_signed_until_not_503(&reqwest::Client::new(), &url, SECRET, body).await;
    assert_eq!(response.status(), 200);
}

async fn a_thin_event_keyed_by_the_previous_release_is_not_handled_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let store = db.store().await;
    // The previous release handled thin event evt_1_thin under its own id.
    record(&store, "stripe", &[processed("evt_1_thin", None)]).await;
    let bin = start(&db, work.path(), &[]);

    // Stripe retries it after the upgrade: keyed by its snapshot event now.
    post(&bin, &thin_event("evt_1_thin", "in_1", Some("evt_1"), None)).await;
    assert_eq!(
        handled(&bin, &store, "evt_1", 1).await,
        0,
        "the retry keyed by its snapshot event finds the thin event's own id"
    );

    // The snapshot event of change 2 is handled; a message the previous release's ingress
    // published for its thin event (keyed by the thin event's own id), still queued, is not.
    post(&bin, &snapshot_event("evt_2", "in_2")).await;
    assert_eq!(handled(&bin, &store, "evt_2", 1).await, 1);
    // It is keyed by its change now, whatever its message id.
    let queued = thin_event("evt_2_thin", "in_2", Some("evt_2"), None);
    enqueue(&store, Some("stripe"), Some("evt_2_thin"), &queued).await;
    assert_eq!(
        handled(&bin, &store, "evt_2", 2).await,
        1,
        "the message published under the thin event's own id is its snapshot event's duplicate"
    );

    // A thin event of a change nobody handled is handled once, under its snapshot event.
    post(&bin, &thin_event("evt_3_thin", "in_3", Some("evt_3"), None)).await;
    assert_eq!(handled(&bin, &store, "evt_3", 1).await, 1);
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.values().sum::<i64>(), 2, "{ledger:?}");
}

async fn an_eventbridge_envelope_is_not_handled_again_after_a_change_of_setting(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let store = db.store().await;
    let first = eventbridge_envelope(&snapshot_event("evt_eb_1", "in_1"));
    let second = eventbridge_envelope(&snapshot_event("evt_eb_2", "in_2"));
    let first_id = first["id"].as_str().unwrap().to_owned();
    let none = [("DEDUP_CONSUMER__ENVELOPE", "none")];
    let eventbridge = [("DEDUP_CONSUMER__ENVELOPE", "eventbridge")];

    // A release before the change keying, without the setting, handled the first envelope as
    // a plain message keyed by its own id.
    record(&store, "stripe", &[processed(&first_id, None)]).await;
    // Delivered again, with either setting, it is keyed by its detail and finds that id.
    let bin = start(&db, work.path(), &none);
    enqueue(&store, None, None, &first).await;
    assert_eq!(
        handled(&bin, &store, "evt_eb_1", 1).await,
        0,
        "keyed by its detail, the envelope finds the id it was handled under"
    );
    drop(bin);
    let bin = start(&db, work.path(), &eventbridge);
    enqueue(&store, None, None, &first).await;
    assert_eq!(handled(&bin, &store, "evt_eb_1", 2).await, 0);
    // The second envelope is handled under its detail's id with the setting, and is a
    // duplicate without it.
    enqueue(&store, None, None, &second).await;
    assert_eq!(handled(&bin, &store, "evt_eb_2", 1).await, 1);
    drop(bin);
    let bin = start(&db, work.path(), &none);
    enqueue(&store, None, None, &second).await;
    assert_eq!(
        handled(&bin, &store, "evt_eb_2", 2).await,
        1,
        "without the setting, the envelope is keyed by its detail too"
    );
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.values().sum::<i64>(), 1, "{ledger:?}");
    drop(bin);
}
