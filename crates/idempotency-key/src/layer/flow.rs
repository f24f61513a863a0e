//! One request through the layer, in the order of the steps listed on the module.
//!
//! The flow is split where cancellation stops being harmless. Up to the Redis replay
//! ([`prepare`]) nothing has side effects, so it runs in the caller's future and a client that
//! goes away simply drops it. From the short lock on ([`execute`]) something is held, so the
//! rest runs in a task of its own that finishes whatever the client does: every way out either
//! gives back what it holds or stores the result, so a retry never finds a key held by a request
//! that no longer exists (short of a crash, which the lease covers).
//!
//! Which results are kept is a promise to the client: a stored result is the outcome of the
//! request and is replayed for the key's lifetime; anything that says "not now" (5xx unless
//! `keep_5xx`, 408, 409, 425, 429, [`NotExecuted`]) releases the key so the retry runs again.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures::FutureExt;
use http::request::Parts;
use http::{response, Request, Response};
use tower::Service;

#[cfg(feature = "redis")]
use super::cache_error;
use super::held::{Committed, HeldClaim, KeyHold};
use super::stored::{keep_header, releases_key, replay};
use super::tx::{Lent, TxSlot};
use super::{
    outcome, FaultPoint, IdempotencyConfig, NotExecuted, Rejection, Shared, IDEMPOTENCY_KEY,
};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, KeyError};
use crate::records::{Claim, StoredResponse};
#[cfg(feature = "redis")]
use crate::redis::LockOutcome;

/// The longest `Retry-After` for a 409: short, since the holder usually finishes soon.
const IN_PROGRESS_RETRY_MAX: Duration = Duration::from_secs(2);

/// The longest account the layer scopes keys by, in bytes (as for keys: Stripe's 255).
pub const MAX_ACCOUNT_LEN: usize = 255;

/// What the request's `Idempotency-Key` header asks of the layer.
pub(super) enum KeyHeader {
    /// Not a method the layer applies to, or no key where none is required: pass through.
    Exempt,
    /// Answered at once (missing where required, malformed, or sent twice).
    Refused(Rejection),
    /// A key to honour.
    Found(IdempotencyKey),
}

/// Step 1: the key. Two `Idempotency-Key` headers are refused rather than one picked: the
/// client and a proxy could disagree on which one counts.
pub(super) fn key_header(cfg: &IdempotencyConfig, req: &Request<Body>) -> KeyHeader {
    if !cfg.methods.contains(req.method()) {
        return KeyHeader::Exempt;
    }
    let mut values = req.headers().get_all(&IDEMPOTENCY_KEY).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if cfg.required => return KeyHeader::Refused(Rejection::Missing),
        (None, _) => return KeyHeader::Exempt,
        (Some(_), Some(_)) => Err(KeyError::Repeated),
        (Some(v), None) => IdempotencyKey::from_header(v),
    };
    match key {
        Ok(key) => KeyHeader::Found(key),
        Err(e) => KeyHeader::Refused(Rejection::Invalid(e)),
    }
}

/// Steps 2 and 3, the part of a request that has no side effects, run in the caller's future
/// (cancelling it is harmless): buffer and fingerprint the request, and answer a Redis-mirrored
/// replay. Then hands the request to [`execute`] in a task of its own.
pub(super) async fn prepare<S>(
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
    let bytes = match read_body(cfg, body).await {
        Ok(bytes) => bytes,
        Err(rejection) => return Ok(rejection.into_response(style)),
    };
    let fingerprint = fingerprint(&parts, &bytes);
    let account = match account(cfg, &parts) {
        Ok(account) => account,
        Err(rejection) => {
            outcome("no_account");
            return Ok(rejection.into_response(style));
        }
    };
    if let Some(answer) = replay_from_redis(&shared, &account, &key, &fingerprint).await {
        return Ok(answer);
    }

    // From the lock on, a task of its own: if the client goes away, hyper drops this future,
    // but the request still finishes, stores its result for the retry and drops its locks.
    let hold = KeyHold::new(shared.clone(), account, key, fingerprint);
    let req = Request::from_parts(parts, Body::from(bytes));
    let task = shared.tasks.clone().spawn(execute(hold, req, inner));
    match task.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "idempotent request task failed");
            Ok(Rejection::Internal.into_response(style))
        }
    }
}

/// The whole body, bounded in size and in time: it is fingerprinted before anything is
/// claimed, so a client trickling it holds no key, only this request's memory.
async fn read_body(cfg: &IdempotencyConfig, body: Body) -> Result<Bytes, Rejection> {
    let read = axum::body::to_bytes(body, cfg.max_body_bytes);
    match tokio::time::timeout(cfg.body_read_timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let cause = e.into_inner();
            Err(if cause.is::<http_body_util::LengthLimitError>() {
                Rejection::TooLarge
            } else if cause.is::<tower_http::timeout::TimeoutError>() {
                // The server's pause limit between two reads (a `tower_http::timeout::RequestBodyTimeoutLayer`).
                Rejection::BodyTimeout
            } else {
                Rejection::UnreadableBody
            })
        }
        Err(_elapsed) => Err(Rejection::BodyTimeout),
    }
}

/// The request's fingerprint. Under `Router::nest` the URI seen here has the prefix stripped;
/// the fingerprint uses the path the client sent, so two nested routes never share one.
fn fingerprint(parts: &Parts, body: &[u8]) -> Fingerprint {
    let uri = parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map(|original| original.0.clone())
        .unwrap_or_else(|| parts.uri.clone());
    Fingerprint::compute(&parts.method, uri.path(), uri.query(), &parts.headers, body)
}

/// The account that scopes the key. The account is part of the stored key (and of statements
/// shared with other requests): one PostgreSQL cannot hold or index is refused here, for this
/// request alone.
fn account(cfg: &IdempotencyConfig, parts: &Parts) -> Result<String, Rejection> {
    let account = (cfg.account)(parts).ok_or(Rejection::NoAccount)?;
    if !storable_account(&account) {
        return Err(Rejection::InvalidAccount);
    }
    Ok(account)
}

/// At most [`MAX_ACCOUNT_LEN`] bytes and no control character: PostgreSQL text cannot hold NUL,
/// and an index entry cannot exceed about 2.7 KB (a 4 KB bearer token as the account would
/// otherwise fail the grouped statement it shares with other requests).
fn storable_account(account: &str) -> bool {
    account.len() <= MAX_ACCOUNT_LEN && !account.chars().any(char::is_control)
}

/// Step 3, the Redis fast path: a plain GET. A mirrored result is the answer; every error falls
/// through to PostgreSQL, which alone decides.
#[cfg(feature = "redis")]
async fn replay_from_redis(
    shared: &Shared,
    account: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Option<Response<Body>> {
    let cache = shared.redis.as_ref()?;
    match cache.get(account, key.as_str()).await {
        Ok(Some(hit)) if hit.fingerprint == *fingerprint => {
            outcome("replay_redis");
            Some(replay(&hit.response))
        }
        Ok(Some(_)) => {
            outcome("reused");
            Some(Rejection::Reused.into_response(shared.config.error_style))
        }
        Ok(None) => None,
        Err(e) => {
            cache_error(&e, "redis lookup failed; using PostgreSQL");
            None
        }
    }
}

/// Steps 4 to 6, in the request's own task: lock, claim, run the handler, keep or give back
/// the key.
async fn execute<S>(
    mut hold: KeyHold,
    mut req: Request<Body>,
    mut inner: S,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>> + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    let style = hold.shared.config.error_style;
    if let ControlFlow::Break(answer) = lock(&mut hold).await {
        return Ok(answer);
    }
    let held = match claim(hold).await {
        ControlFlow::Continue(held) => held,
        ControlFlow::Break(answer) => return Ok(answer),
    };
    // We hold the key: from here every way out releases it or stores the result. The slot
    // lends the handler a transaction if it asks for one (the transactional mode).
    let slot = Arc::new(TxSlot::new(held.shared().clone(), Some(held.held_key())));
    req.extensions_mut().insert(slot.clone());
    let called = AssertUnwindSafe(inner.call(req)).catch_unwind().await;
    // The handler's future has ended (and with it its hold on the transaction).
    let tx = slot.take_back();
    let response = match called {
        Ok(Ok(r)) => r.into_response(),
        Ok(Err(e)) => {
            held.give_up(tx).await;
            return Err(e);
        }
        Err(_panic) => {
            tracing::error!(
                key = held.key(),
                "handler panicked; idempotency key released"
            );
            held.give_up(tx).await;
            return Ok(Rejection::Internal.into_response(style));
        }
    };
    if let Lent::Kept = tx {
        tracing::error!(
            key = held.key(),
            "the handler kept its IdempotentTx past its own end; nothing is committed and the key is released"
        );
        held.give_up(tx).await;
        return Ok(Rejection::Internal.into_response(style));
    }
    let (head, body) = response.into_parts();
    let max_response_bytes = held.config().max_response_bytes;
    let body = match axum::body::to_bytes(body, max_response_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, key = held.key(), "response body failed or exceeded max_response_bytes; idempotency key released");
            held.give_up(tx).await;
            return Ok(Rejection::Internal.into_response(style));
        }
    };
    Ok(finish(held, tx, head, body).await)
}

/// Without the `redis` feature there is no fast path: PostgreSQL answers every request.
#[cfg(not(feature = "redis"))]
async fn replay_from_redis(
    _: &Shared,
    _: &str,
    _: &IdempotencyKey,
    _: &Fingerprint,
) -> Option<Response<Body>> {
    None
}

/// The Redis short lock: a duplicate arriving while we hold it is answered without PostgreSQL.
/// `Break` carries the answer when another request holds it.
#[cfg(feature = "redis")]
async fn lock(hold: &mut KeyHold) -> ControlFlow<Response<Body>> {
    let Some(cache) = &hold.shared.redis else {
        return ControlFlow::Continue(());
    };
    let cfg = &hold.shared.config;
    let locked = cache
        .try_lock(
            &hold.account,
            hold.key.as_str(),
            &hold.fingerprint,
            cfg.lease,
        )
        .await;
    match locked {
        Ok(LockOutcome::Acquired(token)) => hold.lock = Some(token.as_str().to_owned()),
        Ok(LockOutcome::Held {
            fingerprint: Some(other),
        }) if other != hold.fingerprint => {
            outcome("reused");
            return ControlFlow::Break(Rejection::Reused.into_response(cfg.error_style));
        }
        // The same request (or a lock value we cannot read: PostgreSQL will tell the
        // retry which it was).
        Ok(LockOutcome::Held { .. }) => {
            outcome("in_progress");
            let rejection = Rejection::InProgress(Duration::from_secs(1));
            return ControlFlow::Break(rejection.into_response(cfg.error_style));
        }
        Err(e) => cache_error(&e, "redis lock failed; using PostgreSQL"),
    }
    ControlFlow::Continue(())
}

/// Without the `redis` feature there is no short lock: the PostgreSQL claim alone decides.
#[cfg(not(feature = "redis"))]
async fn lock(_: &mut KeyHold) -> ControlFlow<Response<Body>> {
    ControlFlow::Continue(())
}

/// The PostgreSQL claim, one statement, which alone decides: this request now holds the key
/// (`Continue`), or the answer is a replay, a 409, a 422 or a 503 (`Break`, with the short lock
/// given back).
async fn claim(hold: KeyHold) -> ControlFlow<Response<Body>, HeldClaim> {
    let cfg = &hold.shared.config;
    let style = cfg.error_style;
    let claim = hold
        .shared
        .store
        .claim_noting_new(
            &hold.account,
            hold.key.as_str(),
            &hold.fingerprint,
            cfg.lease,
            cfg.ttl,
        )
        .await;
    let answer = match claim {
        Ok((Claim::Acquired(token), new_key)) => {
            return ControlFlow::Continue(HeldClaim::start(hold, token, new_key))
        }
        Ok((
            Claim::Completed {
                fingerprint: stored,
                response,
                ttl,
            },
            _,
        )) if stored == hold.fingerprint => {
            // Re-mirror (Redis was empty or flushed) so the next replay skips PostgreSQL.
            hold.mirror(&response, ttl).await;
            outcome("replay_pg");
            replay(&response)
        }
        Ok((Claim::Completed { .. }, _)) => {
            hold.unlock().await;
            outcome("reused");
            Rejection::Reused.into_response(style)
        }
        Ok((
            Claim::InProgress {
                fingerprint: other,
                retry_after,
            },
            _,
        )) => {
            hold.unlock().await;
            if other != hold.fingerprint {
                outcome("reused");
                Rejection::Reused.into_response(style)
            } else {
                outcome("in_progress");
                // Not the whole remaining lease: the holder usually finishes long before it
                // ends.
                Rejection::InProgress(retry_after.min(IN_PROGRESS_RETRY_MAX)).into_response(style)
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "idempotency claim failed");
            hold.unlock().await;
            outcome("store_error");
            Rejection::Unavailable.into_response(style)
        }
    };
    ControlFlow::Break(answer)
}

/// Step 6: the handler's response, kept (stored and mirrored, in the handler's transaction when
/// it wrote in one) or given back (key released, the transaction rolled back).
async fn finish(held: HeldClaim, tx: Lent, head: response::Parts, body: Bytes) -> Response<Body> {
    if releases_key(head.status, held.config().keep_5xx)
        || head.extensions.get::<NotExecuted>().is_some()
    {
        held.give_up(tx).await;
        outcome("released");
        return Response::from_parts(head, Body::from(body));
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
    held.config().fault(|| FaultPoint::BeforeCompletion).await;
    let Lent::Tx(tx) = tx else {
        held.store(stored).await;
        return Response::from_parts(head, Body::from(body));
    };
    let style = held.config().error_style;
    match held.commit(tx, &stored).await {
        Committed::Stored => Response::from_parts(head, Body::from(body)),
        // Another request holds the key now and runs it; ours left nothing behind.
        Committed::Lost => Rejection::InProgress(Duration::from_secs(1)).into_response(style),
        Committed::Failed => Rejection::Unavailable.into_response(style),
        Committed::Refused => Rejection::Internal.into_response(style),
    }
}
