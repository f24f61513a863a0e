//! The transactional handler mode: [`IdempotentTx`] gives a handler behind the layer a
//! PostgreSQL transaction that the layer commits together with the key's stored response.
//!
//! Why: without it, a first execution is independent commits (the claim, whatever the handler
//! writes, the stored response). A process that dies after the handler's commit and before the
//! response is stored leaves the handler's rows behind, and the retry after the lease runs the
//! handler again: an order row with no unique key of its own is written twice. With it, the
//! handler's rows and the key's completion are one commit: after a crash either both are there
//! (the retry replays) or neither (the retry runs once).
//!
//! How, in order:
//! 1. the layer claims the key as in the plain mode (grouped, committed, with a lease and its
//!    heartbeat), so duplicates are answered exactly as there: 409 while it runs, 422 for
//!    another body, never a second execution;
//! 2. it puts a `TxSlot` in the request's extensions. Nothing is opened until the handler
//!    asks: a handler that does not take an `IdempotentTx` runs as in the plain mode, so one
//!    layer serves both kinds of handler;
//! 3. the extractor opens a transaction on a connection of the store's pool (kept between
//!    request transactions, see `store::request_tx`) and lends it to the handler; when
//!    the handler's future ends (returned, failed or panicked) the transaction goes back to
//!    the slot;
//! 4. for a result that is kept, the layer's last statement in the transaction stores the
//!    response, guarded by the claim token, and then commits; Redis is mirrored only after the
//!    commit. A result that gives the key back (5xx, 408/409/425/429, [`NotExecuted`]), a
//!    panic, an error or a response too large to store rolls the transaction back and
//!    releases the key, so the retry starts from nothing.
//!
//! The edges, each answered so that nothing runs twice and nothing is half done:
//! - the lease was taken over before the completion (this process stalled past it): the token
//!   guard matches no row, the transaction is rolled back and the answer is 409; the request
//!   that took the key over is the one whose writes count;
//! - the completion or the commit fails, or times out: rolled back (or of unknown outcome), the
//!   key is released if it is still ours, and the answer is 503 with `Retry-After`; the retry
//!   then replays the result if the commit did happen, or runs once if it did not;
//! - the process dies anywhere before the commit: PostgreSQL aborts the transaction; the claim
//!   lapses with its lease and one retry runs;
//! - the handler left the transaction unfit to commit: a transaction of its own left open on it
//!   (depth 2 at the layer's commit, where `COMMIT` would only release a savepoint), or a
//!   statement in it failed and the handler went on (PostgreSQL answers such a `COMMIT` with
//!   `ROLLBACK`): everything is rolled back, the key released, and the answer is 500 (503 when a
//!   keyed request's completion is what finds the transaction failed).
//!
//! A request the layer lets through without a key (a method it does not cover, or no key where
//! keys are optional) still gets its transaction if the handler asks: committed when the result
//! is one the layer would keep, rolled back otherwise, with no key and no replay.
//!
//! What it costs: the transaction holds one pool connection for as long as the handler runs,
//! and a handler must not `COMMIT` on it by hand (the connection is lent, not given: there is no
//! `commit()`, and a manual one would split the atomic commit in two).
//!
//! [`NotExecuted`]: super::NotExecuted

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::Request;
use sqlx::PgConnection;
use tower::Service;

use super::stored::releases_key;
use super::{ErrorStyle, NotExecuted, Rejection, Shared};
use crate::records::ClaimToken;
use crate::store::RequestTx;

/// The transaction a handler writes in, committed by the layer with the key's stored response.
/// Use it as a connection: `sqlx::query(…).execute(&mut *tx)`.
///
/// ```no_run
/// use axum::{http::StatusCode, Json};
/// use idempotency_key::IdempotentTx;
///
/// async fn create_order(mut tx: IdempotentTx, Json(order): Json<serde_json::Value>) -> StatusCode {
///     let inserted = sqlx::query("INSERT INTO orders (body) VALUES ($1)")
///         .bind(order.to_string())
///         .execute(&mut *tx)
///         .await;
///     match inserted {
///         Ok(_) => StatusCode::CREATED,
///         // A 5xx rolls the insert back and releases the key: the retry starts afresh.
///         Err(_) => StatusCode::SERVICE_UNAVAILABLE,
///     }
/// }
/// ```
pub struct IdempotentTx {
    /// Where the transaction goes back when the handler is done with it.
    slot: Arc<TxSlot>,
    /// Always `Some` until dropped.
    tx: Option<RequestTx>,
}

impl std::fmt::Debug for IdempotentTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentTx").finish_non_exhaustive()
    }
}

impl Deref for IdempotentTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.tx
            .as_deref()
            .expect("an IdempotentTx holds its transaction until dropped")
    }
}

impl DerefMut for IdempotentTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.tx
            .as_deref_mut()
            .expect("an IdempotentTx holds its transaction until dropped")
    }
}

impl Drop for IdempotentTx {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.slot.give_back(tx);
        }
    }
}

/// What became of a request's transaction slot.
enum SlotState {
    /// The handler has not asked for a transaction.
    Unused,
    /// The handler holds it.
    Lent,
    /// The handler is done with it: the layer commits or rolls it back.
    Returned(RequestTx),
    /// The layer has taken it back (or the request is over): no more lending.
    Closed,
}

/// One request's transaction, between the layer that owns it and the handler it lends it to.
/// The layer puts it in the request's extensions once the key is claimed.
pub(super) struct TxSlot {
    /// The layer: its store's pool (the transaction must be in the database of the keys), its
    /// statement timeout (bounds opening the transaction), its error style.
    pub(super) shared: Arc<Shared>,
    /// The key this request holds, for [`Phases`](super::Phases); `None` for a request let
    /// through without a key.
    pub(super) claim: Option<HeldKey>,
    state: Mutex<SlotState>,
    /// A phase of this request has been recorded: its records must be read, even for a new key.
    pub(super) phases_recorded: std::sync::atomic::AtomicBool,
}

/// The key a request holds: what its phases' records are written under.
#[derive(Debug, Clone)]
pub(super) struct HeldKey {
    pub(super) account: String,
    pub(super) key: String,
    pub(super) token: ClaimToken,
    /// This request's claim created the key: no phase was recorded under it before this
    /// request (see [`TxSlot::phases_recorded`]).
    pub(super) new_key: bool,
}

impl std::fmt::Debug for TxSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxSlot").finish_non_exhaustive()
    }
}

/// What the layer finds in the slot once the handler's future has ended.
pub(super) enum Lent {
    /// The handler asked for no transaction: the plain mode.
    None,
    /// Its writes, to commit with the result or roll back.
    Tx(RequestTx),
    /// The handler kept it beyond its own future (moved it into a task, say): it can be neither
    /// committed with the response nor trusted.
    Kept,
}

impl TxSlot {
    pub(super) fn new(shared: Arc<Shared>, claim: Option<HeldKey>) -> Self {
        TxSlot {
            shared,
            claim,
            state: Mutex::new(SlotState::Unused),
            phases_recorded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn style(&self) -> ErrorStyle {
        self.shared.config.error_style
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // A poisoned lock only means a panic elsewhere while it was held; the state is a plain
        // value and still meaningful.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the transaction and lends it, once per request.
    pub(super) async fn lend(self: Arc<Self>) -> Result<IdempotentTx, TxRejection> {
        {
            let mut state = self.state();
            if !matches!(*state, SlotState::Unused) {
                return Err(TxRejection::AlreadyTaken(self.style()));
            }
            *state = SlotState::Lent;
        }
        match begin(&self.shared).await {
            Some(tx) => Ok(IdempotentTx {
                slot: self,
                tx: Some(tx),
            }),
            None => {
                *self.state() = SlotState::Unused;
                Err(TxRejection::Unavailable(self.style()))
            }
        }
    }

    fn give_back(&self, tx: RequestTx) {
        let mut state = self.state();
        match *state {
            SlotState::Lent => *state = SlotState::Returned(tx),
            // Given back after the layer gave up on it: dropping it rolls it back.
            _ => drop(tx),
        }
    }

    /// Takes the transaction back once the handler's future has ended; the slot lends nothing
    /// after this.
    pub(super) fn take_back(&self) -> Lent {
        let mut state = self.state();
        match std::mem::replace(&mut *state, SlotState::Closed) {
            SlotState::Unused | SlotState::Closed => Lent::None,
            SlotState::Returned(tx) => Lent::Tx(tx),
            SlotState::Lent => Lent::Kept,
        }
    }
}

/// A transaction for the request (see [`RequestTx`]: on a kept connection, one found dead
/// retried on another), bounded by the statement timeout; `None` (logged) if PostgreSQL cannot
/// open one now.
pub(super) async fn begin(shared: &Shared) -> Option<RequestTx> {
    let begun = shared.store.begin_request_tx();
    match tokio::time::timeout(shared.config.statement_timeout, begun).await {
        Ok(Ok(tx)) => Some(tx),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "opening an idempotent request's transaction failed");
            None
        }
        Err(_) => {
            tracing::warn!("opening an idempotent request's transaction timed out");
            None
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotentTx {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let slot = parts
            .extensions
            .get::<Arc<TxSlot>>()
            .cloned()
            .ok_or(TxRejection::NoLayer)?;
        slot.lend().await
    }
}

/// Why a handler got no [`IdempotentTx`]; the handler does not run.
#[derive(Debug)]
pub enum TxRejection {
    /// The route is not behind an [`IdempotencyLayer`](super::IdempotencyLayer), or the request
    /// carried no key the layer honoured (500: a wiring mistake, not the client's).
    NoLayer,
    /// The handler asked twice (500).
    AlreadyTaken(ErrorStyle),
    /// PostgreSQL could not open a transaction now (503 with `Retry-After`); the layer releases
    /// the key, so the retry runs afresh.
    Unavailable(ErrorStyle),
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        match self {
            TxRejection::NoLayer => {
                tracing::error!(
                    "IdempotentTx used on a request the idempotency layer did not claim: \
                     mount the handler behind IdempotencyLayer and require keys"
                );
                Rejection::Internal.into_response(ErrorStyle::Problem)
            }
            TxRejection::AlreadyTaken(style) => {
                tracing::error!("IdempotentTx taken twice by one request");
                Rejection::Internal.into_response(style)
            }
            TxRejection::Unavailable(style) => Rejection::Unavailable.into_response(style),
        }
    }
}

/// A request the layer lets through without a key: the handler may still write in an
/// [`IdempotentTx`], which is committed if the result is one the layer would keep (and rolled
/// back otherwise, or if the handler failed or panicked: the panic goes on up, as it would
/// without the layer). A commit that fails is a 503; one the handler made impossible (a
/// statement in the transaction failed and it went on, or it left a transaction of its own
/// open) is a 500, with nothing committed.
pub(super) async fn without_key<S>(
    shared: Arc<Shared>,
    mut inner: S,
    mut req: Request<Body>,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>>,
    S::Response: IntoResponse,
{
    let slot = Arc::new(TxSlot::new(shared.clone(), None));
    let cfg = &shared.config;
    req.extensions_mut().insert(slot.clone());
    let called = inner.call(req).await;
    let lent = slot.take_back();
    let response = match called {
        Ok(r) => r.into_response(),
        Err(e) => return Err(e),
    };
    match lent {
        Lent::None => Ok(response),
        Lent::Kept => {
            tracing::error!(
                "the handler kept its IdempotentTx past its own end; nothing is committed"
            );
            Ok(Rejection::Internal.into_response(cfg.error_style))
        }
        Lent::Tx(mut tx) => {
            let kept = !releases_key(response.status(), cfg.keep_5xx)
                && response.extensions().get::<NotExecuted>().is_none();
            if !kept {
                // Dropping it rolls it back.
                drop(tx);
                return Ok(response);
            }
            let commit = async move {
                tx.check_not_aborted().await?;
                tx.commit().await
            };
            match tokio::time::timeout(cfg.statement_timeout, commit).await {
                Ok(Ok(())) => Ok(response),
                Ok(Err(e)) if e.handlers_fault() => {
                    tracing::error!(error = %e, "a keyless request's transaction was not committed");
                    Ok(Rejection::Internal.into_response(cfg.error_style))
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "committing a keyless request's transaction failed");
                    Ok(Rejection::Unavailable.into_response(cfg.error_style))
                }
                Err(_) => {
                    tracing::warn!("committing a keyless request's transaction timed out");
                    Ok(Rejection::Unavailable.into_response(cfg.error_style))
                }
            }
        }
    }
}
