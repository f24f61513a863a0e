//! Issue 39, item 4, through the binary: an ordered sink (`[outbox.sinks.NAME] ordered = true`)
//! delivers the rows of one ordering key in commit order, one at a time, while other keys flow.
//!
//! * 1,000 events over 50 keys (the default key, `/data/object/id`), four consumer workers
//!   writing rows of one key in concurrent transactions, a receiver failing a quarter of its
//!   answers at random and every answer for one key until the others are all through: no
//!   delivery of a key's row arrives before every earlier row of its key (in outbox id order,
//!   which is commit order) was accepted, and the held key holds back nothing of the others.
//! * A row failed for good holds its key: its successors never arrive, `outbox held` and the
//!   console's overview show the key and how many wait, and `outbox skip ID` lets them go, in
//!   order (SQLite, so both stores' claims are covered).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use futures::StreamExt;

use crate::helpers::app::{cli_json_lines, run_cli, RunningBinary};
use dedup_worker_core::testing::stripe_event_with;

use crate::helpers::{post_signed, serve, wait_for, Backend, TestDb};

const SECRET: &str = "whsec_test_secret";
const SINK: &str = "ledger";

/// One POST at the receiver, in arrival order.
#[derive(Debug, Clone)]
struct Arrival {
    key: String,
    event_id: String,
    accepted: bool,
}

/// What the receiver fails: a share of all answers (by a hash of the event and its attempt, so
/// a run is the same each time), every answer for `held_key` while `holding`, and every answer
/// for `poisoned` events.
struct Script {
    arrivals: Mutex<Vec<Arrival>>,
    fail_percent: u64,
    held_key: Option<String>,
    holding: AtomicBool,
    poisoned: Mutex<HashSet<String>>,
}

async fn receive(State(script): State<Arc<Script>>, body: Bytes) -> StatusCode {
    let event: serde_json::Value = serde_json::from_slice(&body).expect("a JSON event");
    let event_id = event["id"].as_str().unwrap_or_default().to_owned();
    let key = event
        .pointer("/data/object/id")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let mut arrivals = script.arrivals.lock().unwrap();
    let attempt = arrivals.iter().filter(|a| a.event_id == event_id).count();
    let unlucky = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&event_id, attempt).hash(&mut hasher);
        hasher.finish() % 100 < script.fail_percent
    };
    let held = script.holding.load(Ordering::SeqCst) && script.held_key.as_deref() == Some(&key);
    let poisoned = script.poisoned.lock().unwrap().contains(&event_id);
    let accepted = !(unlucky || held || poisoned);
    arrivals.push(Arrival {
        key,
        event_id,
        accepted,
    });
    match accepted {
        true => StatusCode::OK,
        false => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn receiver(script: Arc<Script>) -> String {
    let router = Router::new()
        .route("/hook", post(receive))
        .with_state(script);
    format!("http://{}/hook", serve(router).await)
}

fn binary(db: &TestDb, work: &tempfile::TempDir, url: &str, max_attempts: u32) -> RunningBinary {
    let sink = [
        ("DEDUP_OUTBOX__SINKS__LEDGER__URL", url.to_owned()),
        ("DEDUP_OUTBOX__SINKS__LEDGER__ORDERED", "true".to_owned()),
        (
            "DEDUP_OUTBOX__SINKS__LEDGER__MAX_ATTEMPTS",
            max_attempts.to_string(),
        ),
    ];
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__RETRY_BASE", "20ms".to_owned()),
        ("DEDUP_OUTBOX__RETRY_MAX", "200ms".to_owned()),
        // The failures are the test's: no circuit between them and the relay.
        ("DEDUP_OUTBOX__BREAKER__FAILURES", "0".to_owned()),
        ("DEDUP_OUTBOX__BREAKER__WINDOW", "0".to_owned()),
        ("DEDUP_ADMIN__LISTEN", "127.0.0.1:0".to_owned()),
        ("DEDUP_ADMIN__TOKEN", crate::console::TOKEN.to_owned()),
        (
            "DEDUP_OUTBOX__ROUTES",
            format!(r#"[{{name="all", sinks=["{SINK}"]}}]"#),
        ),
    ];
    let all: Vec<(&str, String)> = env.into_iter().chain(sink).collect();
    RunningBinary::start(&all, work.path())
}

/// Posts `events` (id, ordering key) to the binary, `at_once` at a time.
async fn send(binary: &RunningBinary, events: &[(String, String)], at_once: usize) {
    let client = reqwest::Client::new();
    let url = binary.url("/webhooks/stripe");
    futures::stream::iter(events)
        .map(|(id, key)| {
            let (client, url) = (&client, &url);
            async move {
                let body = stripe_event_with(
                    id,
                    "invoice.updated",
                    serde_json::json!({"id": key, "object": "invoice"}),
                );
                let r = post_signed(client, url, SECRET, body).await.unwrap();
                assert_eq!(r.status(), 200, "{id}");
            }
        })
        .buffer_unordered(at_once)
        .collect::<Vec<()>>()
        .await;
}

/// The sink's rows as (ordering key, event id), in id order: each key's commit order.
async fn committed(db: &TestDb) -> Vec<(Option<String>, String)> {
    let store = db.store().await;
    const SQL: &str = "SELECT ordering_key, event_id FROM outbox WHERE sink = $1 ORDER BY id";
    let rows = match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(SQL).bind(SINK).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(SQL).bind(SINK).fetch_all(pool).await,
        _ => unreachable!(),
    };
    store.close().await;
    rows.expect("the sink's rows")
}

/// Every arrival that broke its key's order: a row delivered (accepted or not) before an
/// earlier row of its key was accepted, or after a later one arrived.
fn order_violations(order: &HashMap<String, Vec<String>>, arrivals: &[Arrival]) -> Vec<String> {
    let position: HashMap<&str, usize> = order
        .values()
        .flat_map(|ids| ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)))
        .collect();
    let mut accepted: HashMap<&str, usize> = HashMap::new(); // key → rows accepted in a row
    let mut furthest: HashMap<&str, usize> = HashMap::new();
    let mut violations = Vec::new();
    for arrival in arrivals {
        let at = position[arrival.event_id.as_str()];
        let done = accepted.entry(arrival.key.as_str()).or_default();
        let seen = furthest.entry(arrival.key.as_str()).or_default();
        if at > *done || at < *seen {
            violations.push(format!(
                "{} ({}th of key {}) arrived with {} of its key accepted, the furthest arrived the {}th",
                arrival.event_id, at, arrival.key, done, seen
            ));
        }
        *seen = (*seen).max(at);
        if arrival.accepted && at == *done {
            *done += 1;
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_over_fifty_keys_arrive_in_commit_order_per_key_while_other_keys_flow() {
    const KEYS: usize = 50;
    const EVENTS: usize = 1_000;
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let held_key = "in_held".to_owned();
    let script = Arc::new(Script {
        arrivals: Mutex::default(),
        fail_percent: 25,
        held_key: Some(held_key.clone()),
        holding: AtomicBool::new(true),
        poisoned: Mutex::default(),
    });
    let app = binary(&db, &work, &receiver(script.clone()).await, 100_000);
    let events: Vec<(String, String)> = (0..EVENTS)
        .map(|i| {
            let key = match i % KEYS {
                0 => held_key.clone(),
                k => format!("in_{k:02}"),
            };
            (format!("evt_ordered_{i:04}"), key)
        })
        .collect();
    send(&app, &events, 8).await;

    // Every key but the held one gets through while the held one's first row keeps failing.
    let others = EVENTS - EVENTS / KEYS;
    wait_for(
        "every other key's events accepted",
        Duration::from_secs(120),
        || async {
            let arrivals = script.arrivals.lock().unwrap();
            let accepted: HashSet<&str> = arrivals
                .iter()
                .filter(|a| a.accepted && a.key != held_key)
                .map(|a| a.event_id.as_str())
                .collect();
            (accepted.len() == others).then_some(())
        },
    )
    .await;
    let held_arrivals: HashSet<String> = script
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.key == held_key)
        .map(|a| a.event_id.clone())
        .collect();
    assert_eq!(
        held_arrivals.len(),
        1,
        "only the held key's first row may have been tried: {held_arrivals:?}"
    );
    script.holding.store(false, Ordering::SeqCst);
    wait_for("every event accepted", Duration::from_secs(60), || async {
        let arrivals = script.arrivals.lock().unwrap();
        let accepted: HashSet<&str> = arrivals
            .iter()
            .filter(|a| a.accepted)
            .map(|a| a.event_id.as_str())
            .collect();
        (accepted.len() == EVENTS).then_some(())
    })
    .await;

    let rows = committed(&db).await;
    assert_eq!(rows.len(), EVENTS, "one row per event in the ordered sink");
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for (key, event_id) in rows {
        let key = key.unwrap_or_else(|| panic!("{event_id}'s row has no ordering key"));
        order.entry(key).or_default().push(event_id);
    }
    assert_eq!(order.len(), KEYS);
    let arrivals = script.arrivals.lock().unwrap().clone();
    let failed = arrivals.iter().filter(|a| !a.accepted).count();
    assert!(
        failed > EVENTS / 10,
        "the receiver failed only {failed} deliveries"
    );
    let violations = order_violations(&order, &arrivals);
    assert!(
        violations.is_empty(),
        "{} deliveries out of order, the first: {:#?}",
        violations.len(),
        &violations[..violations.len().min(10)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_failed_for_good_holds_its_key_visibly_until_an_operator_skips_it() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let script = Arc::new(Script {
        arrivals: Mutex::default(),
        fail_percent: 0,
        held_key: None,
        holding: AtomicBool::new(false),
        poisoned: Mutex::new(HashSet::from(["evt_first".to_owned()])),
    });
    let app = binary(&db, &work, &receiver(script.clone()).await, 2);
    let cli_env = [("DATABASE_URL", db.url.clone())];
    let key = "in_stuck".to_owned();
    send(&app, &[("evt_first".to_owned(), key.clone())], 1).await;
    wait_for("the first row written", Duration::from_secs(20), || async {
        (!committed(&db).await.is_empty()).then_some(())
    })
    .await;
    let later = [
        ("evt_second".to_owned(), key.clone()),
        ("evt_third".to_owned(), key.clone()),
        ("evt_other".to_owned(), "in_free".to_owned()),
    ];
    send(&app, &later, 1).await;

    let held = wait_for("the key held", Duration::from_secs(30), || {
        let env = &cli_env;
        async move {
            cli_json_lines(env, &["outbox", "held"])
                .into_iter()
                .find(|h| h["waiting"] == 2)
        }
    })
    .await;
    assert_eq!(held["sink"], SINK, "{held}");
    assert_eq!(held["ordering_key"], key.as_str(), "{held}");
    assert_eq!(held["event_id"], "evt_first", "{held}");
    wait_for(
        "the other key delivered",
        Duration::from_secs(20),
        || async {
            let arrivals = script.arrivals.lock().unwrap();
            arrivals
                .iter()
                .any(|a| a.event_id == "evt_other" && a.accepted)
                .then_some(())
        },
    )
    .await;
    let client = reqwest::Client::new();
    let admin = app.admin_addr.expect("the console's address");
    let page = client
        .get(format!("http://{admin}/"))
        .bearer_auth(crate::console::TOKEN)
        .send()
        .await
        .expect("the console's overview")
        .text()
        .await
        .unwrap();
    let table = page
        .split("id=\"held-keys\"")
        .nth(1)
        .expect("the overview lists held keys");
    assert!(
        table.contains("in_stuck") && table.contains("evt_first"),
        "{page}"
    );
    let tried: Vec<String> = script
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.key == key)
        .map(|a| a.event_id.clone())
        .collect();
    assert_eq!(
        tried,
        ["evt_first", "evt_first"],
        "the key's later rows waited"
    );

    let id = held["id"].as_i64().expect("the held row's id").to_string();
    let skipped = run_cli(&cli_env, &["outbox", "skip", &id]);
    assert!(skipped.contains("\"outbox_skip\""), "{skipped}");
    wait_for("the key's later rows", Duration::from_secs(20), || async {
        let arrivals = script.arrivals.lock().unwrap();
        let accepted: Vec<&str> = arrivals
            .iter()
            .filter(|a| a.key == key && a.accepted)
            .map(|a| a.event_id.as_str())
            .collect();
        (accepted.len() == 2).then(|| assert_eq!(accepted, ["evt_second", "evt_third"]))
    })
    .await;
    assert!(cli_json_lines(&cli_env, &["outbox", "held"]).is_empty());
    let failed = cli_json_lines(&cli_env, &["outbox", "failed"]);
    assert!(
        failed.iter().any(|f| f["event_id"] == "evt_first"),
        "a skipped row stays failed: {failed:?}"
    );
}

/// The checker itself: a row arriving before its predecessor was accepted, or after a later
/// row of its key, is a violation; a retry of the head and other keys interleaved are not.
#[test]
fn the_order_checker_sees_an_overtaking_row() {
    let order = HashMap::from([
        ("a".to_owned(), vec!["a1".to_owned(), "a2".to_owned()]),
        ("b".to_owned(), vec!["b1".to_owned()]),
    ]);
    let arrival = |event_id: &str, accepted: bool| Arrival {
        key: event_id[..1].to_owned(),
        event_id: event_id.to_owned(),
        accepted,
    };
    let fine = [
        arrival("a1", false),
        arrival("b1", true),
        arrival("a1", true),
        arrival("a2", true),
    ];
    assert!(order_violations(&order, &fine).is_empty());
    let overtaken = [
        arrival("a1", false),
        arrival("a2", true),
        arrival("a1", true),
    ];
    assert_eq!(order_violations(&order, &overtaken).len(), 2);
}
