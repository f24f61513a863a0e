//! Stripe's other ways of delivering one change, through the real binary:
//!
//! * a thin event (event notification) and its snapshot event, posted in either order and
//!   concurrently, are one change: handled once, delivered once (signed by the official
//!   `stripe` library, whose own parser accepts each of them);
//! * with `stripe.fetch_thin_events`, the handler gets the full event from a stand-in of
//!   `GET /v2/core/events/{id}`, asked the way the official library asks it; a 5xx or a hang
//!   retries the message, never drops or doubles it, and one that keeps failing is a dead letter;
//! * an SQS queue fed with Amazon EventBridge envelopes: each Stripe event handled once, in the
//!   key space of the webhooks, and the sink gets the Stripe event, not the envelope;
//! * a thin event whose `snapshot_event` cannot be a key is a 400 naming the check, and nothing
//!   of it is enqueued.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::stripe_channels::{
    change_key, eventbridge_envelope, snapshot_event, stripe_python_fetch, stripe_python_parse,
    thin_event, EventsApi, FullEvent,
};
use crate::helpers::{
    cli_json_lines, ledger_counts, now, pipeline_drained, post_signed, run_cli, sqs_turn,
    stripe_python_sign, test_settings, Backend, RunningBinary, SqsLoad, TestApp, TestDb, TestQueue,
    Transport,
};

const SECRET: &str = "whsec_channels_test";
const API_KEY: &str = "rk_test_channels";

/// The events at the file sink, parsed.
fn sink_events(sink: &Path) -> Vec<Value> {
    std::fs::read_to_string(sink)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each sink line is JSON"))
        .collect()
}

fn base_env(db: &TestDb, sink: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        ("DEDUP_CONSUMER__HANDLER", "ledger".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
    ]
}

/// Posts `body` under `header`; the ingress must answer 200.
async fn post_with(bin: &RunningBinary, body: &[u8], header: &str) {
    let response = reqwest::Client::new()
        .post(bin.url("/webhooks/stripe"))
        .header("Stripe-Signature", header)
        .body(body.to_vec())
        .send()
        .await
        .expect("ingress answers");
    assert_eq!(
        response.status(),
        200,
        "{}",
        response.text().await.unwrap_or_default()
    );
}

/// Waits until `key` is recorded as processed under source `stripe`.
async fn wait_processed(bin: &RunningBinary, db: &TestDb, key: &str) {
    let store = db.store().await;
    bin.wait_for(&format!("{key} processed"), Duration::from_secs(30), || {
        let (store, key) = (store.clone(), key.to_owned());
        async move {
            let done = store.dedup().processed_among("stripe", &[key]).await.ok()?;
            (!done.is_empty()).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_event_and_its_snapshot_event_are_one_change_on_sqlite() {
    thin_and_snapshot_are_handled_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_event_and_its_snapshot_event_are_one_change_on_postgres() {
    thin_and_snapshot_are_handled_once(Backend::Postgres).await;
}

/// Nine changes, each sent as a snapshot event and as a thin event naming it: three with the
/// snapshot first, three with the thin event first (each handled before the other is posted),
/// three with three copies of each posted at once. Plus a v2 thin event, which has no snapshot.
async fn thin_and_snapshot_are_handled_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let bin = RunningBinary::start(&base_env(&db, &sink), work.path());

    let t = now();
    let mut pairs = Vec::new(); // (snapshot, thin), each as (payload, header)
    let mut items = Vec::new();
    for i in 0..9 {
        let snapshot = serde_json::to_vec(&snapshot_event(
            &format!("evt_snap_{i}"),
            &format!("in_{i}"),
        ))
        .unwrap();
        let thin = thin_event(
            &format!("evt_thin_{i}"),
            &format!("in_{i}"),
            Some(&format!("evt_snap_{i}")),
            None,
        );
        items.push((snapshot, t));
        items.push((serde_json::to_vec(&thin).unwrap(), t));
    }
    let v2_only = serde_json::to_vec(&thin_event("evt_thin_v2", "in_v2", None, None)).unwrap();
    items.push((v2_only.clone(), t));
    let headers = stripe_python_sign(SECRET, &items);
    let signed: Vec<(Vec<u8>, String)> =
        items.iter().map(|(p, _)| p.clone()).zip(headers).collect();
    // The official library reads each as what it is, under the same signature.
    let parsed = stripe_python_parse(SECRET, &signed);
    for (i, name) in parsed.iter().enumerate() {
        let expected = if i % 2 == 0 && i < 18 {
            "Event"
        } else {
            "V1InvoicePaidEventNotification"
        };
        assert_eq!(name, expected, "item {i}");
    }
    for pair in signed[..18].chunks(2) {
        pairs.push((pair[0].clone(), pair[1].clone()));
    }

    for (i, (snapshot, thin)) in pairs.iter().enumerate() {
        let key = format!("evt_snap_{i}");
        match i % 3 {
            0 => {
                post_with(&bin, &snapshot.0, &snapshot.1).await;
                wait_processed(&bin, &db, &key).await;
                post_with(&bin, &thin.0, &thin.1).await;
            }
            1 => {
                post_with(&bin, &thin.0, &thin.1).await;
                wait_processed(&bin, &db, &key).await;
                post_with(&bin, &snapshot.0, &snapshot.1).await;
            }
            _ => {
                let posts = (0..3)
                    .flat_map(|_| [snapshot, thin])
                    .map(|(p, h)| post_with(&bin, p, h));
                futures::future::join_all(posts).await;
            }
        }
    }
    let (v2_body, v2_header) = &signed[18];
    post_with(&bin, v2_body, v2_header).await;
    // And a pair made by `dedup-worker sign --thin-event` from a snapshot event, as the local
    // test in the book's "Stripe's channels" (docs/src/stripe/channels.md) does: the official library verifies both, and they are one change too.
    let snapshot_path = work.path().join("snapshot.json");
    let thin_path = work.path().join("thin.json");
    std::fs::write(
        &snapshot_path,
        serde_json::to_vec(&snapshot_event("evt_cli", "in_cli")).unwrap(),
    )
    .unwrap();
    let (snapshot_file, thin_file) = (snapshot_path.to_str().unwrap(), thin_path.to_str().unwrap());
    let thin_header = run_cli(
        &[],
        &[
            "sign",
            "--secret",
            SECRET,
            "--thin-event",
            thin_file,
            snapshot_file,
        ],
    );
    let snapshot_header = run_cli(&[], &["sign", "--secret", SECRET, snapshot_file]);
    let cli_pair = [
        (
            std::fs::read(&thin_path).unwrap(),
            thin_header.trim().to_owned(),
        ),
        (
            std::fs::read(&snapshot_path).unwrap(),
            snapshot_header.trim().to_owned(),
        ),
    ];
    assert_eq!(
        stripe_python_parse(SECRET, &cli_pair),
        ["V1InvoicePaidEventNotification", "Event"]
    );
    futures::future::join_all(cli_pair.iter().map(|(p, h)| post_with(&bin, p, h))).await;

    let mut keys: HashSet<String> = (0..9).map(|i| format!("evt_snap_{i}")).collect();
    keys.insert("evt_thin_v2".into());
    keys.insert("evt_cli".into());
    let store = db.store().await;
    bin.wait_for(
        "every change at the sink, the queue drained",
        Duration::from_secs(60),
        || {
            let (store, sink, keys) = (store.clone(), sink.clone(), keys.clone());
            async move {
                let at_sink: HashSet<String> = sink_events(&sink).iter().map(change_key).collect();
                (at_sink == keys && pipeline_drained(&store, "dedup.events").await).then_some(())
            }
        },
    )
    .await;
    let at_sink = sink_events(&sink);
    assert_eq!(
        at_sink.len(),
        keys.len(),
        "one delivery per change: {at_sink:#?}"
    );
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.len(), keys.len(), "{ledger:?}");
    assert!(
        ledger.values().all(|&n| n == 1),
        "one handling per change: {ledger:?}"
    );
    // The thin event handled first is what the sink got for the thin-first changes.
    for i in (1..9).step_by(3) {
        let delivered = at_sink
            .iter()
            .find(|e| change_key(e) == format!("evt_snap_{i}"))
            .unwrap();
        assert_eq!(delivered["id"], format!("evt_thin_{i}"));
    }
    drop(bin);
    db.remove().await;
}

/// The binary with fetching on, against the stand-in.
fn fetching_binary(db: &TestDb, sink: &Path, api: &EventsApi, work: &Path) -> RunningBinary {
    let mut env = base_env(db, sink);
    env.extend([
        ("DEDUP_STRIPE__FETCH_THIN_EVENTS", "true".to_owned()),
        ("STRIPE_API_KEY", API_KEY.to_owned()),
        ("STRIPE_API_BASE", api.url()),
        ("DEDUP_STRIPE__API_TIMEOUT", "1000ms".to_owned()),
        ("DEDUP_CONSUMER__MAX_ATTEMPTS", "3".to_owned()),
        ("DEDUP_CONSUMER__RETRY_BASE", "100ms".to_owned()),
        ("DEDUP_CONSUMER__RETRY_MAX", "500ms".to_owned()),
    ]);
    RunningBinary::start(&env, work)
}

/// The full event the stand-in serves for a thin event: the notification's fields and the
/// change's data, as `GET /v2/core/events/{id}` returns it.
fn full_event(thin: &Value) -> Value {
    let mut full = thin.clone();
    full["data"] = json!({"object": {"id": thin["related_object"]["id"], "object": "invoice", "status": "paid"}});
    full["changes"] = json!({"before": {"status": "open"}, "after": {"status": "paid"}});
    full
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fetching_the_handler_gets_the_full_event_and_a_failing_api_retries() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let api = EventsApi::start(API_KEY).await;

    // Thin events: answered at once (one of a connected account), after three 500s (both tries
    // of a step, then the first of the next), after two hangs past the 1 s request timeout,
    // never (503... dead-lettered after max_attempts); and one whose snapshot event was handled
    // before, which is a duplicate and never fetched.
    let thin = |id: &str, snapshot: &str, context: Option<&str>| {
        thin_event(id, &format!("in_{id}"), Some(snapshot), context)
    };
    let cases = [
        (
            "evt_thin_ok",
            thin("evt_thin_ok", "evt_snap_ok", None),
            0,
            0,
        ),
        (
            "evt_thin_ctx",
            thin(
                "evt_thin_ctx",
                "evt_snap_ctx",
                Some("acct_1Nv0FGQ9RKHgCVdK"),
            ),
            0,
            0,
        ),
        (
            "evt_thin_5xx",
            thin("evt_thin_5xx", "evt_snap_5xx", None),
            3,
            0,
        ),
        (
            "evt_thin_hang",
            thin("evt_thin_hang", "evt_snap_hang", None),
            0,
            2,
        ),
        (
            "evt_thin_down",
            thin("evt_thin_down", "evt_snap_down", None),
            usize::MAX,
            0,
        ),
    ];
    for (id, event, fail_first, hang_first) in &cases {
        api.insert(
            id,
            FullEvent {
                body: full_event(event),
                fail_first: *fail_first,
                hang_first: *hang_first,
            },
        );
    }
    // Hostile ones, each a dead letter: an answer over consumer.max_message_bytes (at once), an
    // id that would leave its path segment and a context that cannot be a header (never sent),
    // another event answered for this one (retried, then dead-lettered).
    let huge = thin("evt_thin_huge", "evt_snap_huge", None);
    let mut huge_body = full_event(&huge);
    huge_body["padding"] = json!("x".repeat(1_100_000));
    api.insert("evt_thin_huge", FullEvent::answering(huge_body));
    let escaping = thin("evt_thin_..%2F..%2Fv1%2Fcharges", "evt_snap_path", None);
    let bad_context = thin(
        "evt_thin_context",
        "evt_snap_context",
        Some("acct_1\r\nX-Injected: 1"),
    );
    let wrong = thin("evt_thin_wrong", "evt_snap_wrong", None);
    api.insert(
        "evt_thin_wrong",
        FullEvent::answering(full_event(&thin("evt_thin_other", "evt_snap_other", None))),
    );
    let hostile = [huge, escaping, bad_context, wrong];
    let dup = thin("evt_thin_dup", "evt_snap_dup", None);
    api.insert("evt_thin_dup", FullEvent::answering(full_event(&dup)));
    // The official library, fetching a thin event of its own, shows how Stripe is asked.
    let lib = thin(
        "evt_thin_lib",
        "evt_snap_lib",
        Some("acct_1Nv0FGQ9RKHgCVdK"),
    );
    api.insert("evt_thin_lib", FullEvent::answering(full_event(&lib)));
    let lib_body = serde_json::to_vec(&lib).unwrap();
    let lib_header =
        dedup_worker_core::signature::stripe::signature_header(SECRET, now(), &lib_body);
    stripe_python_fetch(&api.url(), API_KEY, SECRET, &lib_body, &lib_header);

    let bin = fetching_binary(&db, &sink, &api, work.path());
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    let snapshot_dup = serde_json::to_vec(&snapshot_event("evt_snap_dup", "in_dup")).unwrap();
    assert_eq!(
        post_signed(&client, &url, SECRET, snapshot_dup)
            .await
            .unwrap()
            .status(),
        200
    );
    wait_processed(&bin, &db, "evt_snap_dup").await;
    for event in cases.iter().map(|c| &c.1).chain(&hostile).chain([&dup]) {
        let body = serde_json::to_vec(event).unwrap();
        assert_eq!(
            post_signed(&client, &url, SECRET, body)
                .await
                .unwrap()
                .status(),
            200
        );
    }

    let store = db.store().await;
    let handled = [
        "evt_snap_ok",
        "evt_snap_ctx",
        "evt_snap_5xx",
        "evt_snap_hang",
        "evt_snap_dup",
    ];
    bin.wait_for(
        "the fetched events at the sink, the other dead-lettered",
        Duration::from_secs(60),
        || {
            let (store, sink) = (store.clone(), sink.clone());
            async move {
                let at_sink: HashSet<String> = sink_events(&sink).iter().map(change_key).collect();
                let dead = store.dead_letters().list(10).await.ok()?.len();
                let done = handled.iter().all(|k| at_sink.contains(*k)) && dead == 5;
                (done && pipeline_drained(&store, "dedup.events").await).then_some(())
            }
        },
    )
    .await;

    // Each change once, and what the handler got is the full event, byte for byte as served.
    let at_sink = sink_events(&sink);
    assert_eq!(at_sink.len(), handled.len(), "{at_sink:#?}");
    let by_key: HashMap<String, &Value> = at_sink.iter().map(|e| (change_key(e), e)).collect();
    for (id, event, ..) in &cases[..4] {
        let key = event["snapshot_event"].as_str().unwrap();
        assert_eq!(
            by_key[key],
            &full_event(event),
            "{id}: the sink has the fetched event"
        );
    }
    assert_eq!(
        by_key["evt_snap_dup"]["object"], "event",
        "the snapshot handled first stays"
    );
    assert!(ledger_counts(&store).await.values().all(|&n| n == 1));

    // Retried, not dropped: the failing ones were asked again; the duplicate never.
    assert!(api.asked("evt_thin_5xx") >= 4, "{:?}", api.requests());
    assert!(api.asked("evt_thin_hang") >= 3, "{:?}", api.requests());
    assert_eq!(
        api.asked("evt_thin_dup"),
        0,
        "a duplicate costs no API call"
    );
    assert_eq!(
        api.asked("evt_thin_down"),
        6,
        "two tries in each of three deliveries"
    );
    let env = [("DATABASE_URL", db.url.clone())];
    let dead: HashMap<String, Value> = cli_json_lines(&env, &["dlq", "list"])
        .into_iter()
        .map(|d| (d["event_id"].as_str().unwrap().to_owned(), d))
        .collect();
    let expected = [
        (
            "evt_snap_down",
            3,
            "fetching the full event of thin event evt_thin_down: Stripe answered 500",
        ),
        ("evt_snap_huge", 1, "larger than 1048576 bytes"),
        ("evt_snap_path", 1, "not a Stripe id"),
        ("evt_snap_context", 1, "not a Stripe account context"),
        ("evt_snap_wrong", 3, "the answer is not that event"),
    ];
    assert_eq!(dead.len(), expected.len(), "{dead:#?}");
    for (key, attempts, error) in expected {
        let letter = &dead[key];
        assert_eq!(letter["attempts"], attempts, "{letter}");
        assert!(
            letter["error"].as_str().unwrap().contains(error),
            "{letter}"
        );
    }
    assert!(api
        .requests()
        .iter()
        .all(|r| !r.id.contains("..") && r.id != "evt_thin_context"));

    // Asked as the official library asks: the same path, key and account context.
    let requests = api.requests();
    let library = requests
        .iter()
        .find(|r| r.id == "evt_thin_lib")
        .expect("the library's request");
    let ours = requests
        .iter()
        .find(|r| r.id == "evt_thin_ctx")
        .expect("our request");
    assert_eq!(ours.stripe_context, library.stripe_context);
    assert_eq!(ours.authorization, library.authorization);
    assert!(requests
        .iter()
        .filter(|r| r.id != "evt_thin_lib")
        .all(|r| r.stripe_version.is_some()
            && r.authorization.as_deref() == Some(&format!("Bearer {API_KEY}"))));
    assert!(requests
        .iter()
        .filter(|r| r.id == "evt_thin_ok")
        .all(|r| r.stripe_context.is_none()));
    drop(bin);
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventbridge_envelopes_on_sqs_are_handled_once_in_the_webhooks_key_space() {
    let _turn = sqs_turn(SqsLoad::Light).await;
    let db = TestDb::new(Backend::Sqlite).await;
    let queue = TestQueue::new(Transport::Sqs).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let mut env = base_env(&db, &sink);
    env.extend([
        ("DEDUP_TRANSPORT", "sqs".to_owned()),
        ("DEDUP_QUEUE", queue.name.clone()),
        ("DEDUP_CONSUMER__ENVELOPE", "eventbridge".to_owned()),
    ]);
    let bin = RunningBinary::start(&env, work.path());
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");

    // A webhook first: through the ingress, onto the same queue, as a plain event.
    let webhook = snapshot_event("evt_eb_webhook", "in_w");
    let body = serde_json::to_vec(&webhook).unwrap();
    assert_eq!(
        post_signed(&client, &url, SECRET, body)
            .await
            .unwrap()
            .status(),
        200
    );
    wait_processed(&bin, &db, "evt_eb_webhook").await;

    // Then what an EventBridge rule puts on the queue: the webhook's event again, four events
    // twice each (EventBridge delivers at least once, each time in a new envelope), a thin event
    // beside one of them, a thin event of a change of its own, and a foreign envelope.
    let events: Vec<Value> = (0..4)
        .map(|i| snapshot_event(&format!("evt_eb_{i}"), &format!("in_{i}")))
        .collect();
    let thin_of_0 = thin_event("evt_eb_thin_0", "in_0", Some("evt_eb_0"), None);
    let thin_new = thin_event("evt_eb_thin_9", "in_9", Some("evt_eb_9"), None);
    let mut bodies = vec![eventbridge_envelope(&webhook)];
    for event in &events {
        bodies.push(eventbridge_envelope(event));
        bodies.push(eventbridge_envelope(event));
    }
    bodies.push(eventbridge_envelope(&thin_of_0));
    bodies.push(eventbridge_envelope(&thin_new));
    let mut foreign = eventbridge_envelope(&snapshot_event("evt_eb_foreign", "in_f"));
    foreign["source"] = json!("aws.ec2");
    bodies.push(foreign);
    let sqs = queue.sqs_client().expect("an SQS queue");
    for body in &bodies {
        sqs.send_message()
            .queue_url(&queue.name)
            .message_body(body.to_string())
            .send()
            .await
            .expect("send to SQS");
    }
    // And the snapshot of the thin event's change, by webhook, after it.
    wait_processed(&bin, &db, "evt_eb_9").await;
    let snapshot_9 = serde_json::to_vec(&snapshot_event("evt_eb_9", "in_9")).unwrap();
    assert_eq!(
        post_signed(&client, &url, SECRET, snapshot_9)
            .await
            .unwrap()
            .status(),
        200
    );

    let store = db.store().await;
    let keys: HashSet<String> = [
        "evt_eb_webhook",
        "evt_eb_0",
        "evt_eb_1",
        "evt_eb_2",
        "evt_eb_3",
        "evt_eb_9",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    bin.wait_for(
        "every Stripe event at the sink, the queue drained",
        Duration::from_secs(60),
        || {
            let (store, sink, keys, queue) = (store.clone(), sink.clone(), keys.clone(), &queue);
            async move {
                let at_sink: HashSet<String> = sink_events(&sink).iter().map(change_key).collect();
                let dead = store.dead_letters().list(10).await.ok()?.len();
                (at_sink == keys && dead == 1 && queue.drained(&store).await).then_some(())
            }
        },
    )
    .await;
    let at_sink = sink_events(&sink);
    assert_eq!(
        at_sink.len(),
        keys.len(),
        "each Stripe event once: {at_sink:#?}"
    );
    for delivered in &at_sink {
        assert!(
            delivered.get("detail").is_none() && delivered.get("detail-type").is_none(),
            "an envelope reached the sink: {delivered}"
        );
    }
    let by_key: HashMap<String, &Value> = at_sink.iter().map(|e| (change_key(e), e)).collect();
    assert_eq!(
        by_key["evt_eb_1"], &events[1],
        "the sink has the Stripe event as sent"
    );
    assert_eq!(
        by_key["evt_eb_9"], &thin_new,
        "the thin event came first for its change"
    );
    let ledger = ledger_counts(&store).await;
    assert_eq!(ledger.len(), keys.len(), "{ledger:?}");
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
    let dead = store.dead_letters().list(10).await.unwrap();
    assert!(String::from_utf8_lossy(&dead[0].payload).contains("aws.ec2"));
    assert!(
        dead[0].error.contains("not a Stripe partner event source"),
        "{}",
        dead[0].error
    );
    drop(bin);
    queue.cleanup().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_event_whose_snapshot_event_cannot_be_a_key_is_400_and_not_enqueued() {
    let db = TestDb::new(Backend::Sqlite).await;
    let settings = test_settings(
        &db.url,
        &[
            ("roles.consumer", json!(false)),
            ("roles.relay", json!(false)),
            ("stripe.secrets", json!(SECRET)),
        ],
    );
    let app = TestApp::spawn(settings, Default::default()).await;
    let client = reqwest::Client::new();
    let url = app.url("/webhooks/stripe");
    let thin_with = |snapshot: Value| {
        let mut event = thin_event("evt_thin_h", "in_h", None, None);
        event["snapshot_event"] = snapshot;
        serde_json::to_vec(&event).unwrap()
    };
    for (snapshot, check) in [
        (json!("evt_\u{0}nul"), "payload_snapshot_event"),
        (json!("e".repeat(5000)), "payload_snapshot_event"),
        (json!(""), "payload_snapshot_event"),
        (json!(7), "payload_json"),
        (json!(["evt_A"]), "payload_json"),
    ] {
        let response = post_signed(&client, &url, SECRET, thin_with(snapshot.clone()))
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{snapshot}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["check"], check, "{snapshot}: {problem}");
    }
    // Beside them, a good one is keyed by its snapshot event; only it is on the queue.
    let response = post_signed(&client, &url, SECRET, thin_with(json!("evt_A")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await.unwrap()["id"], "evt_A");
    assert_eq!(app.store.queue().depth("dedup.events").await.unwrap(), 1);
    app.stop().await;
    db.remove().await;
}
