//! Phases and recovery points: a request whose work leaves the database (a charge at a payment
//! provider, say) split into named phases, each recorded when it finishes, so that a retry after
//! a crash or a 5xx resumes at the first unfinished phase with what the earlier ones produced,
//! instead of starting over (Stripe's atomic phases; brandur's Rocket Rides shows the pattern).
//!
//! A request of the checkout example:
//! 1. `create_payment`, local: inserts the payment row; the row and the phase's record (its
//!    output, the payment id) commit together, so after a crash either both exist or neither;
//! 2. `charge_provider`, foreign: calls the provider with the request's own `Idempotency-Key`;
//!    its outcome is recorded by the final commit ([`PhaseRun::finish_with_response`]: nothing
//!    leaves the database in between). A crash before that commit runs the call again on the
//!    retry, and the provider, keyed by the same key, replays its charge instead of making a
//!    second one: a foreign phase must pass the key on, or be otherwise idempotent;
//! 3. the final phase writes through [`Phases::transaction`], the request's [`IdempotentTx`],
//!    which the layer commits with the stored response.
//!
//! Recorded phases belong to the key's claim: they survive the claim being taken over by the
//! same request (the retry after a crash) and the key being released (a 5xx: the row stays,
//! unclaimed, with its progress), and are gone with the key's TTL or a different request taking
//! it over. Every record is guarded by the claim token, so a request whose lease was taken over
//! records nothing (its phase is rolled back, and it answers 409).

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::PgConnection;

use super::tx::{begin, IdempotentTx, TxRejection, TxSlot};
use super::{ErrorStyle, FaultPoint, Rejection};
use crate::records::Ownership;
use crate::store::RequestTx;

/// The phases of a request behind the layer, and what earlier attempts recorded of them.
/// Extract it in the handler; see the module's documentation.
///
/// ```no_run
/// use axum::http::StatusCode;
/// use idempotency_key::{Phase, PhaseError, Phases};
///
/// async fn create_payment(phases: Phases) -> Result<StatusCode, PhaseError> {
///     let payment: i64 = match phases.phase("create_payment")? {
///         Phase::Done(id) => id,
///         Phase::Run(mut run) => {
///             let id: i64 = sqlx::query_scalar("INSERT INTO payments DEFAULT VALUES RETURNING id")
///                 .fetch_one(run.tx().await?)
///                 .await
///                 .map_err(PhaseError::handler)?;
///             run.finish(id).await?
///         }
///     };
///     let mut tx = phases.transaction().await?;
///     sqlx::query("UPDATE payments SET status = 'succeeded' WHERE id = $1")
///         .bind(payment)
///         .execute(&mut *tx)
///         .await
///         .map_err(PhaseError::handler)?;
///     Ok(StatusCode::CREATED)
/// }
/// ```
pub struct Phases {
    /// The request's slot: its key and claim, the layer, and the final transaction.
    slot: Arc<TxSlot>,
    /// Finished phases' outputs by name, as recorded by this request's earlier attempts.
    done: Map<String, Value>,
}

impl std::fmt::Debug for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phases")
            .field("done", &self.done.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One phase: finished by an earlier attempt (its output), or still to run.
#[derive(Debug)]
pub enum Phase<T> {
    /// An earlier attempt finished it; its recorded output.
    Done(T),
    /// To run now, then [`PhaseRun::finish`].
    Run(PhaseRun<T>),
}

impl Phases {
    /// Phase `name`: its recorded output if an earlier attempt finished it, or a [`PhaseRun`]
    /// to do it. Phases are told apart by name only; give each a name of its own.
    pub fn phase<T: DeserializeOwned>(&self, name: &str) -> Result<Phase<T>, PhaseError> {
        match self.done.get(name) {
            Some(output) => serde_json::from_value(output.clone())
                .map(Phase::Done)
                .map_err(|e| self.error(PhaseErrorKind::Output(e))),
            None => Ok(Phase::Run(PhaseRun {
                slot: self.slot.clone(),
                name: name.to_owned(),
                tx: None,
                output: PhantomData,
            })),
        }
    }

    /// Whether an earlier attempt finished phase `name`.
    pub fn is_done(&self, name: &str) -> bool {
        self.done.contains_key(name)
    }

    /// The final phase's transaction: the request's [`IdempotentTx`], committed by the layer
    /// with the stored response. Take it here, after the foreign phases, rather than as a
    /// second extractor: an `IdempotentTx` extracted up front would hold a connection open
    /// across the foreign calls, and the request's transaction can be lent only once (500).
    pub async fn transaction(&self) -> Result<IdempotentTx, PhaseError> {
        self.slot
            .clone()
            .lend()
            .await
            .map_err(|e| self.error(PhaseErrorKind::Transaction(e)))
    }

    fn error(&self, kind: PhaseErrorKind) -> PhaseError {
        error(&self.slot, kind)
    }
}

fn error(slot: &TxSlot, kind: PhaseErrorKind) -> PhaseError {
    PhaseError {
        kind,
        style: slot.shared.config.error_style,
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Phases {
    type Rejection = PhaseError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(slot) = parts.extensions.get::<Arc<TxSlot>>().cloned() else {
            return Err(PhaseError {
                kind: PhaseErrorKind::NoKey,
                style: ErrorStyle::Problem,
            });
        };
        let Some(held) = &slot.claim else {
            return Err(error(&slot, PhaseErrorKind::NoKey));
        };
        // A key this request's claim created has nothing recorded under it but what this
        // request records: no read (one round trip less on every first execution).
        if held.new_key && !slot.phases_recorded.load(Ordering::Acquire) {
            return Ok(Phases {
                slot,
                done: Map::new(),
            });
        }
        let shared = &slot.shared;
        let recorded = shared
            .store
            .recorded_phases(&held.account, &held.key, held.token);
        let done = match tokio::time::timeout(shared.config.statement_timeout, recorded).await {
            Ok(Ok(Some(done))) => done,
            Ok(Ok(None)) => return Err(error(&slot, PhaseErrorKind::Lost)),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading recorded phases failed");
                return Err(error(&slot, PhaseErrorKind::Unavailable));
            }
            Err(_) => {
                tracing::warn!("reading recorded phases timed out");
                return Err(error(&slot, PhaseErrorKind::Unavailable));
            }
        };
        Ok(Phases { slot, done })
    }
}

/// A phase to run: write its local effects through [`tx`](Self::tx) (if any), make its
/// foreign call (with the request's key), then [`finish`](Self::finish) it with its output.
pub struct PhaseRun<T> {
    slot: Arc<TxSlot>,
    name: String,
    /// The phase's own transaction, opened on first use; committed with its record.
    tx: Option<RequestTx>,
    output: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for PhaseRun<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseRun")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize> PhaseRun<T> {
    /// The phase's transaction, opened on first use: what is written here commits with the
    /// phase's record, or not at all.
    pub async fn tx(&mut self) -> Result<&mut PgConnection, PhaseError> {
        let tx = self.take_tx().await?;
        Ok(&mut **self.tx.insert(tx))
    }

    /// The phase's transaction, taken out of it: the one already open, or a new one.
    async fn take_tx(&mut self) -> Result<RequestTx, PhaseError> {
        match self.tx.take() {
            Some(tx) => Ok(tx),
            None => begin(&self.slot.shared)
                .await
                .ok_or_else(|| self.error(PhaseErrorKind::Unavailable)),
        }
    }

    /// Finishes the phase without a commit of its own: its outcome is kept by the request's
    /// final commit, the one that stores the response. For a phase after which nothing leaves
    /// the database before the final phase (a provider's answer that the final phase writes
    /// down): a record here would buy only that a retry after the final commit failed skips
    /// this phase, at one more commit on every request. So the phase must be safe to run again
    /// on such a retry; a foreign phase is, when it passes the request's key on.
    ///
    /// A phase that wrote through [`tx`](Self::tx) is recorded and committed as by
    /// [`finish`](Self::finish): its writes need their commit.
    pub async fn finish_with_response(self, output: T) -> Result<T, PhaseError> {
        if self.tx.is_some() {
            return self.finish(output).await;
        }
        let config = &self.slot.shared.config;
        config
            .fault(|| FaultPoint::PhaseRan(self.name.clone()))
            .await;
        Ok(output)
    }

    /// Records the phase as finished with `output`, in one commit with what it wrote through
    /// [`tx`](Self::tx), and hands `output` back. A retry of the request then gets
    /// [`Phase::Done`] with it.
    pub async fn finish(mut self, output: T) -> Result<T, PhaseError> {
        let value =
            serde_json::to_value(&output).map_err(|e| self.error(PhaseErrorKind::Output(e)))?;
        let shared = self.slot.shared.clone();
        let config = &shared.config;
        config
            .fault(|| FaultPoint::PhaseRan(self.name.clone()))
            .await;
        let Some(held) = self.slot.claim.clone() else {
            return Err(self.error(PhaseErrorKind::NoKey));
        };
        let mut tx = self.take_tx().await?;
        let bound = config.statement_timeout;
        let record = shared.store.record_phase_in(
            &mut tx,
            &held.account,
            &held.key,
            held.token,
            &self.name,
            &value,
        );
        let kind = match tokio::time::timeout(bound, record).await {
            Ok(Ok(Ownership::Owned { .. })) => {
                // From here the record may be committed (a failed or timed-out commit can still
                // have happened): a later `Phases` of this request must read the records.
                self.slot.phases_recorded.store(true, Ordering::Release);
                match tokio::time::timeout(bound, tx.commit()).await {
                    Ok(Ok(())) => {
                        config
                            .fault(|| FaultPoint::PhaseCommitted(self.name.clone()))
                            .await;
                        return Ok(output);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, phase = self.name, "committing a phase failed");
                        return Err(self.error(PhaseErrorKind::Unavailable));
                    }
                    Err(_) => {
                        tracing::warn!(phase = self.name, "committing a phase timed out");
                        return Err(self.error(PhaseErrorKind::Unavailable));
                    }
                }
            }
            Ok(Ok(Ownership::Lost)) => PhaseErrorKind::Lost,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, phase = self.name, "recording a phase failed");
                PhaseErrorKind::Unavailable
            }
            Err(_) => PhaseErrorKind::Unavailable,
        };
        // Dropping the transaction rolls it back; bounded, as every call here.
        let _ = tokio::time::timeout(bound, tx.rollback()).await;
        Err(self.error(kind))
    }

    fn error(&self, kind: PhaseErrorKind) -> PhaseError {
        error(&self.slot, kind)
    }
}

/// Why a phase could not run or be recorded. As a response: 409 (lost claim), 503 with
/// `Retry-After` (PostgreSQL unavailable), 500 otherwise; each gives the key back with its
/// progress kept, so the retry resumes.
#[derive(Debug)]
pub struct PhaseError {
    kind: PhaseErrorKind,
    /// The layer's error style, for the response.
    style: ErrorStyle,
}

/// The kinds of [`PhaseError`].
#[derive(Debug, thiserror::Error)]
pub enum PhaseErrorKind {
    /// `Phases` used on a request the layer holds no key for (500).
    #[error("phases need a request the idempotency layer claimed a key for")]
    NoKey,
    /// The claim was taken over (this request stalled past its lease): nothing recorded (409).
    #[error("the idempotency claim was taken over; the phase was rolled back")]
    Lost,
    /// PostgreSQL could not open, record or commit now (503).
    #[error("the idempotency store is unavailable")]
    Unavailable,
    /// A phase's output could not be written or read as JSON (500).
    #[error("phase output is not JSON: {0}")]
    Output(#[source] serde_json::Error),
    /// The final transaction could not be lent.
    #[error("the request's transaction: {0:?}")]
    Transaction(TxRejection),
    /// The handler's own failure inside a phase (500; see [`PhaseError::handler`]).
    #[error("handler: {0}")]
    Handler(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl PhaseError {
    /// A handler's own error inside a phase, answered with 500 (the key is released with its
    /// progress, so the retry resumes at this phase).
    pub fn handler(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        PhaseError {
            kind: PhaseErrorKind::Handler(Box::new(error)),
            style: ErrorStyle::Problem,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> &PhaseErrorKind {
        &self.kind
    }
}

impl std::fmt::Display for PhaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for PhaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

impl IntoResponse for PhaseError {
    fn into_response(self) -> Response {
        let rejection = match self.kind {
            PhaseErrorKind::Lost => Rejection::InProgress(std::time::Duration::from_secs(1)),
            PhaseErrorKind::Unavailable => Rejection::Unavailable,
            PhaseErrorKind::Transaction(rejection) => return rejection.into_response(),
            PhaseErrorKind::NoKey | PhaseErrorKind::Output(_) | PhaseErrorKind::Handler(_) => {
                tracing::error!(error = %self.kind, "phase failed");
                Rejection::Internal
            }
        };
        rejection.into_response(self.style)
    }
}
