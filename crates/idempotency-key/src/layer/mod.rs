//! The tower [`Layer`] that gives any axum `Router` Idempotency-Key semantics.
//!
//! Per request (for the configured methods, POST and PATCH by default):
//! 1. parse the key (bare or quoted; 400 if missing where required or invalid);
//! 2. buffer the body (bounded, 413 beyond) and fingerprint the request;
//! 3. Redis, when configured: a mirrored result is replayed at once (or 422 on another
//!    fingerprint). Steps 1–3 have no side effects and run in the caller's future, so the hot
//!    replay path costs one Redis GET and no task;
//! 4. from here on in a task of its own, so that a client that disconnects does not cancel the
//!    request half way (its result is still stored, and its locks dropped, for the retry):
//!    the Redis `SET NX PX` short lock (held elsewhere → 409), then the PostgreSQL claim, one
//!    statement: a stored result is replayed (422 on another fingerprint), a running claim
//!    answers 409 with `Retry-After`, otherwise this request holds the key;
//! 5. the handler runs with a lease heartbeat, so only a dead process lets the lease lapse;
//! 6. 2xx/4xx (and 5xx with `keep_5xx`) are stored and mirrored; other 5xx, 408/409/425/429
//!    and responses marked [`NotExecuted`] release the key.
//!
//! A handler that takes an [`IdempotentTx`] runs in the transactional mode: its writes and the
//! stored result of step 6 are one commit (see [`tx`]). A handler that takes [`Phases`] splits
//! its work into recorded phases, and a retry resumes at the first unfinished one (see
//! [`phases`]).
//!
//! This file holds what a user configures and mounts (builder, layer, service); the steps above
//! are in `flow.rs`, what a request holds of its key and how it lets go in `held.rs`, the
//! transaction lent to handlers in `tx.rs`, recovery points in `phases.rs`, and the answers the layer gives itself in
//! `rejection.rs`.

mod flow;
mod held;
pub mod phases;
mod rejection;
mod stored;
pub mod tx;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use http::header::HeaderName;
use http::request::Parts;
use http::{Method, Request, Response};
use tokio_util::task::TaskTracker;
use tower::{Layer, Service};

#[cfg(feature = "redis")]
use super::redis::{CacheError, RedisCache};
use super::store::PgIdempotencyStore;
use flow::KeyHeader;
pub use flow::MAX_ACCOUNT_LEN;
pub use phases::{Phase, PhaseError, PhaseErrorKind, PhaseRun, Phases};
pub use rejection::{ErrorStyle, Rejection};
pub use tx::{IdempotentTx, TxRejection};

impl IdempotencyConfig {
    /// Awaits the test hook at the point `point` makes, if a hook is set (the point is only
    /// made then: it may own a phase's name).
    async fn fault(&self, point: impl FnOnce() -> FaultPoint) {
        if let Some(hook) = &self.fault_hook {
            hook(point()).await;
        }
    }
}

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on replayed responses (Stripe's name).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Extracts the account that scopes keys from the request head (e.g. the authenticated
/// principal). `None` refuses the request (401): pooling unidentified callers in one scope
/// would replay one caller's result to another. The default, for single-tenant APIs, puts
/// every request in one scope.
pub type AccountExtractor = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Where a test may pause (and crash) a request (`test_util::LayerFaults::fault_hook`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultPoint {
    /// The handler has returned a result to keep, which is about to be stored (in its
    /// transaction, in the transactional mode).
    BeforeCompletion,
    /// A phase has done its work (its foreign call returned) and is about to be recorded.
    PhaseRan(String),
    /// A phase's writes and record are committed.
    PhaseCommitted(String),
}

pub(crate) type FaultHook = Arc<dyn Fn(FaultPoint) -> BoxFuture<()> + Send + Sync>;

/// Configuration, built with [`IdempotencyLayer::builder`].
#[derive(Clone)]
pub struct IdempotencyConfig {
    methods: Vec<Method>,
    required: bool,
    ttl: Duration,
    lease: Duration,
    account: AccountExtractor,
    error_style: ErrorStyle,
    keep_5xx: bool,
    max_body_bytes: usize,
    body_read_timeout: Duration,
    max_response_bytes: usize,
    statement_timeout: Duration,
    /// Test-only pauses at points where a crash matters (see [`FaultPoint`]).
    fault_hook: Option<FaultHook>,
}

impl std::fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("methods", &self.methods)
            .field("required", &self.required)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("error_style", &self.error_style)
            .field("keep_5xx", &self.keep_5xx)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("statement_timeout", &self.statement_timeout)
            .finish_non_exhaustive()
    }
}

/// Builder for [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyLayerBuilder {
    store: PgIdempotencyStore,
    #[cfg(feature = "redis")]
    redis: Option<RedisCache>,
    config: IdempotencyConfig,
}

impl IdempotencyLayerBuilder {
    /// Methods the layer applies to (default POST and PATCH). Others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request without a key is refused with 400 (default `true`). When `false`, such
    /// requests pass through without idempotency.
    pub fn key_required(mut self, required: bool) -> Self {
        self.config.required = required;
        self
    }

    /// How long a key and its stored result live (default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// How long a claim survives without a heartbeat, i.e. how long after a crash the key
    /// stays refused with 409 before a retry may take it over (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease.max(Duration::from_millis(10));
        self
    }

    /// The account extractor that scopes keys.
    pub fn account<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.account = Arc::new(f);
        self
    }

    /// Error response style (default problem+json).
    pub fn error_style(mut self, style: ErrorStyle) -> Self {
        self.config.error_style = style;
        self
    }

    /// Keep and replay 5xx results as Stripe does (default `false`: a 5xx releases the key).
    pub fn keep_5xx(mut self, keep: bool) -> Self {
        self.config.keep_5xx = keep;
        self
    }

    /// Largest request body buffered for fingerprinting (default 1 MiB; larger → 413).
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.config.max_body_bytes = n;
        self
    }

    /// Longest time the whole request body may take to arrive (default 30 s; 408 beyond, and
    /// nothing runs). The body is buffered before the key is claimed, so a client trickling it
    /// holds no key, but it would hold this request's memory and task without a bound.
    /// A server-wide header-read timeout and concurrency cap are the server's job (dedup-worker's
    /// `http::serve` sets both; with `axum::serve`, a `tower::limit` layer and a proxy's).
    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.config.body_read_timeout = timeout;
        self
    }

    /// Largest response body stored for replay (default 8 MiB). A larger response is answered
    /// with 500 and its key released: such an endpoint is not protected, so keep replayable
    /// responses small.
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.config.max_response_bytes = n;
        self
    }

    /// The longest the layer waits on one of its own PostgreSQL calls made for one request
    /// (default 10 s): releasing a key, and in the transactional mode ([`IdempotentTx`]) opening
    /// the transaction, storing the response in it, committing and rolling back. Past it the
    /// answer is 503 with `Retry-After` and the key is released, or left to its lease. The
    /// grouped claims and completions have their own bound ([`GroupOptions`]).
    ///
    /// [`GroupOptions`]: crate::GroupOptions
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.config.statement_timeout = timeout;
        self
    }

    /// Tests only: awaits `hook` at each [`FaultPoint`], so a test can stop the process there
    /// (drop its runtime) and show what a crash at that point leaves behind.
    #[cfg(feature = "test-util")]
    pub(crate) fn set_fault_hook(mut self, hook: FaultHook) -> Self {
        self.config.fault_hook = Some(hook);
        self
    }

    /// Redis fast path (optional; feature `redis`).
    #[cfg(feature = "redis")]
    pub fn redis(mut self, cache: RedisCache) -> Self {
        self.redis = Some(cache);
        self
    }

    /// Builds the layer.
    pub fn build(self) -> IdempotencyLayer {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                store: self.store,
                #[cfg(feature = "redis")]
                redis: self.redis,
                config: self.config,
                tasks: TaskTracker::new(),
            }),
        }
    }
}

#[derive(Debug)]
struct Shared {
    store: PgIdempotencyStore,
    #[cfg(feature = "redis")]
    redis: Option<RedisCache>,
    config: IdempotencyConfig,
    /// Requests running detached from their connection, and results still being stored: what
    /// [`IdempotencyLayer::drain`] waits for at shutdown.
    tasks: TaskTracker,
}

/// The layer. Cheap to clone.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// Starts a builder with the defaults described on each method.
    pub fn builder(store: PgIdempotencyStore) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder {
            store,
            #[cfg(feature = "redis")]
            redis: None,
            config: IdempotencyConfig {
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                ttl: Duration::from_secs(24 * 3600),
                lease: Duration::from_secs(30),
                account: Arc::new(|_| Some(String::new())),
                error_style: ErrorStyle::Problem,
                keep_5xx: false,
                max_body_bytes: 1024 * 1024,
                body_read_timeout: Duration::from_secs(30),
                max_response_bytes: 8 * 1024 * 1024,
                statement_timeout: Duration::from_secs(10),
                fault_hook: None,
            },
        }
    }

    /// The PostgreSQL store (e.g. for its expiry task).
    pub fn store(&self) -> &PgIdempotencyStore {
        &self.shared.store
    }

    /// Waits up to `timeout` for requests still running and results still being stored; call
    /// it after the server stopped accepting (e.g. after axum's graceful shutdown), since a
    /// request whose client went away keeps running detached. `false` if some were still
    /// running: their keys stay claimed until the lease ends, and a retry then runs them again.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let tasks = &self.shared.tasks;
        tasks.close();
        let drained = tokio::time::timeout(timeout, tasks.wait()).await.is_ok();
        if !drained {
            tracing::warn!(
                running = tasks.len(),
                "idempotent requests still running at shutdown; their keys wait for the lease"
            );
        }
        drained
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service produced by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// A boxed future, as the service and the fault hook return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> Service<Request<Body>> for IdempotencyService<S>
where
    S: Service<Request<Body>> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // Take the service that was driven to readiness, leave a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        match flow::key_header(&shared.config, &req) {
            KeyHeader::Exempt => Box::pin(tx::without_key(shared, inner, req)),
            KeyHeader::Refused(rejection) => {
                let style = shared.config.error_style;
                Box::pin(timed(async move { Ok(rejection.into_response(style)) }))
            }
            KeyHeader::Found(key) => Box::pin(timed(flow::prepare(shared, inner, req, key))),
        }
    }
}

/// `1xx` … `5xx`: the status label of `idempotency_request_seconds`, few values (as the
/// pipeline's own request histograms use).
fn status_class(status: http::StatusCode) -> &'static str {
    const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
    CLASSES[usize::from(status.as_u16() / 100).clamp(1, 5) - 1]
}

/// A request the layer answers for (it carries a key, or lacks one where one is required),
/// timed from the call to its answer in `idempotency_request_seconds{status, replayed}`:
/// replays and executions apart, as they differ by the handler's whole run. Requests the layer
/// lets through untouched (other methods, no key where none is required) are the handler's
/// alone and are not counted.
async fn timed<E>(
    request: impl Future<Output = Result<Response<Body>, E>>,
) -> Result<Response<Body>, E> {
    let started = std::time::Instant::now();
    let result = request.await;
    let (status, replayed) = match &result {
        Ok(response) => (
            status_class(response.status()),
            response.headers().contains_key(&IDEMPOTENT_REPLAYED),
        ),
        // The inner service failed (axum routers never do): no answer of the layer's.
        Err(_) => ("error", false),
    };
    metrics::histogram!(
        "idempotency_request_seconds",
        "status" => status,
        "replayed" => if replayed { "true" } else { "false" },
    )
    .record(started.elapsed().as_secs_f64());
    result
}

/// Put in a response's extensions by a handler that refused a request before doing anything
/// (failed validation, say): the result is not stored and the key is released, so the client
/// can fix the request and retry with the same key, as Stripe does for validation errors.
/// Without it every 2xx and 4xx is stored and replayed.
///
/// ```
/// use axum::{http::StatusCode, response::IntoResponse, Extension};
/// use idempotency_key::NotExecuted;
///
/// async fn create_payment() -> impl IntoResponse {
///     (StatusCode::BAD_REQUEST, Extension(NotExecuted), "amount must be positive")
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotExecuted;

/// Redis trouble never fails a request; while the breaker is open, say so quietly rather than
/// once per request.
#[cfg(feature = "redis")]
fn cache_error(e: &CacheError, what: &'static str) {
    if matches!(e, CacheError::Skipped) {
        tracing::debug!(error = %e, "{what}");
    } else {
        tracing::warn!(error = %e, "{what}");
    }
}

/// Counts how each request ended (`idempotency_requests_total{outcome}`).
fn outcome(what: &'static str) {
    metrics::counter!("idempotency_requests_total", "outcome" => what).increment(1);
}
