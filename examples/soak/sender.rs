//! The sender: Stripe, as far as the ingress can tell. Each planned post leaves at its time,
//! signed afresh at each attempt with the run's `whsec_` secret, to its ingress (whatever port
//! that process listens on now). A 2xx ends it (the event is accepted); a 5xx, a timeout or a
//! refused connection is retried with backoff for as long as the run and its drain last, as
//! Stripe retries for days; a 4xx is a defect (our events are valid) and ends it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use dedup_worker_core::signature::stripe::signature_header;
use rand::Rng;
use serde_json::json;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Lane, LAYOUT};
use crate::history::{History, Outcome, Record};
use crate::plan::{Plan, Post, Shape};

/// Requests in flight at once (each waits at most [`REQUEST_TIMEOUT`]). Held per attempt, not
/// across a post's backoff: as at Stripe, events that keep failing do not hold back new ones.
const IN_FLIGHT: usize = 256;
/// Requests in flight at once to the SQS lane's ingress processes, within [`IN_FLIGHT`]: a
/// webhook sender limits its concurrency per endpoint, and the emulator's capacity is a few
/// calls a second. Without this cap the first long soak's SQS lane never recovered from its
/// first outage: every unanswered post was retried within 20 s, each 503'd SendMessage could
/// still land (a copy), the emulator's queue grew, its calls slowed, and more posts went
/// unanswered (RELIABILITY.md, "What the soak and the property test found").
const SQS_LANE_IN_FLIGHT: usize = 4;
/// Stripe waits this long for an answer before counting a delivery failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Retries back off from this…
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// …to at most this. Stripe's own retries are minutes to hours apart; a cap this short keeps
/// the drain short, and long enough that a sender retrying every unanswered post does not
/// become the load that keeps a slow dependency slow (each 503'd SendMessage may still land:
/// a copy).
const MAX_BACKOFF: Duration = Duration::from_secs(20);

/// The sender's limits on requests in flight: all of them, and those to the SQS lane.
struct Permits {
    all: Semaphore,
    sqs_lane: Semaphore,
}

impl Permits {
    /// A permit for one attempt to ingress process `ingress` (held until its answer).
    async fn acquire(&self, ingress: usize) -> (Option<SemaphorePermit<'_>>, SemaphorePermit<'_>) {
        let lane = if LAYOUT[ingress].lane == Lane::Sqs {
            Some(
                self.sqs_lane
                    .acquire()
                    .await
                    .expect("the semaphore is never closed"),
            )
        } else {
            None
        };
        let all = self
            .all
            .acquire()
            .await
            .expect("the semaphore is never closed");
        (lane, all)
    }
}

pub struct Sender {
    pub plan: Arc<Plan>,
    pub history: History,
    pub ingress: Arc<RwLock<Vec<Option<SocketAddr>>>>,
    pub secret: String,
    /// Unix seconds of the run's start: `created` is this plus the event's offset.
    pub run_start_unix: i64,
    /// Keys answered 2xx so far (the drain waits for these at the sink).
    pub accepted: Arc<Mutex<HashSet<String>>>,
}

/// What the sender did.
#[derive(Debug, Default, Clone, Copy)]
pub struct SenderTotals {
    /// Planned posts started before the run's end.
    pub posts_started: usize,
    /// Planned posts not started: the run ended first (the sender fell behind).
    pub posts_not_started: usize,
    /// Posts still unanswered with a 2xx when the drain gave up on them.
    pub posts_abandoned: usize,
}

impl Sender {
    /// Sends the plan's posts until `stop_new` (the end of the run), then keeps retrying the
    /// started ones until each is answered 2xx or `give_up` (the drain's deadline).
    pub async fn run(
        self,
        stop_new: CancellationToken,
        give_up: CancellationToken,
    ) -> SenderTotals {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let this = Arc::new(self);
        let permits = Arc::new(Permits {
            all: Semaphore::new(IN_FLIGHT),
            sqs_lane: Semaphore::new(SQS_LANE_IN_FLIGHT),
        });
        let started_at = Instant::now();
        let mut tasks = JoinSet::new();
        let mut totals = SenderTotals::default();
        for (index, post) in this.plan.posts.iter().enumerate() {
            let due = started_at + Duration::from_millis(post.at_ms);
            tokio::select! {
                _ = stop_new.cancelled() => {
                    totals.posts_not_started = this.plan.posts.len() - index;
                    break;
                }
                _ = tokio::time::sleep_until(due) => {}
            }
            totals.posts_started += 1;
            let (this, client, give_up) = (this.clone(), client.clone(), give_up.clone());
            let permits = permits.clone();
            tasks.spawn(async move { this.deliver(&client, &permits, index, &give_up).await });
            // Reap finished ones as we go, so the set stays small in a long run.
            while let Some(done) = tasks.try_join_next() {
                totals.posts_abandoned += usize::from(!done.unwrap_or(false));
            }
        }
        while let Some(done) = tasks.join_next().await {
            totals.posts_abandoned += usize::from(!done.unwrap_or(false));
        }
        totals
    }

    /// Delivers post `index` until it is answered (true) or `give_up` (false).
    async fn deliver(
        &self,
        client: &reqwest::Client,
        permits: &Permits,
        index: usize,
        give_up: &CancellationToken,
    ) -> bool {
        let post = &self.plan.posts[index];
        let key = self.plan.events[post.event].key.clone();
        let body = event_body(&self.plan, self.run_start_unix, post);
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            let address = self.ingress.read().expect("ingress lock")[post.ingress];
            if let Some(address) = address {
                let permit = tokio::select! {
                    _ = give_up.cancelled() => return false,
                    permit = permits.acquire(post.ingress) => permit,
                };
                attempt += 1;
                self.history.record(Record::Invoke {
                    t: self.history.now(),
                    key: key.clone(),
                    post: index,
                    copy: post.copy,
                    shape: post.shape,
                    ingress: post.ingress,
                    attempt,
                    at_once: post.at_once,
                });
                let header = signature_header(&self.secret, chrono::Utc::now().timestamp(), &body);
                let sent = client
                    .post(format!("http://{address}/webhooks/stripe"))
                    .header("Stripe-Signature", header)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let (outcome, status, error) = classify(sent).await;
                drop(permit);
                self.history.record(Record::Complete {
                    t: self.history.now(),
                    key: key.clone(),
                    post: index,
                    attempt,
                    outcome,
                    status,
                    error,
                });
                match (outcome, status) {
                    (Outcome::Ok, _) => {
                        self.accepted.lock().expect("accepted lock").insert(key);
                        return true;
                    }
                    // Refused for what it is: retrying sends the same bytes.
                    (Outcome::Fail, Some(_)) => return true,
                    _ => {}
                }
            }
            let jittered = backoff.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
            tokio::select! {
                _ = give_up.cancelled() => return false,
                _ = tokio::time::sleep(jittered) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The bytes of a post: the snapshot event, or the thin event Stripe sends beside it.
pub fn event_body(plan: &Plan, run_start_unix: i64, post: &Post) -> Vec<u8> {
    let event = &plan.events[post.event];
    let object = match event.event_type {
        "invoice.paid" => "invoice",
        "customer.subscription.updated" => "subscription",
        "charge.succeeded" => "charge",
        _ => "payment_intent",
    };
    let snapshot = serde_json::to_vec_pretty(&json!({
        "id": event.key,
        "object": "event",
        "api_version": "2024-06-20",
        "created": run_start_unix + event.created_offset_secs,
        "type": event.event_type,
        "livemode": false,
        "data": {"object": {
            "id": format!("{object}_{}", post.event),
            "object": object,
            "customer": crate::workload::customer(&event.key),
        }},
    }))
    .expect("JSON serialises");
    match post.shape {
        Shape::Snapshot => snapshot,
        Shape::Thin => dedup_worker_core::stripe::thin_event_beside(&snapshot)
            .expect("a snapshot event has a thin event"),
    }
}

/// Jepsen's reading of an answer: 2xx ok; a 4xx or a refused connection certainly not taken;
/// anything else (5xx, a timeout, a connection lost mid-request) unknown.
async fn classify(
    sent: reqwest::Result<reqwest::Response>,
) -> (Outcome, Option<u16>, Option<String>) {
    match sent {
        Ok(response) => {
            let status = response.status();
            if status.is_success() {
                (Outcome::Ok, Some(status.as_u16()), None)
            } else if status.is_client_error() {
                let text = response.text().await.unwrap_or_default();
                (Outcome::Fail, Some(status.as_u16()), Some(text))
            } else {
                (Outcome::Info, Some(status.as_u16()), None)
            }
        }
        Err(error) if error.is_connect() => (Outcome::Fail, None, Some(error.to_string())),
        Err(error) => (Outcome::Info, None, Some(error.to_string())),
    }
}
