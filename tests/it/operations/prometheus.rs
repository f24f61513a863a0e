//! A real Prometheus (Debian's `prometheus` package; scripts/test.sh installs it) scraping the
//! running binary, with deploy/'s alert rules loaded and evaluated against what it scraped; and
//! `promtool` on the rules, their unit tests and the scrape configurations.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{deploy_dir, on_path, Pipeline};

/// Prometheus started by a test, killed (by its own pid) on drop.
struct PrometheusServer {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl PrometheusServer {
    /// `prometheus` with `config`, its storage and log in `dir`, on a free loopback port.
    fn start(config: &Path, dir: &Path) -> Self {
        assert!(
            on_path("prometheus"),
            "prometheus is not installed: apt-get install prometheus (scripts/test.sh does)"
        );
        // A port the kernel just handed out, released for Prometheus to bind.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start prometheus");
        PrometheusServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    /// Polls the instant query `query` until `done` accepts its result vector, or fails after
    /// `timeout` with what Prometheus logged.
    async fn query_until(
        &self,
        client: &reqwest::Client,
        query: &str,
        timeout: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let url = format!("{}/api/v1/query", self.url);
        let found = crate::helpers::poll_until(timeout, || {
            let (client, url, done) = (client, &url, &done);
            async move {
                let answer = client
                    .get(url)
                    .query(&[("query", query)])
                    .send()
                    .await
                    .ok()?;
                let body: Value = answer.json().await.ok()?;
                let result = body["data"]["result"].as_array()?.clone();
                done(&result).then_some(result)
            }
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "{query}: not as expected within {timeout:?}; prometheus logged:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of a vector sample (`[timestamp, "value"]`).
fn sample_value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_binary_and_evaluates_the_alert_rules() {
    let pipeline = Pipeline::with_traffic().await;
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("prometheus.yml");
    let rules = deploy_dir().join("prometheus/dedup-worker.rules.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: dedup-worker\n    static_configs:\n      - targets: ['{}']\n",
            rules.display(),
            pipeline.bin.addr
        ),
    )
    .unwrap();
    promtool(&["check", "config", &config.display().to_string()]);
    let prometheus = PrometheusServer::start(&config, work.path());
    let client = reqwest::Client::new();
    let wait = Duration::from_secs(60);

    let up = prometheus
        .query_until(&client, r#"up{job="dedup-worker"}"#, wait, |r| {
            r.len() == 1 && sample_value(&r[0]) == Some(1.0)
        })
        .await;
    assert_eq!(up[0]["metric"]["instance"], pipeline.bin.addr.to_string());
    // The webhook the pipeline handled, as Prometheus stored it: one observation, in buckets.
    let buckets = prometheus
        .query_until(
            &client,
            r#"dedup_ingress_request_seconds_bucket{route="/webhooks/stripe",status="2xx"}"#,
            wait,
            |r| !r.is_empty(),
        )
        .await;
    let inf = buckets
        .iter()
        .find(|s| s["metric"]["le"] == "+Inf")
        .expect("an +Inf bucket");
    assert_eq!(sample_value(inf), Some(1.0));
    assert!(buckets.len() > 10, "{} buckets", buckets.len());
    prometheus
        .query_until(&client, "dedup_relay_delivery_seconds_bucket", wait, |r| {
            !r.is_empty()
        })
        .await;
    prometheus
        .query_until(&client, "max(dedup_queue_depth)", wait, |r| {
            r.len() == 1 && sample_value(&r[0]) == Some(0.0)
        })
        .await;

    // Every rule evaluated against the real series without an error, and none fires on a
    // healthy pipeline.
    let rules_url = format!("{}/api/v1/rules", prometheus.url);
    let groups = crate::helpers::wait_for("every rule evaluated", wait, || {
        let (client, url) = (&client, &rules_url);
        async move {
            let body: Value = client.get(url).send().await.ok()?.json().await.ok()?;
            let rules: Vec<Value> = body["data"]["groups"]
                .as_array()?
                .iter()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            (!rules.is_empty() && rules.iter().all(|r| r["health"] != "unknown")).then_some(rules)
        }
    })
    .await;
    for rule in &groups {
        assert_eq!(rule["health"], "ok", "{rule}");
        assert_eq!(rule["state"], "inactive", "{rule}");
    }
    assert_eq!(groups.len(), 14, "the rules of dedup-worker.rules.yml");
    drop(prometheus);
    pipeline.stop().await;
}

/// Runs `promtool ARGS` in deploy/prometheus; it must succeed.
fn promtool(args: &[&str]) -> Output {
    assert!(
        on_path("promtool"),
        "promtool is not installed: apt-get install prometheus (scripts/test.sh does)"
    );
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy_dir().join("prometheus"))
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn promtool_accepts_the_rules_their_unit_tests_and_the_scrape_config() {
    let checked = promtool(&["check", "rules", "dedup-worker.rules.yml"]);
    let text = String::from_utf8_lossy(&checked.stdout);
    assert!(text.contains("SUCCESS: 14 rules found"), "{text}");
    // Each alert fires on the series it is for and stays quiet on a healthy fleet.
    promtool(&["test", "rules", "dedup-worker.rules.test.yml"]);
    promtool(&["check", "config", "prometheus.yml"]);
}
