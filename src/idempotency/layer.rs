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

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use futures::FutureExt;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use tokio_util::task::TaskTracker;
use tower::{Layer, Service};

use super::fingerprint::Fingerprint;
use super::key::{IdempotencyKey, KeyError};
use super::records::{Claim, ClaimToken, Ownership, StoredResponse};
use super::redis::{CacheError, CachedResponse, LockOutcome, RedisCache};
pub use super::rejection::{ErrorStyle, Rejection};
use super::store::PgIdempotencyStore;

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on replayed responses (Stripe's name).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Extracts the account that scopes keys from the request head (e.g. the authenticated
/// principal). `None` refuses the request (401): pooling unidentified callers in one scope
/// would replay one caller's result to another. The default, for single-tenant APIs, puts
/// every request in one scope.
pub type AccountExtractor = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

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
            .finish_non_exhaustive()
    }
}

/// Builder for [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyLayerBuilder {
    store: PgIdempotencyStore,
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
    /// A server-wide header-read timeout and concurrency cap are the server's job: see
    /// [`crate::server::serve`].
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

    /// Redis fast path (optional).
    pub fn redis(mut self, cache: RedisCache) -> Self {
        self.redis = Some(cache);
        self
    }

    /// Builds the layer.
    pub fn build(self) -> IdempotencyLayer {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                store: self.store,
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
            },
        }
    }

    /// The PostgreSQL store (e.g. for its query counter or expiry task).
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

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
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let cfg = &shared.config;

        if !cfg.methods.contains(req.method()) {
            return Box::pin(inner.call(req).map(|r| r.map(IntoResponse::into_response)));
        }
        let mut values = req.headers().get_all(&IDEMPOTENCY_KEY).iter();
        let key = match (values.next(), values.next()) {
            (None, _) if cfg.required => {
                let style = cfg.error_style;
                return Box::pin(async move { Ok(Rejection::Missing.into_response(style)) });
            }
            (None, _) => {
                return Box::pin(inner.call(req).map(|r| r.map(IntoResponse::into_response)));
            }
            (Some(_), Some(_)) => Err(KeyError::Repeated),
            (Some(v), None) => IdempotencyKey::from_header(v),
        };
        let key = match key {
            Ok(k) => k,
            Err(e) => {
                let style = cfg.error_style;
                return Box::pin(async move { Ok(Rejection::Invalid(e).into_response(style)) });
            }
        };
        Box::pin(prepare(shared, inner, req, key))
    }
}

/// The part of a request that has no side effects, run in the caller's future (cancelling it
/// is harmless): buffer and fingerprint the request, and answer a Redis-mirrored replay.
async fn prepare<S>(
    shared: Arc<Shared>,
    inner: S,
    req: Request<Body>,
    key: IdempotencyKey,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>> + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    let cfg = &shared.config;
    let style = cfg.error_style;
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, cfg.max_body_bytes);
    let bytes = match tokio::time::timeout(cfg.body_read_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let cause = e.into_inner();
            let rejection = if cause.is::<http_body_util::LengthLimitError>() {
                Rejection::TooLarge
            } else if cause.is::<tower_http::timeout::TimeoutError>() {
                // The server's pause limit between two reads (see `crate::server`).
                Rejection::BodyTimeout
            } else {
                Rejection::UnreadableBody
            };
            return Ok(rejection.into_response(style));
        }
        Err(_elapsed) => return Ok(Rejection::BodyTimeout.into_response(style)),
    };
    // Under `Router::nest` the URI seen here has the prefix stripped; the fingerprint uses the
    // path the client sent, so two nested routes never share a fingerprint.
    let uri = parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map(|original| original.0.clone())
        .unwrap_or_else(|| parts.uri.clone());
    let fingerprint = Fingerprint::compute(
        &parts.method,
        uri.path(),
        uri.query(),
        &parts.headers,
        &bytes,
    );
    let Some(account) = (cfg.account)(&parts) else {
        outcome("no_account");
        return Ok(Rejection::NoAccount.into_response(style));
    };
    // The account is part of the stored key (and of statements shared with other requests):
    // one PostgreSQL cannot hold or index is refused here, for this request alone.
    if !storable_account(&account) {
        outcome("no_account");
        return Ok(Rejection::InvalidAccount.into_response(style));
    }

    // Redis fast path: a plain GET. Every error falls through to PostgreSQL.
    if let Some(cache) = &shared.redis {
        match cache.get(&account, key.as_str()).await {
            Ok(Some(hit)) if hit.fingerprint == fingerprint => {
                outcome("replay_redis");
                return Ok(replay(&hit.response));
            }
            Ok(Some(_)) => {
                outcome("reused");
                return Ok(Rejection::Reused.into_response(style));
            }
            Ok(None) => {}
            Err(e) => cache_error(&e, "redis lookup failed; using PostgreSQL"),
        }
    }

    // From the lock on, a task of its own: if the client goes away, hyper drops this future,
    // but the request still finishes, stores its result for the retry and drops its locks.
    let task = shared.tasks.clone().spawn(execute(
        Prepared {
            shared,
            parts,
            bytes,
            fingerprint,
            account,
            key,
        },
        inner,
    ));
    match task.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "idempotent request task failed");
            Ok(Rejection::Internal.into_response(style))
        }
    }
}

struct Prepared {
    shared: Arc<Shared>,
    parts: Parts,
    bytes: bytes::Bytes,
    fingerprint: Fingerprint,
    account: String,
    key: IdempotencyKey,
}

async fn execute<S>(p: Prepared, mut inner: S) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>> + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    let Prepared {
        shared,
        parts,
        bytes,
        fingerprint,
        account,
        key,
    } = p;
    let cfg = &shared.config;
    let style = cfg.error_style;
    let k = key.as_str();

    // The short lock: a duplicate arriving while we hold it is answered without PostgreSQL.
    let mut lock: Option<String> = None;
    if let Some(cache) = &shared.redis {
        match cache.try_lock(&account, k, &fingerprint, cfg.lease).await {
            Ok(LockOutcome::Acquired(token)) => lock = Some(token.as_str().to_owned()),
            Ok(LockOutcome::Held {
                fingerprint: Some(other),
            }) if other != fingerprint => {
                outcome("reused");
                return Ok(Rejection::Reused.into_response(style));
            }
            // The same request (or a lock value we cannot read: PostgreSQL will tell the
            // retry which it was).
            Ok(LockOutcome::Held { .. }) => {
                outcome("in_progress");
                return Ok(Rejection::InProgress(Duration::from_secs(1)).into_response(style));
            }
            Err(e) => cache_error(&e, "redis lock failed; using PostgreSQL"),
        }
    }

    let claim = shared
        .store
        .claim(&account, k, &fingerprint, cfg.lease, cfg.ttl)
        .await;
    let token = match claim {
        Ok(Claim::Acquired(token)) => token,
        Ok(Claim::Completed {
            fingerprint: stored,
            response,
            ttl,
        }) => {
            if stored != fingerprint {
                unlock(&shared, &account, k, lock.as_deref()).await;
                outcome("reused");
                return Ok(Rejection::Reused.into_response(style));
            }
            // Re-mirror (Redis was empty or flushed) so the next replay skips PostgreSQL.
            mirror(
                &shared,
                &account,
                k,
                lock.as_deref(),
                stored,
                &response,
                ttl,
            )
            .await;
            outcome("replay_pg");
            return Ok(replay(&response));
        }
        Ok(Claim::InProgress {
            fingerprint: other,
            retry_after,
        }) => {
            unlock(&shared, &account, k, lock.as_deref()).await;
            if other != fingerprint {
                outcome("reused");
                return Ok(Rejection::Reused.into_response(style));
            }
            outcome("in_progress");
            // Not the whole remaining lease: the holder usually finishes long before it ends.
            return Ok(
                Rejection::InProgress(retry_after.min(IN_PROGRESS_RETRY_MAX)).into_response(style),
            );
        }
        Err(e) => {
            tracing::error!(error = %e, "idempotency claim failed");
            unlock(&shared, &account, k, lock.as_deref()).await;
            outcome("store_error");
            return Ok(Rejection::Unavailable.into_response(style));
        }
    };

    // We hold the key. The lease heartbeat is a task of its own for as long as the outcome is
    // not recorded (handler, response body, storing the result): a slow store call never
    // stalls the handler, and a live request's lease never lapses.
    let heartbeat = Heartbeat::start(shared.clone(), account.clone(), k.to_owned(), token);
    let req = Request::from_parts(parts, Body::from(bytes));
    let result = AssertUnwindSafe(inner.call(req)).catch_unwind().await;
    let response = match result {
        Ok(Ok(r)) => r.into_response(),
        Ok(Err(e)) => {
            drop(heartbeat);
            release(&shared, &account, k, token, lock.as_deref()).await;
            return Err(e);
        }
        Err(_panic) => {
            drop(heartbeat);
            tracing::error!(key = k, "handler panicked; idempotency key released");
            release(&shared, &account, k, token, lock.as_deref()).await;
            return Ok(Rejection::Internal.into_response(style));
        }
    };
    let (head, body) = response.into_parts();
    let body = match axum::body::to_bytes(body, cfg.max_response_bytes).await {
        Ok(b) => b,
        Err(e) => {
            drop(heartbeat);
            tracing::error!(error = %e, key = k, "response body failed or exceeded max_response_bytes; idempotency key released");
            release(&shared, &account, k, token, lock.as_deref()).await;
            return Ok(Rejection::Internal.into_response(style));
        }
    };

    if releases_key(head.status, cfg.keep_5xx) || head.extensions.get::<NotExecuted>().is_some() {
        drop(heartbeat);
        release(&shared, &account, k, token, lock.as_deref()).await;
        outcome("released");
        return Ok(Response::from_parts(head, Body::from(body)));
    }

    let stored = StoredResponse {
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .filter(|(n, _)| keep_header(n))
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        body: body.clone(),
    };
    // The operation has run: its result must be stored, or a retry after the lease would run
    // it again. A few quick tries here; if the store is still failing, the client gets its
    // answer now and a background task keeps trying (with the heartbeat alive) for up to the
    // key's TTL.
    let completion = Completion {
        shared: shared.clone(),
        account: account.clone(),
        key: k.to_owned(),
        token,
        lock: lock.clone(),
        fingerprint,
        stored,
    };
    if !completion.try_store(4).await {
        outcome("store_retrying");
        shared.tasks.spawn(async move {
            let _heartbeat = heartbeat;
            completion.store_until_ttl().await;
        });
    }
    Ok(Response::from_parts(head, Body::from(body)))
}

/// Put in a response's extensions by a handler that refused a request before doing anything
/// (failed validation, say): the result is not stored and the key is released, so the client
/// can fix the request and retry with the same key, as Stripe does for validation errors.
/// Without it every 2xx and 4xx is stored and replayed.
///
/// ```
/// use axum::{http::StatusCode, response::IntoResponse, Extension};
/// use dedup_worker::idempotency::NotExecuted;
///
/// async fn create_payment() -> impl IntoResponse {
///     (StatusCode::BAD_REQUEST, Extension(NotExecuted), "amount must be positive")
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotExecuted;

/// The longest `Retry-After` for a 409: short, since the holder usually finishes soon.
const IN_PROGRESS_RETRY_MAX: Duration = Duration::from_secs(2);

/// The longest account the layer scopes keys by, in bytes (as for keys: Stripe's 255).
pub const MAX_ACCOUNT_LEN: usize = 255;

/// At most [`MAX_ACCOUNT_LEN`] bytes and no control character: PostgreSQL text cannot hold NUL,
/// and an index entry cannot exceed about 2.7 KB (a 4 KB bearer token as the account would
/// otherwise fail the grouped statement it shares with other requests).
fn storable_account(account: &str) -> bool {
    account.len() <= MAX_ACCOUNT_LEN && !account.chars().any(char::is_control)
}

/// Results a client is expected to retry are not stored: 5xx (unless `keep_5xx`), and 408,
/// 409, 425 and 429, which say "not now" rather than "this is the outcome".
fn releases_key(status: StatusCode, keep_5xx: bool) -> bool {
    (status.is_server_error() && !keep_5xx) || matches!(status.as_u16(), 408 | 409 | 425 | 429)
}

/// Extends the lease every third of it until dropped.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start(shared: Arc<Shared>, account: String, key: String, token: ClaimToken) -> Self {
        Heartbeat(tokio::spawn(async move {
            let lease = shared.config.lease;
            let beat = lease / 3;
            loop {
                tokio::time::sleep(beat).await;
                // Bounded, so one stuck call cannot let the lease run out unnoticed.
                match tokio::time::timeout(beat, shared.store.extend(&account, &key, token, lease))
                    .await
                {
                    Ok(Ok(Ownership::Owned { .. })) => {}
                    Ok(Ok(Ownership::Lost)) => {
                        tracing::warn!(key, "idempotency lease lost while running");
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "idempotency lease extension failed"),
                    Err(_) => tracing::warn!(key, "idempotency lease extension timed out"),
                }
            }
        }))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Everything needed to store one result.
struct Completion {
    shared: Arc<Shared>,
    account: String,
    key: String,
    token: ClaimToken,
    lock: Option<String>,
    fingerprint: Fingerprint,
    stored: StoredResponse,
}

impl Completion {
    /// One attempt: `Some(true)` stored, `Some(false)` the claim was lost, `None` store error.
    async fn attempt(&self) -> Option<bool> {
        let k = self.key.as_str();
        match self
            .shared
            .store
            .complete(&self.account, k, self.token, &self.stored)
            .await
        {
            Ok(Ownership::Owned { ttl }) => {
                mirror(
                    &self.shared,
                    &self.account,
                    k,
                    self.lock.as_deref(),
                    self.fingerprint,
                    &self.stored,
                    ttl,
                )
                .await;
                outcome("executed");
                Some(true)
            }
            Ok(Ownership::Lost) => {
                tracing::error!(
                    key = k,
                    "idempotency claim was taken over before completion; result not stored"
                );
                outcome("lost_claim");
                Some(false)
            }
            Err(e) => {
                tracing::warn!(error = %e, key = k, "storing idempotent result failed; will retry");
                None
            }
        }
    }

    /// Up to `tries` quick attempts; false if the store kept failing.
    async fn try_store(&self, tries: u32) -> bool {
        for attempt in 1..=tries {
            if self.attempt().await.is_some() {
                return true;
            }
            if attempt < tries {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
        }
        false
    }

    /// Keeps trying with capped backoff until stored, lost, or the key's TTL has passed.
    async fn store_until_ttl(self) {
        let deadline = tokio::time::Instant::now() + self.shared.config.ttl;
        let mut delay = Duration::from_millis(500);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(delay).await;
            if self.attempt().await.is_some() {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
        tracing::error!(
            key = self.key,
            "gave up storing an idempotent result; a retry may run again"
        );
        outcome("store_error");
    }
}

/// Redis trouble never fails a request; while the breaker is open, say so quietly rather than
/// once per request.
fn cache_error(e: &CacheError, what: &'static str) {
    if matches!(e, CacheError::Skipped) {
        tracing::debug!(error = %e, "{what}");
    } else {
        tracing::warn!(error = %e, "{what}");
    }
}

fn outcome(what: &'static str) {
    metrics::counter!("idempotency_requests_total", "outcome" => what).increment(1);
}

async fn mirror(
    shared: &Shared,
    account: &str,
    key: &str,
    lock: Option<&str>,
    fingerprint: Fingerprint,
    response: &StoredResponse,
    ttl: Duration,
) {
    let Some(cache) = &shared.redis else { return };
    let cached = CachedResponse {
        fingerprint,
        response: response.clone(),
    };
    if let Err(e) = cache.store(account, key, lock, &cached, ttl).await {
        cache_error(&e, "mirroring idempotent result to redis failed");
        if let Some(token) = lock {
            // The lock was taken with the lease as its TTL (see `execute`).
            cache.unlock_when_back(account, key, token, shared.config.lease);
        }
    }
}

async fn unlock(shared: &Shared, account: &str, key: &str, lock: Option<&str>) {
    if let (Some(cache), Some(token)) = (&shared.redis, lock) {
        if let Err(e) = cache.unlock(account, key, token).await {
            cache_error(&e, "redis unlock failed");
            cache.unlock_when_back(account, key, token, shared.config.lease);
        }
    }
}

async fn release(shared: &Shared, account: &str, key: &str, token: ClaimToken, lock: Option<&str>) {
    match shared.store.release(account, key, token).await {
        Ok(Ownership::Owned { .. }) => {}
        Ok(Ownership::Lost) => tracing::warn!(key, "idempotency claim already taken over"),
        // The lease will end and a retry will take over.
        Err(e) => tracing::warn!(error = %e, "releasing idempotency key failed"),
    }
    unlock(shared, account, key, lock).await;
}

/// Whether a response header is stored and replayed. Connection-level and per-response
/// headers (date, length, framing) are regenerated; cookies are not replayed to whoever
/// retries.
pub fn keep_header(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "date"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-connection"
            | "proxy-authenticate"
            | "set-cookie"
            | "idempotent-replayed"
    )
}

fn replay(stored: &StoredResponse) -> Response<Body> {
    let mut resp = Response::new(Body::from(stored.body.clone()));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = resp.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    resp
}
