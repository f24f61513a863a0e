//! What one request holds of its key, and how each way out lets go of it.
//!
//! A request can hold two things. The Redis short lock is a hint that keeps duplicates off
//! PostgreSQL; it is never the authority, so losing it (Redis down, flushed, the lock expired)
//! only costs a PostgreSQL statement. The PostgreSQL claim token is the authority: while it is
//! held, the request's lease is extended by a heartbeat, and every write with it (complete,
//! release) only touches the row if the token is still there, so a request whose lease was
//! taken over writes nothing over the new holder.
//!
//! Letting go is never allowed to fail the answer: Redis trouble leaves the lock to
//! `unlock_when_back` or its TTL (the lease), a failed release to the lease running out. Only
//! storing a result matters enough to keep trying after the client has its answer, since a
//! result not stored means a retry after the lease runs the operation again.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis")]
use super::cache_error;
use super::tx::{HeldKey, Lent};
use super::{outcome, IdempotencyConfig, Shared};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::records::{ClaimToken, Ownership, StoredResponse};
#[cfg(feature = "redis")]
use crate::redis::CachedResponse;
use crate::store::RequestTx;

/// One request's key, and the short lock once taken: before the claim, all it may hold.
pub(super) struct KeyHold {
    pub(super) shared: Arc<Shared>,
    /// The scope the key lives in.
    pub(super) account: String,
    pub(super) key: IdempotencyKey,
    /// The request's fingerprint: what a result stored under the key is checked against.
    pub(super) fingerprint: Fingerprint,
    /// The Redis short lock's value, while this request holds it.
    #[cfg(feature = "redis")]
    pub(super) lock: Option<String>,
}

impl KeyHold {
    /// A key this request holds nothing of yet.
    pub(super) fn new(
        shared: Arc<Shared>,
        account: String,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Self {
        KeyHold {
            shared,
            account,
            key,
            fingerprint,
            #[cfg(feature = "redis")]
            lock: None,
        }
    }

    /// Copies a stored result to Redis under its remaining TTL, dropping the short lock in the
    /// same call. If Redis fails, the lock is dropped once it is back, or lapses with the lease
    /// it was taken with.
    #[cfg(feature = "redis")]
    pub(super) async fn mirror(&self, response: &StoredResponse, ttl: Duration) {
        let Some(cache) = &self.shared.redis else {
            return;
        };
        let cached = CachedResponse {
            fingerprint: self.fingerprint,
            response: response.clone(),
        };
        let (account, key, lock) = (&self.account, self.key.as_str(), self.lock.as_deref());
        if let Err(e) = cache.store(account, key, lock, &cached, ttl).await {
            cache_error(&e, "mirroring idempotent result to redis failed");
            if let Some(token) = lock {
                // The lock was taken with the lease as its TTL (see `flow::lock`).
                cache.unlock_when_back(account, key, token, self.shared.config.lease);
            }
        }
    }

    /// Without the `redis` feature there is no mirror.
    #[cfg(not(feature = "redis"))]
    pub(super) async fn mirror(&self, _: &StoredResponse, _: Duration) {}

    /// Drops the short lock, if held, so that a duplicate goes to PostgreSQL at once instead of
    /// being told 409 until the lock lapses.
    #[cfg(feature = "redis")]
    pub(super) async fn unlock(&self) {
        let (Some(cache), Some(token)) = (&self.shared.redis, self.lock.as_deref()) else {
            return;
        };
        let (account, key) = (&self.account, self.key.as_str());
        if let Err(e) = cache.unlock(account, key, token).await {
            cache_error(&e, "redis unlock failed");
            cache.unlock_when_back(account, key, token, self.shared.config.lease);
        }
    }

    /// Without the `redis` feature no short lock is ever taken.
    #[cfg(not(feature = "redis"))]
    pub(super) async fn unlock(&self) {}
}

/// A key this request has claimed in PostgreSQL: the handler may run. Consumed by
/// [`release`](Self::release) or [`store`](Self::store), the only two ways out.
pub(super) struct HeldClaim {
    hold: KeyHold,
    token: ClaimToken,
    /// The claim created the key's row, so nothing is recorded under it yet: the request's
    /// [`Phases`](super::Phases) need not read its records.
    new_key: bool,
    /// Extends the lease for as long as the outcome is not recorded (handler, response body,
    /// storing the result, retries included).
    heartbeat: Heartbeat,
}

impl HeldClaim {
    /// Holds the claim `token` gives, and starts its lease heartbeat.
    pub(super) fn start(hold: KeyHold, token: ClaimToken, new_key: bool) -> Self {
        let heartbeat = Heartbeat::start(
            hold.shared.clone(),
            hold.account.clone(),
            hold.key.as_str().to_owned(),
            token,
        );
        HeldClaim {
            hold,
            token,
            new_key,
            heartbeat,
        }
    }

    /// The key, for logs.
    pub(super) fn key(&self) -> &str {
        self.hold.key.as_str()
    }

    /// The layer.
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.hold.shared
    }

    /// The key as the request's phases record under it.
    pub(super) fn held_key(&self) -> HeldKey {
        HeldKey {
            account: self.hold.account.clone(),
            key: self.hold.key.as_str().to_owned(),
            token: self.token,
            new_key: self.new_key,
        }
    }

    /// The layer's configuration.
    pub(super) fn config(&self) -> &IdempotencyConfig {
        &self.hold.shared.config
    }

    /// Gives the key up so that a retry executes again (5xx results, panics, failed bodies).
    pub(super) async fn release(self) {
        let HeldClaim {
            hold,
            token,
            heartbeat,
            ..
        } = self;
        drop(heartbeat);
        let key = hold.key.as_str();
        let release = hold.shared.store.release(&hold.account, key, token);
        match tokio::time::timeout(hold.shared.config.statement_timeout, release).await {
            Ok(Ok(Ownership::Owned { .. })) => {}
            Ok(Ok(Ownership::Lost)) => {
                tracing::warn!(key, "idempotency claim already taken over")
            }
            // The lease will end and a retry will take over.
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing idempotency key failed"),
            Err(_) => tracing::warn!(key, "releasing idempotency key timed out"),
        }
        hold.unlock().await;
    }

    /// Stores the result of the operation, which has run: it must be stored, or a retry after
    /// the lease would run it again. A few quick tries here; if the store is still failing, the
    /// client gets its answer now and a background task keeps trying (with the heartbeat
    /// alive) for up to the key's TTL.
    pub(super) async fn store(self, stored: StoredResponse) {
        if self.try_store(&stored, 4).await {
            return;
        }
        outcome("store_retrying");
        let tasks = self.hold.shared.tasks.clone();
        tasks.spawn(self.store_until_ttl(stored));
    }

    /// One attempt: `Some(true)` stored, `Some(false)` the claim was lost, `None` store error.
    async fn attempt(&self, stored: &StoredResponse) -> Option<bool> {
        let (hold, key) = (&self.hold, self.key());
        match hold
            .shared
            .store
            .complete(&hold.account, key, self.token, stored)
            .await
        {
            Ok(Ownership::Owned { ttl }) => {
                hold.mirror(stored, ttl).await;
                outcome("executed");
                Some(true)
            }
            Ok(Ownership::Lost) => {
                tracing::error!(
                    key,
                    "idempotency claim was taken over before completion; result not stored"
                );
                outcome("lost_claim");
                Some(false)
            }
            Err(e) => {
                tracing::warn!(error = %e, key, "storing idempotent result failed; will retry");
                None
            }
        }
    }

    /// Up to `tries` quick attempts; false if the store kept failing.
    async fn try_store(&self, stored: &StoredResponse, tries: u32) -> bool {
        for attempt in 1..=tries {
            if self.attempt(stored).await.is_some() {
                return true;
            }
            if attempt < tries {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
        }
        false
    }

    /// Keeps trying with capped backoff until stored, lost, or the key's TTL has passed.
    async fn store_until_ttl(self, stored: StoredResponse) {
        let deadline = tokio::time::Instant::now() + self.config().ttl;
        let mut delay = Duration::from_millis(500);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(delay).await;
            if self.attempt(&stored).await.is_some() {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
        tracing::error!(
            key = self.key(),
            "gave up storing an idempotent result; a retry may run again"
        );
        outcome("store_error");
    }
}

/// How a transactional request's commit ended (see [`HeldClaim::commit`]).
pub(super) enum Committed {
    /// The handler's writes and the stored response are committed together.
    Stored,
    /// The claim was taken over before the completion: nothing of this request was committed,
    /// and the request that took it over is the one that counts.
    Lost,
    /// The completion or the commit failed: the key is released if it still was ours (or its
    /// lease lapses), and the retry either replays what did commit or runs afresh.
    Failed,
    /// The handler left its transaction unfit to commit (a transaction of its own left open on
    /// it): everything was rolled back and the key released.
    Refused,
}

impl HeldClaim {
    /// Transactional mode ([`super::tx`]): stores the result inside `tx`, the transaction the
    /// handler wrote in, as its last statement, and commits both at once. The heartbeat keeps
    /// the lease until the outcome is known; Redis is mirrored only once it is committed.
    pub(super) async fn commit(self, mut tx: RequestTx, stored: &StoredResponse) -> Committed {
        let (hold, key) = (&self.hold, self.key());
        let bound = hold.shared.config.statement_timeout;
        let completion =
            hold.shared
                .store
                .complete_in(&mut tx, &hold.account, key, self.token, stored);
        let ttl = match tokio::time::timeout(bound, completion).await {
            Ok(Ok(Ownership::Owned { ttl })) => ttl,
            Ok(Ok(Ownership::Lost)) => {
                tracing::error!(
                    key,
                    "idempotency claim was taken over before completion; the handler's writes are rolled back"
                );
                rollback(tx, bound).await;
                outcome("lost_claim");
                return Committed::Lost;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, key, "storing idempotent result in the handler's transaction failed; rolled back");
                rollback(tx, bound).await;
                self.release().await;
                outcome("store_error");
                return Committed::Failed;
            }
            Err(_) => {
                tracing::warn!(
                    key,
                    "storing idempotent result in the handler's transaction timed out; rolled back"
                );
                rollback(tx, bound).await;
                self.release().await;
                outcome("store_error");
                return Committed::Failed;
            }
        };
        match tokio::time::timeout(bound, tx.commit()).await {
            Ok(Ok(())) => {
                let HeldClaim {
                    hold, heartbeat, ..
                } = self;
                drop(heartbeat);
                hold.mirror(stored, ttl).await;
                outcome("executed");
                Committed::Stored
            }
            Ok(Err(e)) if e.handlers_fault() => {
                tracing::error!(error = %e, key, "the idempotent transaction was not committed");
                self.release().await;
                outcome("store_error");
                Committed::Refused
            }
            failed => {
                // The commit may or may not have happened (the connection can die after
                // PostgreSQL committed). The release is guarded by the token and by the row
                // still being in progress: it gives the key back only if nothing committed, and
                // waits on the row while the commit is still being decided.
                match failed {
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, key, "committing the idempotent transaction failed")
                    }
                    _ => tracing::warn!(key, "committing the idempotent transaction timed out"),
                }
                self.release().await;
                outcome("store_error");
                Committed::Failed
            }
        }
    }

    /// Nothing of the request is kept (its result gives the key back, or the handler failed):
    /// the writes it made in its transaction, if any, are rolled back, and the key released.
    pub(super) async fn give_up(self, lent: Lent) {
        if let Lent::Tx(tx) = lent {
            rollback(tx, self.config().statement_timeout).await;
        }
        self.release().await;
    }
}

/// Rolls back, bounded; if that fails the connection is dropped and PostgreSQL rolls back when
/// it closes.
async fn rollback(tx: RequestTx, bound: Duration) {
    match tokio::time::timeout(bound, tx.rollback()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "rolling back the idempotent transaction failed"),
        Err(_) => tracing::warn!("rolling back the idempotent transaction timed out"),
    }
}

/// Extends the lease every third of it until dropped: a task of its own, so a slow store call
/// never stalls the handler, and a live request's lease never lapses.
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
