//! Operating it the way SREs operate services (issue 15): what `/metrics` of the real binary
//! exposes after traffic ([`metrics`]); a real Prometheus scraping it, `promtool` on the alert
//! rules and their unit tests ([`prometheus`]); the dashboard's and the rules' queries naming
//! only metrics that are exposed ([`dashboard`]); the compose file and the Kubernetes manifests
//! checked by the tools this machine has ([`deploy`]); JSON log lines, colours, and start-up
//! errors ([`logs`]); one trace per event from webhook to sink ([`traces`]).
//!
//! Here: the binary with traffic through ingress, consumer and relay, the checkout example
//! (the Idempotency-Key layer) with one payment, the repository's `deploy/` folder, and YAML
//! read through Python's PyYAML (installed by scripts/test.sh), so the suite needs no YAML
//! crate.

mod dashboard;
mod deploy;
mod exposition;
mod logs;
mod metrics;
mod prometheus;
mod promql;
mod traces;

use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency_key_checkout::{CheckoutApp, CheckoutConfig, Limits};
use tokio_util::sync::CancellationToken;

use crate::helpers::{file_sink_ids, post_signed, stripe_event, Backend, RunningBinary, TestDb};
pub use exposition::Exposition;

const SECRET: &str = "whsec_operations";

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// `/metrics` of `url`'s server, parsed.
pub async fn scrape(client: &reqwest::Client, url: &str) -> Exposition {
    let response = client.get(url).send().await.expect("/metrics answers");
    assert_eq!(response.status(), 200, "/metrics");
    Exposition::parse(&response.text().await.expect("/metrics body"))
}

/// The binary on PostgreSQL and the database queue, forwarding to a file sink, after one signed
/// webhook went through ingress, the consumer and the relay: by then every histogram of the
/// pipeline has an observation and every gauge a sample.
pub struct Pipeline {
    pub bin: RunningBinary,
    pub db: TestDb,
    _work: tempfile::TempDir,
}

impl Pipeline {
    pub async fn with_traffic() -> Self {
        let db = TestDb::new(Backend::Postgres).await;
        let work = tempfile::tempdir().expect("tempdir");
        let sink = work.path().join("events.jsonl");
        let bin = RunningBinary::start(
            &[
                ("DATABASE_URL", db.url.clone()),
                ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
                ("DEDUP_SINK", format!("file:{}", sink.display())),
            ],
            work.path(),
        );
        let client = reqwest::Client::new();
        let body = stripe_event("evt_operations_1", "invoice.paid");
        let answer = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .expect("ingress answers");
        assert_eq!(answer.status(), 200);
        bin.wait_for("the event at the sink", Duration::from_secs(30), || {
            let ids = file_sink_ids(&sink);
            async move { (ids == ["evt_operations_1"]).then_some(()) }
        })
        .await;
        let url = bin.url("/metrics");
        bin.wait_for(
            "every histogram and gauge in /metrics",
            Duration::from_secs(30),
            || {
                let (client, url) = (&client, &url);
                async move {
                    let e = scrape(client, url).await;
                    [
                        "dedup_ingress_request_seconds_count",
                        "dedup_consumer_batch_seconds_count",
                        "dedup_relay_delivery_seconds_count",
                        "dedup_queue_depth",
                        "dedup_outbox_failed",
                    ]
                    .iter()
                    .all(|name| e.has(name))
                    .then_some(())
                }
            },
        )
        .await;
        Pipeline {
            bin,
            db,
            _work: work,
        }
    }

    pub async fn stop(self) {
        let Pipeline { mut bin, db, _work } = self;
        bin.kill();
        db.remove().await;
    }
}

/// The checkout example (the Idempotency-Key layer in a service of its own) in this process,
/// after one payment and its replay; returns what its `/metrics` serves of the layer. The
/// recorder is this test process's, shared with the tests beside it, so only `idempotency_*`
/// names are taken from it: the pipeline's come from the binary. Without Redis: the layer's
/// metric names are the same with it, and this suite keeps no Redis keys to clean up.
pub async fn checkout_exposition() -> Exposition {
    let db = TestDb::new(Backend::Postgres).await;
    let app = CheckoutApp::build(CheckoutConfig {
        database_url: db.url.clone(),
        redis_url: None,
        redis_prefix: String::new(),
        listen: "127.0.0.1:0".into(),
        provider_listen: "127.0.0.1:0".into(),
        limits: Limits::default(),
        metrics: dedup_worker_core::telemetry::metrics_handle(),
    })
    .await
    .expect("checkout app");
    let addr = app.addr().expect("addr");
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move { app.run(token).await.expect("checkout runs") });
    let client = reqwest::Client::new();
    let key = uuid::Uuid::new_v4().to_string();
    for expected in ["false", "true"] {
        let answer = client
            .post(format!("http://{addr}/v1/payments"))
            .bearer_auth("acct_operations")
            .header("idempotency-key", &key)
            .json(&serde_json::json!({"amount": 4200, "currency": "eur"}))
            .send()
            .await
            .expect("checkout answers");
        assert_eq!(answer.status(), 201);
        let replayed = answer.headers().contains_key("idempotent-replayed");
        assert_eq!(replayed.to_string(), expected, "second answer replayed");
    }
    let mut exposition = scrape(&client, &format!("http://{addr}/metrics")).await;
    exposition
        .samples
        .retain(|s| s.name.starts_with("idempotency_"));
    exposition
        .types
        .retain(|name, _| name.starts_with("idempotency_"));
    shutdown.cancel();
    let _ = task.await;
    db.remove().await;
    exposition
}

/// Every YAML document of `path`, as JSON (through Python's PyYAML, `safe_load_all`).
pub fn yaml_documents(path: &Path) -> Vec<serde_json::Value> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))",
        ])
        .arg(path)
        .output()
        .expect("python3 runs (scripts/test.sh installs PyYAML)");
    assert!(
        out.status.success(),
        "{} is not YAML: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from python")
}

/// Whether `program` can be run (found on `PATH`).
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
