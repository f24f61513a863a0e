//! `/metrics` of the real binary: histograms with buckets (never summaries) for the ingress,
//! consumer and relay latencies after traffic, the Idempotency-Key layer's in a service that
//! mounts it, and gauges that follow the store and each transport's queue.

use std::time::Duration;

use dedup_worker_core::store::{NewDeadLetter, NewOutboxRow};

use super::{checkout_exposition, scrape, Exposition, Pipeline, SECRET};
use crate::helpers::{
    post_signed, sqs_turn, stripe_event, Backend, RunningBinary, SqsLoad, TestDb, TestQueue,
    Transport,
};

/// `name`'s buckets under `labels`: every bound of the process's configuration, cumulative,
/// ending with `+Inf` equal to `_count`.
fn assert_histogram(e: &Exposition, name: &str, labels: &[(&str, &str)], observations: f64) {
    assert_eq!(
        e.types.get(name).map(String::as_str),
        Some("histogram"),
        "{name}"
    );
    let (_, bounds) = dedup_worker_core::telemetry::HISTOGRAM_BUCKETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} has buckets of its own"));
    let bucket = format!("{name}_bucket");
    let mut previous = 0.0;
    for le in bounds.iter().map(|b| b.to_string()).chain(["+Inf".into()]) {
        let mut with_le = labels.to_vec();
        with_le.push(("le", &le));
        let count = e
            .value(&bucket, &with_le)
            .unwrap_or_else(|| panic!("no {bucket}{with_le:?}"));
        assert!(count >= previous, "{bucket} not cumulative at le={le}");
        previous = count;
    }
    assert_eq!(previous, observations, "{bucket}{labels:?} +Inf");
    assert_eq!(
        e.value(&format!("{name}_count"), labels),
        Some(observations),
        "{name}_count{labels:?}"
    );
    assert!(e
        .value(&format!("{name}_sum"), labels)
        .is_some_and(|s| s > 0.0));
}

fn assert_no_summaries(e: &Exposition) {
    let summaries: Vec<_> = e.types.iter().filter(|(_, t)| *t == "summary").collect();
    assert!(summaries.is_empty(), "summaries: {summaries:?}");
    assert!(
        !e.samples.iter().any(|s| s.labels.contains_key("quantile")),
        "a quantile series"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_traffic_metrics_expose_histogram_buckets_and_the_gauges() {
    let pipeline = Pipeline::with_traffic().await;
    let client = reqwest::Client::new();
    let e = scrape(&client, &pipeline.bin.url("/metrics")).await;
    assert_no_summaries(&e);
    let ingress = [("route", "/webhooks/stripe"), ("status", "2xx")];
    assert_histogram(&e, "dedup_ingress_request_seconds", &ingress, 1.0);
    // One event: at least one batch handled it (an empty receive records no batch).
    let batches = e
        .value("dedup_consumer_batch_seconds_count", &[])
        .unwrap_or(0.0);
    assert!(batches >= 1.0, "{batches} batches");
    assert_histogram(&e, "dedup_consumer_batch_seconds", &[], batches);
    let delivered = [("sink", "file"), ("outcome", "delivered")];
    assert_histogram(&e, "dedup_relay_delivery_seconds", &delivered, 1.0);
    assert_histogram(&e, "dedup_queue_group_commit_size", &[], 1.0);

    // The event went all the way: nothing waits, nothing failed.
    let queue = [("transport", "database"), ("queue", "dedup.events")];
    let bin = &pipeline.bin;
    let url = bin.url("/metrics");
    bin.wait_for(
        "an empty queue in the gauges",
        Duration::from_secs(30),
        || {
            let (client, url) = (&client, &url);
            async move {
                let e = scrape(client, url).await;
                (e.value("dedup_queue_depth", &queue) == Some(0.0)
                    && e.value("dedup_queue_oldest_message_age_seconds", &queue) == Some(0.0))
                .then_some(())
            }
        },
    )
    .await;
    for gauge in [
        "dedup_dead_letters",
        "dedup_outbox_pending",
        "dedup_outbox_failed",
    ] {
        assert_eq!(
            e.types.get(gauge).map(String::as_str),
            Some("gauge"),
            "{gauge}"
        );
        assert_eq!(e.value(gauge, &[]), Some(0.0), "{gauge}");
    }
    for source in ["transport", "store"] {
        let failures = e.value("dedup_gauge_sample_failures_total", &[("source", source)]);
        assert_eq!(failures, Some(0.0), "{source} sampling failures");
    }
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_layer_exposes_its_request_histogram() {
    let e = checkout_exposition().await;
    assert_no_summaries(&e);
    let name = "idempotency_request_seconds";
    assert_eq!(e.types.get(name).map(String::as_str), Some("histogram"));
    // The first payment executed, its retry was replayed; the provider stub's charge behind
    // it went through its own layer (the shared recorder may hold other tests' requests too).
    for replayed in ["false", "true"] {
        let labels = [("status", "2xx"), ("replayed", replayed)];
        let count = e.value(&format!("{name}_count"), &labels).unwrap_or(0.0);
        assert!(count >= 1.0, "{labels:?}: {count}");
        assert_histogram(&e, name, &labels, count);
    }
}

/// A binary running ingress alone (no consumer, no relay): the gauges are sampled in every
/// role, so the queue fills up before its eyes.
fn ingress_only(db: &TestDb, queue: &TestQueue, work: &tempfile::TempDir) -> RunningBinary {
    RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
            ("DEDUP_ROLES__CONSUMER", "false".into()),
            ("DEDUP_ROLES__RELAY", "false".into()),
        ],
        work.path(),
    )
}

async fn post_events(bin: &RunningBinary, n: usize) {
    let client = reqwest::Client::new();
    for i in 0..n {
        let body = stripe_event(&format!("evt_gauge_{i}"), "invoice.paid");
        let answer = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
            .await
            .expect("ingress answers");
        assert_eq!(answer.status(), 200);
    }
}

/// Polls `/metrics` until `done` holds; the exposition then.
async fn metrics_until(
    bin: &RunningBinary,
    what: &str,
    done: impl Fn(&Exposition) -> bool,
) -> Exposition {
    let client = reqwest::Client::new();
    let url = bin.url("/metrics");
    bin.wait_for(what, Duration::from_secs(30), || {
        let (client, url, done) = (&client, &url, &done);
        async move {
            let e = scrape(client, url).await;
            done(&e).then_some(e)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_follow_the_database_queue_dead_letters_and_the_outbox_on_both_stores() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await;
        let queue = TestQueue::new(Transport::Database).await;
        let work = tempfile::tempdir().unwrap();
        let mut bin = ingress_only(&db, &queue, &work);
        post_events(&bin, 3).await;
        let labels = [("transport", "database"), ("queue", queue.name.as_str())];
        metrics_until(&bin, "3 messages, the oldest older than 0 s", |e| {
            e.value("dedup_queue_depth", &labels) == Some(3.0)
                && e.value("dedup_queue_oldest_message_age_seconds", &labels)
                    .is_some_and(|age| age > 0.0)
        })
        .await;

        // A dead letter, a failed outbox row and a pending one, written through the store.
        let store = db.store().await;
        let mut tx = store.begin().await.unwrap();
        tx.insert_dead_letter(&NewDeadLetter {
            source: "stripe".into(),
            event_id: "evt_poison".into(),
            event_type: "invoice.paid".into(),
            queue: queue.name.clone(),
            payload: b"{}".to_vec(),
            error: "fatal".into(),
            attempts: 1,
        })
        .await
        .unwrap();
        let row = |id: &str| NewOutboxRow {
            source: "stripe".into(),
            event_id: id.into(),
            destination: None,
            idempotency_key: id.into(),
            event_type: "invoice.paid".into(),
            payload: b"{}".to_vec(),
            traceparent: None,
            ordering_key: None,
        };
        tx.insert_outbox(&[row("evt_out_1"), row("evt_out_2")])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let claimed = store
            .outbox()
            .claim_lane("default", 1, Duration::from_secs(10), false)
            .await
            .unwrap();
        let failed = store
            .outbox()
            .mark_delivery_failed(claimed[0].claim(), "refused", Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(failed, 1);
        metrics_until(
            &bin,
            "1 dead letter, 1 failed and 1 pending outbox row",
            |e| {
                e.value("dedup_dead_letters", &[]) == Some(1.0)
                    && e.value("dedup_outbox_failed", &[]) == Some(1.0)
                    && e.value("dedup_outbox_pending", &[]) == Some(1.0)
            },
        )
        .await;
        bin.kill();
        store.close().await;
        db.remove().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_and_sqs_export_their_depth_and_no_age() {
    for transport in [Transport::Rabbitmq, Transport::Sqs] {
        let _turn = match transport {
            Transport::Sqs => Some(sqs_turn(SqsLoad::Light).await),
            _ => None,
        };
        let db = TestDb::new(Backend::Sqlite).await;
        let queue = TestQueue::new(transport).await;
        let work = tempfile::tempdir().unwrap();
        let mut bin = ingress_only(&db, &queue, &work);
        post_events(&bin, 2).await;
        let labels = [("transport", queue.kind()), ("queue", queue.name.as_str())];
        let e = metrics_until(&bin, "a depth of 2", |e| {
            e.value("dedup_queue_depth", &labels) == Some(2.0)
        })
        .await;
        assert!(
            !e.has("dedup_queue_oldest_message_age_seconds"),
            "{}: no age is known, none is exported",
            queue.kind()
        );
        bin.kill();
        queue.cleanup().await;
        db.remove().await;
    }
}
