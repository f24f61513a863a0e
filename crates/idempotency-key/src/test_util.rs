//! What this crate's own tests reach past the layer (feature `test-util`, off by default): the
//! store's claim protocol, its statement counter, and the points where a test can stop a
//! request. The integration tests (`tests/`), the load harness and the checkout example's tests
//! turn it on through a dev-dependency; a service has no use for it, and it may change in any
//! release.
//!
//! The protocol stays private to the crate ([`crate::PgIdempotencyStore`] is the only store,
//! and the layer its only caller); these traits lend it to the tests under the same names, so
//! a test reads `store.claim(…)` as the layer's own code does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use crate::layer::BoxFuture;
pub use crate::layer::FaultPoint;
pub use crate::records::{Claim, ClaimToken, Ownership, StoredResponse};
use crate::{Fingerprint, IdempotencyLayerBuilder, PgIdempotencyStore, StoreError};

/// The PostgreSQL store's claim protocol, as the layer drives it for each request.
pub trait StoreProtocol {
    /// Claims `(account, key)` for a request with `fingerprint`, or reports what holds it.
    fn claim(
        &self,
        account: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Stores the response of a claimed request; `Lost` if its lease was taken over.
    fn complete(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<Ownership, StoreError>> + Send;

    /// Gives the key up so that a retry executes again.
    fn release(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
    ) -> impl Future<Output = Result<Ownership, StoreError>> + Send;

    /// Extends the lease of a claim still held (the heartbeat).
    fn extend(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        lease: Duration,
    ) -> impl Future<Output = Result<Ownership, StoreError>> + Send;

    /// How many statements the store has sent to PostgreSQL (a replay from Redis sends none).
    fn query_count(&self) -> u64;
}

impl StoreProtocol for PgIdempotencyStore {
    async fn claim(
        &self,
        account: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim_noting_new(account, key, fingerprint, lease, ttl)
            .await
            .map(|(claim, _)| claim)
    }

    async fn complete(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        response: &StoredResponse,
    ) -> Result<Ownership, StoreError> {
        PgIdempotencyStore::complete(self, account, key, token, response).await
    }

    async fn release(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
    ) -> Result<Ownership, StoreError> {
        PgIdempotencyStore::release(self, account, key, token).await
    }

    async fn extend(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<Ownership, StoreError> {
        PgIdempotencyStore::extend(self, account, key, token, lease).await
    }

    fn query_count(&self) -> u64 {
        PgIdempotencyStore::query_count(self)
    }
}

/// A crash point for the layer's requests.
pub trait LayerFaults {
    /// Awaits `hook` at each [`FaultPoint`], so a test can stop the process there (drop its
    /// runtime) and show what a crash at that point leaves behind.
    fn fault_hook<F>(self, hook: F) -> Self
    where
        F: Fn(FaultPoint) -> BoxFuture<()> + Send + Sync + 'static;
}

impl LayerFaults for IdempotencyLayerBuilder {
    fn fault_hook<F>(self, hook: F) -> Self
    where
        F: Fn(FaultPoint) -> BoxFuture<()> + Send + Sync + 'static,
    {
        self.set_fault_hook(Arc::new(hook))
    }
}
