//! Shared test support: a fresh database per test (PostgreSQL database or SQLite file), the real
//! binary started on port 0, signing with our code and with the official `stripe` library,
//! an HTTP receiver that records sink deliveries, and polling with a deadline.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use dedup_worker::store::Store;

pub mod fault_proxy;

/// PostgreSQL server for tests (trust auth); a database per test is created on it.
pub fn pg_admin_url() -> String {
    std::env::var("DEDUP_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A database that exists for one test and is removed after it.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    /// PostgreSQL database name to drop.
    pg_name: Option<String>,
    /// Keeps the SQLite directory alive.
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => {
                let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
                let admin = sqlx::PgPool::connect(&pg_admin_url())
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&admin)
                    .await
                    .expect("create test database");
                admin.close().await;
                let base = pg_admin_url();
                let url = match base.rsplit_once('/') {
                    Some((prefix, _)) => format!("{prefix}/{name}"),
                    None => panic!("bad admin url"),
                };
                TestDb {
                    url,
                    backend,
                    pg_name: Some(name),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let url = format!("sqlite://{}", dir.path().join("dedup.db").display());
                TestDb {
                    url,
                    backend,
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// A migrated store on this database.
    pub async fn store(&self) -> Store {
        let store = Store::connect_url(&self.url, 8, Duration::from_secs(5))
            .await
            .expect("connect store");
        store.migrate().await.expect("migrate");
        store
    }

    pub fn dir(&self) -> Option<&Path> {
        self._dir.as_ref().map(|d| d.path())
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            // Drop runs outside any runtime guarantee: use a thread with its own runtime.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async move {
                    let admin = sqlx::PgPool::connect(&pg_admin_url()).await.ok()?;
                    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&admin)
                        .await
                        .ok()?;
                    admin.close().await;
                    Some(())
                })
            })
            .join();
        }
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` every 50 ms until it returns `Some`, or gives `None` after `timeout`.
async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Stripe-like event (pretty-printed, as Stripe sends it).
pub fn stripe_event(id: &str, event_type: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000,
        "type": event_type,
        "livemode": false,
        "data": { "object": { "id": format!("pi_{id}"), "object": "payment_intent", "amount": 1999, "currency": "usd" } }
    }))
    .expect("serialize")
}

/// Signs `body` with `secret` at the current time (our signer) and POSTs it to `url` as a
/// Stripe webhook.
pub async fn post_signed(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    body: Vec<u8>,
) -> reqwest::Result<reqwest::Response> {
    let header = dedup_worker::webhook::stripe::signature_header(secret, now(), &body);
    client
        .post(url)
        .header("Stripe-Signature", header)
        .body(body)
        .send()
        .await
}

/// Signs with the official stripe-python library, one process for many payloads.
/// Returns one header per payload, in order.
pub fn stripe_python_sign(secret: &str, items: &[(Vec<u8>, i64)]) -> Vec<String> {
    let script = r#"
import json, sys, stripe
req = json.load(sys.stdin)
out = []
for item in req["items"]:
    payload = bytes(item["payload"]).decode("utf-8")
    out.append(stripe.WebhookSignature.generate_signature_header(payload, req["secret"], timestamp=item["t"]))
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({
        "secret": secret,
        "items": items.iter().map(|(p, t)| serde_json::json!({"payload": p, "t": t})).collect::<Vec<_>>(),
    });
    let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (the test command installs the stripe package)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(request.to_string().as_bytes())
            .expect("write");
    }
    let output = child.wait_with_output().expect("python");
    assert!(
        output.status.success(),
        "stripe-python signing failed (pip install stripe): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("headers")
}

/// `logged` without the terminal colours the log puts around field names, so a test can match
/// `field=value`.
pub fn without_colours(logged: &str) -> String {
    let mut plain = String::with_capacity(logged.len());
    let mut chars = logged.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The binary with a clean environment: `PATH`, the brokers' and the AWS SDK's own settings
/// (scripts/test.sh sets them), then `env`. No developer configuration leaks in.
pub fn dedup_command(env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedup-worker"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for name in [
        "AMQP_URL",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        if let Ok(value) = std::env::var(name) {
            cmd.env(name, value);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a `dedup-worker` command (`dlq list`, `migrate`, …) with `env` and returns its stdout;
/// the command must succeed.
pub fn run_cli(env: &[(&str, String)], args: &[&str]) -> String {
    let out = dedup_command(env).args(args).output().expect("run cli");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The real binary, started with `env`, killed on drop.
pub struct RunningBinary {
    pub child: Child,
    pub addr: SocketAddr,
    /// Lines the binary wrote to stderr, for failure messages.
    pub stderr_path: PathBuf,
}

impl RunningBinary {
    pub fn start(env: &[(&str, String)], log_dir: &Path) -> Self {
        let stderr_path = log_dir.join(format!("stderr-{}.log", uuid::Uuid::new_v4().simple()));
        let stderr = std::fs::File::create(&stderr_path).expect("log file");
        let mut cmd = dedup_command(&[
            ("DEDUP_LISTEN", "127.0.0.1:0".into()),
            ("RUST_LOG", "warn".into()),
        ]);
        cmd.arg("serve").stdout(Stdio::piped()).stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start dedup-worker");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| {
            panic!(
                "binary exited early: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            )
        });
        let addr = line
            .strip_prefix("dedup-worker listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("address");
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        RunningBinary {
            child,
            addr,
            stderr_path,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// SIGTERM: the process drains and exits on its own; see [`RunningBinary::wait_exit`].
    pub fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) with a pid we spawned and still hold (not yet reaped).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM sent");
    }

    /// Waits up to `timeout` for the process to exit; its exit status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the binary did not exit within {timeout:?}; it logged:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// [`wait_for`], but a timeout also shows what the binary logged, so a failure in CI says
    /// why the pipeline stalled rather than only that it did.
    #[allow(dead_code)]
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        poll_until(timeout, check).await.unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {what}; the binary logged:\n{}",
                self.stderr()
            )
        })
    }
}

impl Drop for RunningBinary {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One delivery seen by the [`Receiver`].
#[derive(Debug, Clone)]
pub struct Received {
    pub idempotency_key: Option<String>,
    pub body: Bytes,
}

/// An HTTP sink target that records every POST on arrival, then answers 200 (after
/// [`Receiver::delay_answers`], if set: a sink that hangs).
pub struct Receiver {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Milliseconds each answer waits.
    answer_delay_ms: Arc<AtomicU64>,
    _task: tokio::task::JoinHandle<()>,
}

type ReceiverState = (Arc<Mutex<Vec<Received>>>, Arc<AtomicU64>);

impl Receiver {
    pub async fn start() -> Self {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let answer_delay_ms = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route(
                "/hook",
                post(
                    |State((seen, delay)): State<ReceiverState>,
                     headers: HeaderMap,
                     body: Bytes| async move {
                        let key = headers
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        seen.lock().expect("lock").push(Received {
                            idempotency_key: key,
                            body,
                        });
                        let delay = delay.load(Ordering::SeqCst);
                        if delay > 0 {
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                        }
                        StatusCode::OK
                    },
                ),
            )
            .with_state((received.clone(), answer_delay_ms.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            addr,
            received,
            answer_delay_ms,
            _task: task,
        }
    }

    /// Requests arriving from now on are recorded, then answered only after `delay`.
    pub fn delay_answers(&self, delay: Duration) {
        self.answer_delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn snapshot(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }
}

/// The value of an unlabelled counter in a Prometheus text exposition (`/metrics`); 0 when the
/// counter has not been registered yet (nothing incremented it).
pub fn counter_value(exposition: &str, name: &str) -> u64 {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|value| value.trim().parse::<f64>().expect("a counter's value") as u64)
        .next()
        .unwrap_or(0)
}

/// An event's dedup row, inserted by the test in a transaction it keeps open: a consumer step
/// that receives the event waits server-side on its `INSERT … ON CONFLICT DO NOTHING` until the
/// row is released. A step made as slow as the test likes, with no hook in the product.
pub struct HeldDedupRow {
    lock: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The backend holding the row.
    holder_pid: i32,
    observer: sqlx::PgPool,
}

impl HeldDedupRow {
    /// Holds `(source, event_id)`'s row on the PostgreSQL database at `db_url`.
    pub async fn hold(db_url: &str, source: &str, event_id: &str) -> Self {
        let holder = sqlx::PgPool::connect(db_url).await.expect("connect");
        let mut lock = holder.begin().await.expect("begin");
        let holder_pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *lock)
            .await
            .expect("backend pid");
        sqlx::query(
            "INSERT INTO processed_events (source, event_id, event_type) VALUES ($1, $2, 'held')",
        )
        .bind(source)
        .bind(event_id)
        .execute(&mut *lock)
        .await
        .expect("insert the dedup row");
        let observer = sqlx::PgPool::connect(db_url).await.expect("connect");
        HeldDedupRow {
            lock,
            holder_pid,
            observer,
        }
    }

    /// Database sessions waiting for the row now (consumer steps that received its event).
    pub async fn waiting(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(self.holder_pid)
        .fetch_one(&self.observer)
        .await
        .expect("blocked sessions")
    }

    /// Rolls the row back: the waiting steps go on, and the first to insert it handles the event.
    pub async fn release(self) {
        self.lock.rollback().await.expect("rollback");
        self.observer.close().await;
    }
}

/// Event ids in a JSON-lines sink file, one per line (empty if the file does not exist yet).
pub fn file_sink_ids(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("each sink line is JSON");
            v["id"].as_str().expect("id").to_owned()
        })
        .collect()
}

/// Rows in the example handler's table, per event id.
pub async fn ledger_counts(store: &Store) -> std::collections::HashMap<String, i64> {
    let sql = "SELECT event_id, count(*) FROM event_ledger GROUP BY event_id";
    let rows: Vec<(String, i64)> = match store {
        Store::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await.expect("ledger"),
        Store::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await.expect("ledger"),
    };
    rows.into_iter().collect()
}

/// True when nothing is left to do: queue empty and no pending outbox rows.
pub async fn pipeline_drained(store: &Store, queue: &str) -> bool {
    let depth = store.queue_depth(queue).await.unwrap_or(i64::MAX);
    let counts = store
        .outbox_counts()
        .await
        .map(|c| c.pending)
        .unwrap_or(i64::MAX);
    depth == 0 && counts == 0
}

/// Settings for an in-process app: the defaults plus `values`, never the process environment
/// (CI's own DATABASE_URL must not leak into a test).
pub fn test_settings(
    db_url: &str,
    values: &[(&str, serde_json::Value)],
) -> dedup_worker::config::Settings {
    use figment::providers::{Format, Serialized, Toml};
    let mut figment = figment::Figment::from(Toml::string(dedup_worker::config::DEFAULT_TOML))
        .merge(Serialized::default("database_url", db_url))
        .merge(Serialized::default("http.listen", "127.0.0.1:0"))
        .merge(Serialized::default("stripe.secrets", "whsec_test_secret"));
    for (key, value) in values {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    dedup_worker::config::Settings::from_figment(figment).expect("valid test settings")
}

/// An application running in this process on port 0.
pub struct TestApp {
    pub addr: SocketAddr,
    pub store: Store,
    pub shutdown: tokio_util::sync::CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl TestApp {
    pub async fn spawn(
        settings: dedup_worker::config::Settings,
        overrides: dedup_worker::startup::Overrides,
    ) -> Self {
        let app = dedup_worker::startup::Application::build(settings, overrides)
            .await
            .expect("build app");
        let addr = app.local_addr().expect("addr");
        let store = app.store().clone();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            app.run(token).await.expect("app run");
        });
        TestApp {
            addr,
            store,
            shutdown,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Which transport a binary test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Database,
    Rabbitmq,
    Sqs,
}

/// A queue of the test's own: a unique name, and for RabbitMQ its queues deleted afterwards.
pub struct TestQueue {
    pub transport: Transport,
    /// Queue name, or for SQS the queue URL (what `DEDUP_QUEUE` takes).
    pub name: String,
    sqs: Option<aws_sdk_sqs::Client>,
    /// RabbitMQ: the `x-delivery-limit` the binary declares the queue with (the test's own
    /// declarations must match it).
    delivery_limit: u32,
}

impl TestQueue {
    pub async fn new(transport: Transport) -> Self {
        let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
        if transport != Transport::Sqs {
            return TestQueue {
                transport,
                name,
                sqs: None,
                delivery_limit: 20,
            };
        }
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let client = aws_sdk_sqs::Client::new(&config);
        let url = client
            .create_queue()
            .queue_name(&name)
            .send()
            .await
            .expect("create SQS queue (is moto_server running? use scripts/test.sh)")
            .queue_url()
            .expect("queue url")
            .to_owned();
        TestQueue {
            transport,
            name: url,
            sqs: Some(client),
            delivery_limit: 20,
        }
    }

    pub fn delivery_limit(&self) -> u32 {
        self.delivery_limit
    }

    /// RabbitMQ: the queue as the binary declares it with `DEDUP_TRANSPORT__DELIVERY_LIMIT`.
    pub fn with_delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// The SQS client that created the queue (SQS only).
    pub fn sqs_client(&self) -> Option<&aws_sdk_sqs::Client> {
        self.sqs.as_ref()
    }

    /// `DEDUP_TRANSPORT` value.
    pub fn kind(&self) -> &'static str {
        match self.transport {
            Transport::Database => "database",
            Transport::Rabbitmq => "rabbitmq",
            Transport::Sqs => "sqs",
        }
    }

    /// A RabbitMQ transport on this queue, declaring it (if new) with this queue's delivery
    /// limit; the caller closes it.
    pub fn rabbit(&self) -> dedup_worker::queue::RabbitMqQueue {
        dedup_worker::queue::RabbitMqQueue::new(
            std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
            self.name.clone(),
            dedup_worker::queue::rabbitmq::RabbitOptions {
                prefetch: 1,
                delivery_limit: self.delivery_limit,
                retry_max: Duration::from_secs(600),
            },
        )
    }

    /// Nothing left to do: the queue is empty and no outbox row is pending. (For RabbitMQ the
    /// broker's count, read with a passive declare.)
    pub async fn drained(&self, store: &Store) -> bool {
        let outbox_pending = store
            .outbox_counts()
            .await
            .map(|c| c.pending)
            .unwrap_or(i64::MAX);
        let queue_empty = match self.transport {
            Transport::Database => store
                .queue_depth(&self.name)
                .await
                .map(|n| n == 0)
                .unwrap_or(false),
            Transport::Rabbitmq => {
                let rabbit = self.rabbit();
                let depth = rabbit.depth().await;
                rabbit.close().await;
                depth.map(|n| n == 0).unwrap_or(false)
            }
            Transport::Sqs => {
                use aws_sdk_sqs::types::QueueAttributeName as A;
                let Some(client) = &self.sqs else {
                    return false;
                };
                match client
                    .get_queue_attributes()
                    .queue_url(&self.name)
                    .attribute_names(A::ApproximateNumberOfMessages)
                    .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                    .send()
                    .await
                {
                    Ok(out) => out
                        .attributes()
                        .map(|a| a.values().all(|v| v == "0"))
                        .unwrap_or(false),
                    Err(_) => false,
                }
            }
        };
        queue_empty && outbox_pending == 0
    }

    pub async fn cleanup(&self) {
        if let Some(client) = &self.sqs {
            let _ = client.delete_queue().queue_url(&self.name).send().await;
        }
        if self.transport == Transport::Rabbitmq {
            let rabbit = self.rabbit();
            let _ = rabbit.delete_queues().await;
            rabbit.close().await;
        }
    }
}
