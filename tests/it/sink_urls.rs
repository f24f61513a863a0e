//! Issue 26, item 5: a webhook URL's secret (Slack's `/services/T…/B…/XXXX`, a `?token=` query)
//! never leaves the process. The binary's HTTP sink points at such a URL through a fault proxy
//! that first refuses every connection (reqwest's error text used to carry the whole URL), then
//! passes to a receiver that answers 500; every row fails. Neither token is in the binary's log
//! lines, a row's `last_error`, `outbox failed` or `events show` (text or JSON), while the errors
//! still say what happened. A sink spec the configuration refuses is not echoed whole either.
//! Nor is a URL whose address is the secret (a generated host label, as Pipedream's, and a UUID
//! as the first path segment, as webhook.site's).

use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;

use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::{
    dedup_command, post_signed, run_cli, serve, stripe_event, Backend, RunningBinary, TestDb,
};

const SECRET: &str = "whsec_sink_urls_test_0123456789";
const PATH_TOKEN: &str = "PathT0kenXk2Yq9";
const QUERY_TOKEN: &str = "QueryT0kenZp7Lm4";

/// `last_error` of every outbox row, by event id, once each of `ids` has failed for good.
async fn failed_rows(
    bin: &RunningBinary,
    pool: &sqlx::PgPool,
    ids: &[String],
) -> Vec<(String, String)> {
    bin.wait_for(
        "every row marked failed",
        Duration::from_secs(60),
        || async {
            let rows: Vec<(String, String, Option<String>)> =
                sqlx::query_as("SELECT event_id, status, last_error FROM outbox")
                    .fetch_all(pool)
                    .await
                    .ok()?;
            let failed: Vec<(String, String)> = rows
                .into_iter()
                .filter(|(id, status, _)| status == "failed" && ids.contains(id))
                .map(|(id, _, error)| (id, error.unwrap_or_default()))
                .collect();
            (failed.len() == ids.len()).then_some(failed)
        },
    )
    .await
}

async fn accept(bin: &RunningBinary, ids: &[String]) {
    let client = reqwest::Client::new();
    for id in ids {
        let body = stripe_event(id, "invoice.paid");
        let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

fn assert_no_token(what: &str, text: &str) {
    for token in [PATH_TOKEN, QUERY_TOKEN] {
        assert!(!text.contains(token), "{what} shows {token}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_in_a_sink_url_reach_no_log_row_or_report() {
    let receiver =
        serve(Router::new().fallback(|| async { StatusCode::INTERNAL_SERVER_ERROR })).await;
    let proxy = FaultProxy::start(&receiver.to_string()).await;
    proxy.set(Mode::Refuse).await;
    let sink = format!(
        "http://127.0.0.1:{}/services/T000/B000/{PATH_TOKEN}?token={QUERY_TOKEN}",
        proxy.port
    );
    let shown = format!("http://127.0.0.1:{}/services/…?…", proxy.port);
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", sink),
            // Every line the binary logs, not only warnings.
            ("RUST_LOG", "info".into()),
            ("DEDUP_OUTBOX__MAX_ATTEMPTS", "2".into()),
            ("DEDUP_OUTBOX__RETRY_BASE", "20ms".into()),
            ("DEDUP_OUTBOX__RETRY_MAX", "50ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".into()),
        ],
        work.path(),
    );
    let store = db.store().await;
    let pool = store.postgres_pool().expect("a PostgreSQL test");

    let refused: Vec<String> = (0..3).map(|i| format!("evt_refused_{i}")).collect();
    accept(&bin, &refused).await;
    for (id, error) in failed_rows(&bin, pool, &refused).await {
        assert_no_token(&format!("{id}'s last_error"), &error);
        // Still says where, as the rule shows the URL, and why: the proxy resets the
        // connection as soon as it is taken.
        assert!(error.contains(&shown), "{id}: {error}");
        assert!(
            error.contains("reset") || error.contains("closed"),
            "{id}: {error}"
        );
    }

    proxy.set(Mode::Pass).await;
    let answered_500: Vec<String> = (0..3).map(|i| format!("evt_answered_500_{i}")).collect();
    accept(&bin, &answered_500).await;
    for (id, error) in failed_rows(&bin, pool, &answered_500).await {
        assert_no_token(&format!("{id}'s last_error"), &error);
        assert!(error.contains("500"), "{id}: {error}");
    }

    let env = [("DATABASE_URL", db.url.clone())];
    let failed = run_cli(&env, &["outbox", "failed"]);
    assert_eq!(failed.lines().count(), 6, "{failed}");
    assert_no_token("outbox failed", &failed);
    for id in [&refused[0], &answered_500[0]] {
        let text = run_cli(&env, &["events", "show", id]);
        assert!(text.contains("failed"), "{text}");
        assert_no_token("events show", &text);
        assert_no_token(
            "events show --json",
            &run_cli(&env, &["events", "show", id, "--json"]),
        );
    }
    let logged = bin.stderr();
    assert!(logged.contains("delivery failed"), "{logged}");
    assert_no_token("the binary's log", &logged);
    drop(bin);

    // A sink spec the configuration refuses (a mistyped scheme) is named, not echoed whole.
    let out = dedup_command(&[
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        (
            "DEDUP_SINK",
            format!("htps://hooks.slack.com/services/T000/B000/{PATH_TOKEN}?token={QUERY_TOKEN}"),
        ),
    ])
    .arg("serve")
    .output()
    .expect("run");
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && refusal.contains("outbox.sink"),
        "{refusal}"
    );
    assert!(refusal.contains("hooks.slack.com/services/…"), "{refusal}");
    assert_no_token("the refusal", &refusal);
}

/// A host label and a first path segment that are the URL's secret (Pipedream's
/// `eo….m.pipedream.net`, webhook.site's `/<UUID>`): each shown as `***`, nowhere whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_is_the_sink_urls_host_label_or_first_segment_is_masked() {
    const HOST_TOKEN: &str = "eo7k2m9x4qz1";
    const UUID_TOKEN: &str = "0b6e5c1a-3f2d-4e8b-9a7c-1d2e3f4a5b6c";
    let receiver =
        serve(Router::new().fallback(|| async { StatusCode::INTERNAL_SERVER_ERROR })).await;
    // `*.localhost` names this machine where the resolver says so (then the receiver answers
    // 500) and nothing elsewhere (then the lookup fails): every row fails either way.
    let sink = format!(
        "http://{HOST_TOKEN}.localhost:{}/{UUID_TOKEN}",
        receiver.port()
    );
    let shown = format!("http://***.localhost:{}/***", receiver.port());
    let db = TestDb::new(Backend::Postgres).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_SINK", sink),
            ("RUST_LOG", "info".into()),
            ("DEDUP_OUTBOX__MAX_ATTEMPTS", "2".into()),
            ("DEDUP_OUTBOX__RETRY_BASE", "20ms".into()),
            ("DEDUP_OUTBOX__RETRY_MAX", "50ms".into()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".into()),
        ],
        work.path(),
    );
    let store = db.store().await;
    let pool = store.postgres_pool().expect("a PostgreSQL test");
    let no_token = |what: &str, text: &str| {
        for token in [HOST_TOKEN, UUID_TOKEN] {
            assert!(!text.contains(token), "{what} shows {token}: {text}");
        }
    };

    let ids: Vec<String> = (0..2).map(|i| format!("evt_address_{i}")).collect();
    accept(&bin, &ids).await;
    for (id, error) in failed_rows(&bin, pool, &ids).await {
        no_token(&format!("{id}'s last_error"), &error);
        assert!(error.contains(&shown), "{id}: {error}");
    }
    let env = [("DATABASE_URL", db.url.clone())];
    no_token("outbox failed", &run_cli(&env, &["outbox", "failed"]));
    let text = run_cli(&env, &["events", "show", &ids[0]]);
    assert!(text.contains("failed"), "{text}");
    no_token("events show", &text);
    no_token(
        "events show --json",
        &run_cli(&env, &["events", "show", &ids[0], "--json"]),
    );
    let logged = bin.stderr();
    assert!(logged.contains("delivery failed"), "{logged}");
    no_token("the binary's log", &logged);
    drop(bin);
    store.close().await;
}
