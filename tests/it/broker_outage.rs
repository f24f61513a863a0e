//! Broker faults under traffic, injected by a proxy between the binary and RabbitMQ or the SQS
//! emulator: connections cut three times while events are posted, then every connection
//! refused. While refused ingress answers 503 (never 2xx) and `/readyz` 503; the binary
//! reconnects by itself once the broker answers; every event that got a 200 reaches the sink
//! once. A broker that stops answering altogether is 503 within 5 s, and an SQS that stops
//! answering while a consumer holds a batch fails its step within its calls' timeouts.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use crate::helpers::fault_proxy::{FaultProxy, Mode};
use crate::helpers::receiver::{assert_acknowledged_at_the_sink_once, Others};
use crate::helpers::{
    amqp_url, file_sink_ids, post_signed, sqs_turn, stripe_event, without_colours, Backend,
    HeldDedupRow, RunningBinary, SqsLoad, TestDb, TestQueue, Transport,
};

const SECRET: &str = "whsec_broker_outage";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_cut_three_times_then_refused_recovers_by_itself_and_loses_nothing() {
    cut_then_refuse(Transport::Rabbitmq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_cut_three_times_then_refused_recovers_by_itself_and_loses_nothing() {
    // Heavy: eight senders' traffic for tens of seconds.
    let _emulator = sqs_turn(SqsLoad::Heavy).await;
    cut_then_refuse(Transport::Sqs).await;
}

/// Issue 9: every SQS call has a timeout. SQS stops answering (a black hole) while a consumer
/// holds a batch, just before it commits: its delete, and the give-back after it, give up
/// within their timeouts (two attempts of `transport.publish_timeout`), and the step fails
/// and says so while SQS is still silent, rather than wait for an answer that never comes.
/// Once SQS answers again the message comes back, is recognised as handled and deleted, and
/// every event is at the sink once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_black_holed_mid_batch_the_consumer_gives_up_on_its_calls_and_recovers() {
    const HELD: &str = "evt_committed_into_a_black_hole";
    let _emulator = sqs_turn(SqsLoad::Light).await;
    let db = TestDb::new(Backend::Postgres).await;
    let store = Arc::new(db.store().await);
    let queue = TestQueue::new(Transport::Sqs).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (moto)");
    let upstream = authority(&endpoint);
    let proxy = FaultProxy::start(&upstream).await;
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_TRANSPORT", "sqs".to_owned()),
        ("AWS_ENDPOINT_URL", proxy.rewrite(&endpoint, &upstream)),
        ("DEDUP_QUEUE", proxy.rewrite(&queue.name, &upstream)),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        // One worker: the step that fails is the one holding the batch.
        ("DEDUP_CONSUMER__WORKERS", "1".to_owned()),
        ("DEDUP_CONSUMER__LEASE", "2s".to_owned()),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".to_owned()),
    ];
    let bin = RunningBinary::start(&env, work.path());
    let client = reqwest::Client::new();
    // Posts an event until ingress accepts it (a loaded emulator may answer a publish late:
    // 503, and the sender retries).
    let accept = |id: &str| {
        let (client, url, bin) = (&client, bin.url("/webhooks/stripe"), &bin);
        let body = stripe_event(id, "charge.succeeded");
        async move {
            bin.wait_for(
                "ingress to accept an event",
                Duration::from_secs(30),
                || {
                    let request = post_signed(client, &url, SECRET, body.clone());
                    async move { (request.await.ok()?.status() == 200).then_some(()) }
                },
            )
            .await
        }
    };
    let mut ids: Vec<String> = (0..3).map(|i| format!("evt_before_{i}")).collect();
    for id in &ids {
        accept(id).await;
    }
    bin.wait_for(
        "the first events at the sink",
        Duration::from_secs(30),
        || {
            let done = file_sink_ids(&sink).len() == ids.len();
            async move { done.then_some(()) }
        },
    )
    .await;

    // The consumer receives the event and waits, mid-step, on its dedup row.
    let held = HeldDedupRow::hold(&db.url, "stripe", HELD).await;
    accept(HELD).await;
    ids.push(HELD.to_owned());
    bin.wait_for(
        "the consumer's step to wait on the held dedup row",
        Duration::from_secs(30),
        || async { (held.waiting().await == 1).then_some(()) },
    )
    .await;
    proxy.set(Mode::BlackHole).await;
    let logged_before = bin.stderr().len();
    held.release().await;
    // The step commits, then its delete goes into the black hole: two attempts of
    // `transport.publish_timeout` (3 s), then the give-back's (at most 5 s). Without a
    // timeout the delete would hang until the proxy resets the connection, i.e. until SQS
    // answers again.
    let failed_step = bin
        .wait_for(
            "the consumer step to give up on the silent SQS",
            Duration::from_secs(30),
            || {
                let logged = without_colours(bin.stderr().get(logged_before..).unwrap_or_default());
                let line = logged
                    .lines()
                    .find(|l| l.contains("consumer step failed") && l.contains("given_back=1"))
                    .map(str::to_owned);
                async move { line }
            },
        )
        .await;
    assert!(
        failed_step.to_lowercase().contains("timeout"),
        "the step failed on a timeout: {failed_step}"
    );
    // The batch committed, and the relay needs no SQS: the event reached the sink meanwhile.
    bin.wait_for(
        "the held event at the sink",
        Duration::from_secs(10),
        || {
            let there = file_sink_ids(&sink).contains(&HELD.to_owned());
            async move { there.then_some(()) }
        },
    )
    .await;

    proxy.set(Mode::Pass).await;
    let after: Vec<String> = (0..3).map(|i| format!("evt_after_{i}")).collect();
    for id in &after {
        accept(id).await;
    }
    ids.extend(after);
    bin.wait_for(
        "every event at the sink and the queue drained",
        Duration::from_secs(40),
        || {
            let (store, sink, queue) = (store.clone(), sink.clone(), &queue);
            let expected: HashSet<&String> = ids.iter().collect();
            async move {
                let delivered = file_sink_ids(&sink);
                let seen: HashSet<&String> = delivered.iter().collect();
                (seen == expected && queue.drained(&store).await).then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        file_sink_ids(&sink).len(),
        ids.len(),
        "each event at the sink once"
    );
    drop(bin);
    queue.cleanup().await;
}

/// `host:port` of a URL.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host_port = rest.split('/').next().unwrap_or(rest);
    host_port.rsplit('@').next().unwrap_or(host_port).to_owned()
}

async fn cut_then_refuse(transport: Transport) {
    let db = TestDb::new(Backend::Postgres).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let sink = work.path().join("events.jsonl");
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("DEDUP_TRANSPORT", queue.kind().to_owned()),
        ("DEDUP_SINK", format!("file:{}", sink.display())),
        ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".to_owned()),
        ("DEDUP_OUTBOX__POLL_INTERVAL", "100ms".to_owned()),
    ];
    let proxy = match queue.transport {
        Transport::Rabbitmq => {
            let amqp = amqp_url();
            let upstream = authority(&amqp);
            let proxy = FaultProxy::start(&upstream).await;
            env.push(("AMQP_URL", proxy.rewrite(&amqp, &upstream)));
            env.push(("DEDUP_QUEUE", queue.name.clone()));
            proxy
        }
        _ => {
            let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL (moto)");
            let upstream = authority(&endpoint);
            let proxy = FaultProxy::start(&upstream).await;
            env.push(("AWS_ENDPOINT_URL", proxy.rewrite(&endpoint, &upstream)));
            env.push(("DEDUP_QUEUE", proxy.rewrite(&queue.name, &upstream)));
            proxy
        }
    };
    let bin = RunningBinary::start(&env, work.path());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = bin.url("/webhooks/stripe");

    // Traffic: posts from 8 senders, each event until it got a 200 or the traffic stops.
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let traffic = {
        let (client, url, acked, stop) = (client.clone(), url.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            futures::stream::iter(0..)
                .take_until(stop.cancelled_owned())
                .map(|i| {
                    let (client, url, acked) = (client.clone(), url.clone(), acked.clone());
                    async move {
                        let id = format!("evt_traffic_{i}");
                        let body = stripe_event(&id, "charge.succeeded");
                        if let Ok(r) = post_signed(&client, &url, SECRET, body).await {
                            if r.status() == 200 {
                                acked.lock().unwrap().insert(id);
                            }
                        }
                    }
                })
                .buffer_unordered(8)
                .collect::<()>()
                .await
        })
    };
    let acked_count = || acked.lock().unwrap().len();
    for cut in 1..=3 {
        let before = acked_count();
        bin.wait_for("traffic to flow", Duration::from_secs(30), || {
            let n = acked_count();
            async move { (n >= before + 40).then_some(()) }
        })
        .await;
        proxy.cut_all().await;
        eprintln!("cut {cut} after {} acknowledged", acked_count());
    }
    let before = acked_count();
    bin.wait_for(
        "traffic to flow after the cuts",
        Duration::from_secs(30),
        || {
            let n = acked_count();
            async move { (n >= before + 40).then_some(()) }
        },
    )
    .await;
    stop.cancel();
    traffic.await.unwrap();

    // A broker that stops answering: 503 within 5 s, not a request held open.
    proxy.set(Mode::BlackHole).await;
    for i in 0..3 {
        let id = format!("evt_unanswered_{i}");
        let response = post_signed(&client, &url, SECRET, stripe_event(&id, "charge.succeeded"))
            .await
            .expect("answered within 5 s while the broker does not answer");
        assert_eq!(response.status(), 503, "{id}: the broker does not answer");
    }

    proxy.set(Mode::Refuse).await;
    for i in 0..5 {
        let id = format!("evt_refused_{i}");
        let response = post_signed(&client, &url, SECRET, stripe_event(&id, "charge.succeeded"))
            .await
            .expect("answered within 5 s while the broker refuses");
        assert_eq!(
            response.status(),
            503,
            "{id}: the broker refuses connections"
        );
        assert!(response.headers().contains_key("retry-after"));
    }
    assert_eq!(bin.readyz(&client).await, 503);

    proxy.set(Mode::Pass).await;
    bin.wait_for("ingress to accept again", Duration::from_secs(30), || {
        let (client, url) = (client.clone(), url.clone());
        let body = stripe_event("evt_refused_0", "charge.succeeded");
        async move {
            let response = post_signed(&client, &url, SECRET, body).await.ok()?;
            (response.status() == 200).then_some(())
        }
    })
    .await;
    acked.lock().unwrap().insert("evt_refused_0".to_owned());
    for i in 1..5 {
        let id = format!("evt_refused_{i}");
        let response = post_signed(&client, &url, SECRET, stripe_event(&id, "charge.succeeded"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{id}");
        acked.lock().unwrap().insert(id);
    }

    let acked: HashSet<String> = acked.lock().unwrap().clone();
    let store = db.store().await;
    // A post that timed out may have been accepted all the same: at the sink, not in `acked`.
    assert_acknowledged_at_the_sink_once(
        &bin,
        &sink,
        &acked,
        Others::Allowed,
        Duration::from_secs(90),
        || queue.drained(&store),
    )
    .await;
    drop(bin);
    queue.cleanup().await;
}
