//! The Grafana dashboard's and the alert rules' queries name only metrics that `/metrics`
//! exposes: every `expr` is read with the PromQL tokenizer ([`super::promql`]) and each metric
//! name it reads is looked up among the samples of the binary after traffic (the pipeline's
//! metrics) or of the checkout example after a payment and its replay (the Idempotency-Key
//! layer's, `idempotency_*`). A `_bucket`, `_sum` or `_count` name must also belong to a family
//! that is exposed as a histogram.

use serde_json::Value;

use super::promql::metric_names;
use super::{checkout_exposition, deploy_dir, yaml_documents, Exposition, Pipeline};

/// Series Prometheus makes itself at each scrape, not the target.
const MADE_BY_PROMETHEUS: &[&str] = &["up"];

/// Every `expr` string anywhere in `value` (Grafana keeps them in each panel's targets).
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// What is wrong with the names `expr` reads, given the two expositions: empty if each is
/// exposed (and each histogram series belongs to a histogram).
fn problems(expr: &str, pipeline: &Exposition, layer: &Exposition) -> Vec<String> {
    let names = match metric_names(expr) {
        Ok(names) if names.is_empty() => return vec![format!("{expr:?} reads no metric")],
        Ok(names) => names,
        Err(error) => return vec![error],
    };
    let mut wrong = Vec::new();
    for name in names {
        if MADE_BY_PROMETHEUS.contains(&name.as_str()) {
            continue;
        }
        let exposition = if name.starts_with("idempotency_") {
            layer
        } else {
            pipeline
        };
        if !exposition.sample_names().contains(&name) {
            wrong.push(format!("{name} (in {expr:?}) is not exposed"));
            continue;
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(family) = name.strip_suffix(suffix) {
                let kind = exposition.types.get(family).map(String::as_str);
                if exposition.types.contains_key(family) && kind != Some("histogram") {
                    wrong.push(format!("{name}: {family} is a {kind:?}, not a histogram"));
                }
                if suffix == "_bucket" && kind != Some("histogram") {
                    wrong.push(format!("{name}: no histogram {family}"));
                }
            }
        }
    }
    wrong
}

fn dashboard_exprs() -> Vec<String> {
    let path = deploy_dir().join("grafana/dedup-worker.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("JSON");
    let mut out = Vec::new();
    exprs(&dashboard["panels"], &mut out);
    out
}

fn rule_exprs() -> Vec<String> {
    let path = deploy_dir().join("prometheus/dedup-worker.rules.yml");
    let mut out = Vec::new();
    for document in yaml_documents(&path) {
        exprs(&document["groups"], &mut out);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_name_only_exposed_metrics() {
    let pipeline = Pipeline::with_traffic().await;
    let client = reqwest::Client::new();
    let exposed = super::scrape(&client, &pipeline.bin.url("/metrics")).await;
    let layer = checkout_exposition().await;

    let dashboard = dashboard_exprs();
    let rules = rule_exprs();
    assert!(
        dashboard.len() >= 20,
        "{} dashboard queries",
        dashboard.len()
    );
    assert_eq!(rules.len(), 14, "one expr per rule");
    let wrong: Vec<String> = dashboard
        .iter()
        .chain(&rules)
        .flat_map(|expr| problems(expr, &exposed, &layer))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Every latency histogram has its p99 on the dashboard.
    let read: Vec<String> = dashboard
        .iter()
        .flat_map(|e| metric_names(e).unwrap_or_default())
        .collect();
    for (name, _) in dedup_worker_core::telemetry::HISTOGRAM_BUCKETS {
        if name.ends_with("_seconds") {
            assert!(
                read.contains(&format!("{name}_bucket")),
                "{name} not on the dashboard"
            );
        }
    }

    // The check itself catches what it is for: a misspelled name, a histogram read without its
    // suffix, a bucket of something that is no histogram, an expression of no metric.
    for bad in [
        "rate(dedup_ingress_request_second_count[5m])",
        "max(dedup_consumer_batch_seconds)",
        "sum(dedup_webhooks_total_bucket)",
        "max(idempotency_request_seconds_bucket_typo)",
        "vector(1)",
    ] {
        assert!(!problems(bad, &exposed, &layer).is_empty(), "{bad} passed");
    }
    pipeline.stop().await;
}
