//! Issue 39, through the binary: each sink in a lane of its own. A receiver's `Retry-After`
//! holds its lane about that long and spends no attempt; a circuit opens after the configured
//! failures, keeps the rows' attempts while open, shows in `outbox sinks` and `/metrics`, and
//! closes by itself once the receiver answers; a route sends only matching events to its sink;
//! a black-holed sink holds back nothing of another; `outbox pause` / `resume` hold and
//! release a lane by hand.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;

use crate::helpers::app::{cli_json_lines, RunningBinary};
use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::{post_signed, serve, stripe_event, wait_for, Backend, Receiver, TestDb};

const SECRET: &str = "whsec_test_secret";

/// Arrivals at a scripted receiver: when, and under which key.
type Arrivals = Arc<Mutex<Vec<(Instant, String)>>>;

/// A receiver that answers each key's first delivery 429 with `Retry-After: 3`, then 200.
async fn asking_for_three_seconds() -> (String, Arrivals) {
    recording_receiver(|first| match first {
        true => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3")]).into_response(),
        false => StatusCode::OK.into_response(),
    })
    .await
}

/// A receiver recording each delivery's arrival and key, answering as `answer` says for a
/// key's first delivery (`true`) or a later one.
async fn recording_receiver(answer: fn(bool) -> axum::response::Response) -> (String, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let router = Router::new()
        .route(
            "/hook",
            post(
                move |State(arrivals): State<Arrivals>, headers: HeaderMap| async move {
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let mut seen = arrivals.lock().unwrap();
                    let first = !seen.iter().any(|(_, k)| *k == key);
                    seen.push((Instant::now(), key));
                    answer(first)
                },
            ),
        )
        .with_state(arrivals.clone());
    let addr = serve(router).await;
    (format!("http://{addr}/hook"), arrivals)
}

fn binary(db: &TestDb, work: &tempfile::TempDir, env: &[(&str, String)]) -> RunningBinary {
    let mut all = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
        ("DEDUP_ADMIN__LISTEN", "127.0.0.1:0".to_owned()),
        ("DEDUP_ADMIN__TOKEN", crate::console::TOKEN.to_owned()),
    ];
    all.extend(env.iter().cloned());
    RunningBinary::start(&all, work.path())
}

async fn send(binary: &RunningBinary, ids: &[String], event_type: &str) {
    let client = reqwest::Client::new();
    for id in ids {
        let body = stripe_event(id, event_type);
        let r = post_signed(&client, &binary.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i:03}")).collect()
}

/// `(status, attempts)` of every outbox row of `lane`.
async fn lane_rows(db: &TestDb, lane: &str) -> Vec<(String, i64)> {
    let store = db.store().await;
    const SQL: &str = "SELECT status, CAST(attempts AS BIGINT) FROM outbox WHERE sink = $1";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(SQL)
            .bind(lane)
            .fetch_all(pool)
            .await
            .unwrap(),
        (_, Some(pool)) => sqlx::query_as(SQL)
            .bind(lane)
            .fetch_all(pool)
            .await
            .unwrap(),
        _ => unreachable!(),
    }
}

async fn retry_after_holds_the_lane(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let (url, arrivals) = asking_for_three_seconds().await;
    let other = Receiver::start().await;
    let app = binary(
        &db,
        &work,
        &[
            ("DEDUP_SINK", url),
            ("DEDUP_OUTBOX__SINKS__OTHER__URL", other.url()),
            (
                "DEDUP_OUTBOX__ROUTES",
                r#"[{sinks=["default", "other"]}]"#.to_owned(),
            ),
        ],
    );
    send(&app, &ids("evt_held", 1), "payout.paid").await;
    let key = "evt_held_000".to_owned();
    wait_for("the retried delivery", Duration::from_secs(20), || {
        let arrivals = arrivals.clone();
        async move { (arrivals.lock().unwrap().len() >= 2).then_some(()) }
    })
    .await;
    let seen = arrivals.lock().unwrap().clone();
    assert!(seen.iter().all(|(_, k)| *k == key), "{seen:?}");
    let waited = seen[1].0 - seen[0].0;
    assert!(
        waited >= Duration::from_millis(2_900) && waited < Duration::from_secs(8),
        "the second delivery came {waited:?} after the 429 asking for 3 s"
    );
    // The other lane was not held: its delivery came long before the retry.
    assert_eq!(other.keys(), vec![key]);
    let rows = wait_for("the row marked", Duration::from_secs(10), || {
        let db = &db;
        async move {
            let rows = lane_rows(db, "default").await;
            rows.iter().all(|(s, _)| s == "dispatched").then_some(rows)
        }
    })
    .await;
    // The 429 spent no attempt: the one that counts is the delivery.
    assert_eq!(rows, vec![("dispatched".to_owned(), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_3_holds_that_sink_about_3_s_and_spends_no_attempt_on_postgres() {
    retry_after_holds_the_lane(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_3_holds_that_sink_about_3_s_and_spends_no_attempt_on_sqlite() {
    retry_after_holds_the_lane(Backend::Sqlite).await;
}

/// Every delivery fails until `healthy` is set.
type Switch = Arc<std::sync::atomic::AtomicBool>;

async fn failing_until_switched() -> (String, Switch, Arc<Mutex<usize>>) {
    let healthy: Switch = Arc::default();
    let calls = Arc::new(Mutex::new(0usize));
    let state = (healthy.clone(), calls.clone());
    let router = Router::new()
        .route(
            "/hook",
            post(
                |State((healthy, calls)): State<(Switch, Arc<Mutex<usize>>)>| async move {
                    *calls.lock().unwrap() += 1;
                    if healthy.load(std::sync::atomic::Ordering::SeqCst) {
                        StatusCode::OK
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                },
            ),
        )
        .with_state(state);
    let addr = serve(router).await;
    (format!("http://{addr}/hook"), healthy, calls)
}

async fn circuit_opens_and_closes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let work = tempfile::tempdir().unwrap();
    let (url, healthy, calls) = failing_until_switched().await;
    let env = [
        ("DEDUP_SINK", url),
        ("DEDUP_OUTBOX__BREAKER__FAILURES", "3".to_owned()),
        ("DEDUP_OUTBOX__BREAKER__PROBE_AFTER", "1s".to_owned()),
        ("DEDUP_OUTBOX__BREAKER__PROBE_MAX", "2s".to_owned()),
        ("DEDUP_OUTBOX__RETRY_BASE", "50ms".to_owned()),
        ("DEDUP_OUTBOX__RETRY_MAX", "100ms".to_owned()),
        ("DEDUP_OUTBOX__MAX_ATTEMPTS", "1000".to_owned()),
        // One delivery at a time: the third failure stops the batch before a fourth is sent.
        ("DEDUP_OUTBOX__CONCURRENCY", "1".to_owned()),
    ];
    let app = binary(&db, &work, &env);
    let cli_env = [("DATABASE_URL", db.url.clone())];
    send(&app, &ids("evt_down", 5), "payout.paid").await;
    let open = wait_for("the circuit to open", Duration::from_secs(20), || {
        let env = &cli_env;
        async move {
            let lanes = cli_json_lines(env, &["outbox", "sinks"]);
            lanes
                .into_iter()
                .find(|l| l["sink"] == "default" && l["circuit"] != "closed")
        }
    })
    .await;
    assert!(
        open["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("3 consecutive failures")),
        "{open}"
    );
    let client = reqwest::Client::new();
    wait_for("/metrics to show it open", Duration::from_secs(20), || {
        let (client, url) = (&client, app.url("/metrics"));
        async move {
            let text = client.get(url).send().await.ok()?.text().await.ok()?;
            let open = text.lines().any(|l| {
                l.starts_with("dedup_outbox_sink_circuit{")
                    && l.contains("lane=\"default\"")
                    && !l.contains("state=\"closed\"")
                    && l.ends_with(" 1")
            });
            open.then_some(())
        }
    })
    .await;
    let admin = app.admin_addr.expect("the console's address");
    wait_for(
        "the console's overview to show it open",
        Duration::from_secs(10),
        || {
            let client = &client;
            async move {
                let page = client
                    .get(format!("http://{admin}/"))
                    .bearer_auth(crate::console::TOKEN)
                    .send()
                    .await
                    .ok()?;
                let html = page.text().await.ok()?;
                let row = html
                    .split("<tr>")
                    .find(|r| r.contains("<td>default</td>"))?;
                (html.contains("id=\"sinks\"")
                    && (row.contains(">open<") || row.contains(">half-open<")))
                .then_some(())
            }
        },
    )
    .await;
    // While open, probes come one at a time and give their attempt back: the rows keep the
    // three attempts that opened it, however many probes went.
    let spent: i64 = lane_rows(&db, "default").await.iter().map(|r| r.1).sum();
    let probes_before = *calls.lock().unwrap();
    wait_for("two probes", Duration::from_secs(20), || {
        let calls = calls.clone();
        async move { (*calls.lock().unwrap() >= probes_before + 2).then_some(()) }
    })
    .await;
    let still: i64 = lane_rows(&db, "default").await.iter().map(|r| r.1).sum();
    assert_eq!(spent, 3, "the failures that opened it");
    assert_eq!(still, spent, "probes spend no attempt");

    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_for("every row delivered", Duration::from_secs(30), || {
        let db = &db;
        async move {
            let rows = lane_rows(db, "default").await;
            rows.iter().all(|(s, _)| s == "dispatched").then_some(())
        }
    })
    .await;
    let lanes = cli_json_lines(&cli_env, &["outbox", "sinks"]);
    let lane = lanes.iter().find(|l| l["sink"] == "default").unwrap();
    assert_eq!(lane["circuit"], "closed", "{lane}");
    assert!(app.stderr().contains("circuit opened"), "{}", app.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_opens_keeps_attempts_shows_open_and_closes_when_the_receiver_answers_on_postgres(
) {
    circuit_opens_and_closes(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_opens_keeps_attempts_shows_open_and_closes_when_the_receiver_answers_on_sqlite()
{
    circuit_opens_and_closes(Backend::Sqlite).await;
}

/// A route sends `invoice.*` to `invoices`; everything else goes to the default lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_delivers_only_matching_events() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let (invoices, rest) = (Receiver::start().await, Receiver::start().await);
    let app = binary(
        &db,
        &work,
        &[
            ("DEDUP_SINK", rest.url()),
            ("DEDUP_OUTBOX__SINKS__INVOICES__URL", invoices.url()),
            (
                "DEDUP_OUTBOX__ROUTES",
                r#"[{name="invoices", types=["invoice.*"], sinks=["invoices"]}]"#.to_owned(),
            ),
        ],
    );
    let (paid, charges) = (ids("evt_inv", 3), ids("evt_charge", 2));
    send(&app, &paid, "invoice.paid").await;
    send(&app, &charges, "charge.succeeded").await;
    wait_for("both sinks", Duration::from_secs(20), || {
        let (invoices, rest) = (&invoices, &rest);
        async move { (invoices.keys().len() >= 3 && rest.keys().len() >= 2).then_some(()) }
    })
    .await;
    let mut got = invoices.keys();
    got.sort();
    assert_eq!(got, paid);
    let mut got = rest.keys();
    got.sort();
    assert_eq!(got, charges);
}

/// Lane `dead` is black-holed (connections taken, never answered, for longer than the test):
/// lane `live` delivers every event meanwhile. Then `outbox pause live` holds it and `resume`
/// releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_sink_does_not_hold_back_another_and_pause_resume_hold_and_release_it() {
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let (live, dead) = (Receiver::start().await, Receiver::start().await);
    let proxy = FaultProxy::start(&dead.addr.to_string()).await;
    proxy.set(Mode::BlackHole).await;
    let app = binary(
        &db,
        &work,
        &[
            ("DEDUP_OUTBOX__SINKS__LIVE__URL", live.url()),
            (
                "DEDUP_OUTBOX__SINKS__DEAD__URL",
                format!("http://127.0.0.1:{}/hook", proxy.port),
            ),
            ("DEDUP_OUTBOX__HTTP_TIMEOUT", "60s".to_owned()),
            (
                "DEDUP_OUTBOX__ROUTES",
                r#"[{sinks=["live", "dead"]}]"#.to_owned(),
            ),
        ],
    );
    let first = ids("evt_iso", 20);
    send(&app, &first, "payout.paid").await;
    wait_for(
        "every event at the live sink",
        Duration::from_secs(20),
        || {
            let live = &live;
            async move { (live.keys().len() >= 20).then_some(()) }
        },
    )
    .await;
    assert!(dead.keys().is_empty(), "nothing passed the black hole");

    // The CLI reads the service's configuration, which names the sinks.
    let cli_env = [
        ("DATABASE_URL", db.url.clone()),
        ("DEDUP_OUTBOX__SINKS__LIVE__URL", live.url()),
    ];
    let paused = cli_json_lines(&cli_env, &["outbox", "pause", "live"]);
    assert_eq!(paused[0]["changed"], true, "{paused:?}");
    let later = ids("evt_paused", 3);
    send(&app, &later, "payout.paid").await;
    wait_for("the paused lane's rows", Duration::from_secs(20), || {
        let db = &db;
        async move { (lane_rows(db, "live").await.len() == 23).then_some(()) }
    })
    .await;
    // A few poll intervals (50 ms) and a state read (at most 1 s) pass: nothing goes.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(live.keys().len(), 20, "a paused lane delivers nothing");
    let resumed = cli_json_lines(&cli_env, &["outbox", "resume", "live"]);
    assert_eq!(resumed[0]["changed"], true, "{resumed:?}");
    wait_for("the held events", Duration::from_secs(20), || {
        let live = &live;
        async move { (live.keys().len() >= 23).then_some(()) }
    })
    .await;
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
        .args(["outbox", "pause", "nosuch"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(text.contains("no sink named \"nosuch\""), "{text}");
}

/// A receiver recording when each delivery arrived, answering 200.
async fn timing_receiver() -> (String, Arrivals) {
    recording_receiver(|_| StatusCode::OK.into_response()).await
}

/// Two processes relay one sink of `rate_per_sec = 5`, `burst = 1`, both delivering (batches
/// of two): the receiver sees 5 a second between them, not 5 each. Paced per process, a second
/// would hold about 10. A named sink's settings, and `[outbox]`'s for the default lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_sinks_rate_holds_for_two_relay_processes_together() {
    let (url, arrivals) = timing_receiver().await;
    let env = [
        ("DEDUP_OUTBOX__SINKS__PACED__URL", url),
        ("DEDUP_OUTBOX__SINKS__PACED__RATE_PER_SEC", "5".to_owned()),
        ("DEDUP_OUTBOX__SINKS__PACED__BURST", "1".to_owned()),
        ("DEDUP_OUTBOX__SINKS__PACED__BATCH_SIZE", "2".to_owned()),
        ("DEDUP_OUTBOX__ROUTES", r#"[{sinks=["paced"]}]"#.to_owned()),
    ];
    rate_of_two_processes(&env, &arrivals).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_lanes_rate_holds_for_two_relay_processes_together() {
    let (url, arrivals) = timing_receiver().await;
    let env = [
        ("DEDUP_SINK", url),
        ("DEDUP_OUTBOX__RATE_PER_SEC", "5".to_owned()),
        ("DEDUP_OUTBOX__BURST", "1".to_owned()),
        ("DEDUP_OUTBOX__BATCH_SIZE", "2".to_owned()),
    ];
    rate_of_two_processes(&env, &arrivals).await;
}

async fn rate_of_two_processes(env: &[(&str, String)], arrivals: &Arrivals) {
    let db = TestDb::new(Backend::Postgres).await;
    let (work_a, work_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (binary(&db, &work_a, env), binary(&db, &work_b, env));
    const EVENTS: usize = 30;
    send(&a, &ids("evt_paced", EVENTS), "payout.paid").await;
    wait_for(
        "every event delivered",
        Duration::from_secs(60),
        || async move { (arrivals.lock().unwrap().len() >= EVENTS).then_some(()) },
    )
    .await;
    let client = reqwest::Client::new();
    for (name, app) in [("a", &a), ("b", &b)] {
        let text = client
            .get(app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dispatched = crate::helpers::counter_value(&text, "dedup_outbox_dispatched_total");
        assert!(
            dispatched > 0,
            "process {name} delivered nothing: the test shows nothing"
        );
    }
    let times: Vec<Instant> = arrivals.lock().unwrap().iter().map(|(t, _)| *t).collect();
    let busiest = times
        .iter()
        .map(|start| {
            times
                .iter()
                .filter(|t| **t >= *start && **t - *start < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    // 1 at once, then 5 a second: 6 in a second, one more for the network's jitter.
    assert!(busiest <= 7, "{busiest} deliveries within one second");
}
