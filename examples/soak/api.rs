//! The API workload (issue 36): clients of a synchronous API behind the Idempotency-Key layer
//! (`soak_service api`, two processes on the run's PostgreSQL through its fault proxy), in the
//! same run as the pipeline, under the same nemesis.
//!
//! Each planned call ([`ApiCall`]) is one operation of one tenant under one key: it is sent
//! until it is answered 2xx, retried with the same key and body after a timeout, a lost
//! connection, a 409 (the key is being worked on), a 429 or a 5xx, to either API process, as a
//! client following the IETF draft would. Some calls are also sent to the other process at the
//! same moment (two retries racing), some are sent again after their answer (a client that lost
//! the answer: a replay), and some reuse an earlier call's key under another tenant (keys are
//! scoped per tenant: that is a separate operation). Every attempt and its answer, with the
//! body of every 2xx, is a [`Record::Api`] in the history; [`crate::api_check`] judges them
//! against `soak_api_effects`.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::API_PROCESSES;
use crate::history::{History, Record};

/// Tenants the calls are spread over (the layer's accounts; each handler sets its own in the
/// session).
const TENANTS: u32 = 6;
/// Share of calls also sent to the other API process at the same moment.
const AT_ONCE: f64 = 0.10;
/// Share of calls sent again after their answer (one or two replays).
const RESENT: f64 = 0.30;
/// Share of calls that reuse an earlier call's key under another tenant.
const KEY_REUSED: f64 = 0.03;
/// A client's wait for an answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(3);
/// Requests in flight at once.
const IN_FLIGHT: usize = 64;

/// One operation a client makes.
#[derive(Debug, Clone, Serialize)]
pub struct ApiCall {
    pub at_ms: u64,
    pub tenant: String,
    pub key: String,
    pub amount: i64,
    /// Index into [`API_PROCESSES`] of its first attempt.
    pub process: usize,
    /// Also sent to the other process at the same moment.
    pub at_once: bool,
    /// Sent again this many ms after the first 2xx, each (replays).
    pub resends_ms: Vec<u64>,
}

/// The calls of a run: `rate` a second for `seconds`, from a stream of their own so the rest of
/// the plan does not move with them.
pub fn draw_calls(seed: u64, seconds: u64, rate: u32) -> Vec<ApiCall> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xa91_1de4_0001);
    let count = seconds * u64::from(rate);
    let mut calls: Vec<ApiCall> = Vec::with_capacity(count as usize);
    // Every (tenant, key) once: a second call in one scope with another amount is another
    // request under a used key, which the layer refuses (422) as it should.
    let mut scopes = std::collections::HashSet::new();
    for i in 0..count {
        let tenant = format!("tenant_{}", rng.gen_range(0..TENANTS));
        let reused = (!calls.is_empty() && rng.gen_bool(KEY_REUSED))
            .then(|| calls[rng.gen_range(0..calls.len())].key.clone())
            .filter(|key| !scopes.contains(&(tenant.clone(), key.clone())));
        let key = reused.unwrap_or_else(|| format!("soak-{seed:x}-{i:07}"));
        scopes.insert((tenant.clone(), key.clone()));
        let resends_ms = if rng.gen_bool(RESENT) {
            (0..rng.gen_range(1..=2))
                .map(|_| rng.gen_range(0..10_000))
                .collect()
        } else {
            Vec::new()
        };
        calls.push(ApiCall {
            at_ms: i * 1_000 / u64::from(rate.max(1)) + rng.gen_range(0..500),
            tenant,
            key,
            amount: rng.gen_range(100..100_000),
            process: rng.gen_range(0..API_PROCESSES.len()),
            at_once: rng.gen_bool(AT_ONCE),
            resends_ms,
        });
    }
    calls.sort_by_key(|c| c.at_ms);
    calls
}

/// What the client did.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct ApiTotals {
    pub calls_started: usize,
    pub calls_not_started: usize,
    /// Calls (or their replays) still not answered 2xx when the drain gave up on them.
    pub calls_abandoned: usize,
}

pub struct ApiClient {
    pub calls: Arc<Vec<ApiCall>>,
    pub history: History,
    /// Where each process listens now ([`crate::cluster::Cluster::addresses`]).
    pub addresses: Arc<RwLock<Vec<Option<SocketAddr>>>>,
}

impl ApiClient {
    /// Makes the planned calls until `stop_new`, then keeps retrying the started ones (and
    /// their replays) until each is answered or `give_up`.
    pub async fn run(self, stop_new: CancellationToken, give_up: CancellationToken) -> ApiTotals {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let this = Arc::new(self);
        let permits = Arc::new(Semaphore::new(IN_FLIGHT));
        let started_at = Instant::now();
        let mut tasks = JoinSet::new();
        let mut totals = ApiTotals::default();
        for index in 0..this.calls.len() {
            let due = started_at + Duration::from_millis(this.calls[index].at_ms);
            tokio::select! {
                _ = stop_new.cancelled() => {
                    totals.calls_not_started = this.calls.len() - index;
                    break;
                }
                _ = tokio::time::sleep_until(due) => {}
            }
            totals.calls_started += 1;
            let (this, http, permits, give_up) =
                (this.clone(), http.clone(), permits.clone(), give_up.clone());
            tasks.spawn(async move { this.call(&http, &permits, index, &give_up).await });
            while let Some(done) = tasks.try_join_next() {
                totals.calls_abandoned += usize::from(!done.unwrap_or(false));
            }
        }
        while let Some(done) = tasks.join_next().await {
            totals.calls_abandoned += usize::from(!done.unwrap_or(false));
        }
        totals
    }

    /// Call `index`: its first send (and its twin at once), then its replays; whether every
    /// one was answered.
    async fn call(
        &self,
        http: &reqwest::Client,
        permits: &Semaphore,
        index: usize,
        give_up: &CancellationToken,
    ) -> bool {
        let call = &self.calls[index];
        let send = |stream: u32, process: usize| {
            self.send_until_answered(http, permits, index, stream, process, give_up)
        };
        let answered = if call.at_once {
            let other = (call.process + 1) % API_PROCESSES.len();
            let (a, b) = tokio::join!(send(0, call.process), send(1, other));
            a && b
        } else {
            send(0, call.process).await
        };
        if !answered {
            return false;
        }
        let mut all = true;
        for (n, after) in call.resends_ms.iter().enumerate() {
            tokio::select! {
                _ = give_up.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_millis(*after)) => {}
            }
            let process = rand::thread_rng().gen_range(0..API_PROCESSES.len());
            all &= send(2 + n as u32, process).await;
        }
        all
    }

    /// One stream of attempts with the call's key and body, until a final answer (2xx, or a 4xx
    /// that is not worth retrying) or `give_up`; whether it was answered 2xx.
    async fn send_until_answered(
        &self,
        http: &reqwest::Client,
        permits: &Semaphore,
        index: usize,
        stream: u32,
        mut process: usize,
        give_up: &CancellationToken,
    ) -> bool {
        let call = &self.calls[index];
        let body = serde_json::json!({"amount": call.amount}).to_string();
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            let address = self.addresses.read().expect("addresses lock")[API_PROCESSES[process]];
            if let Some(address) = address {
                let _permit = tokio::select! {
                    _ = give_up.cancelled() => return false,
                    permit = permits.acquire() => permit.expect("never closed"),
                };
                attempt += 1;
                let sent_at = self.history.now();
                let answer = http
                    .post(format!("http://{address}/v1/charges"))
                    .header("Idempotency-Key", &call.key)
                    .header("x-tenant", &call.tenant)
                    .header("Content-Type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let answer = read_answer(answer).await;
                let done = answer
                    .status
                    .is_some_and(|s| (200..300).contains(&s) || !retryable(s));
                let ok = answer.status.is_some_and(|s| (200..300).contains(&s));
                self.history.record(Record::Api {
                    t_sent: sent_at,
                    t: self.history.now(),
                    tenant: call.tenant.clone(),
                    key: call.key.clone(),
                    call: index,
                    stream,
                    attempt,
                    process: API_PROCESSES[process],
                    status: answer.status,
                    replayed: answer.replayed,
                    body: answer.body,
                    error: answer.error,
                });
                if done {
                    return ok;
                }
            }
            // The next attempt may go to the other process (a client behind a load balancer).
            if rand::thread_rng().gen_bool(0.5) {
                process = (process + 1) % API_PROCESSES.len();
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

/// Statuses a client retries with the same key (as `idempotency_key`'s own client does): 5xx,
/// 408, 409 (the key is being worked on) and 429.
fn retryable(status: u16) -> bool {
    status >= 500 || matches!(status, 408 | 409 | 429)
}

struct Answer {
    status: Option<u16>,
    replayed: bool,
    /// The body as text (a 2xx's whole, for the byte comparison; others' first 300 bytes).
    body: Option<String>,
    error: Option<String>,
}

async fn read_answer(sent: reqwest::Result<reqwest::Response>) -> Answer {
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            return Answer {
                status: None,
                replayed: false,
                body: None,
                error: Some(error.to_string()),
            }
        }
    };
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes() == b"true");
    match response.bytes().await {
        Ok(bytes) => {
            let mut body = String::from_utf8_lossy(&bytes).into_owned();
            if !(200..300).contains(&status) {
                body = body.chars().take(300).collect();
            }
            Answer {
                status: Some(status),
                replayed,
                body: Some(body),
                error: None,
            }
        }
        // The answer was cut off: as good as none (the client retries).
        Err(error) => Answer {
            status: None,
            replayed,
            body: None,
            error: Some(format!("{status}, body cut off: {error}")),
        },
    }
}
