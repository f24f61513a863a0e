//! Idempotency-Key layer for synchronous HTTP APIs (IETF
//! draft-ietf-httpapi-idempotency-key-header and Stripe's documented behaviour).
//!
//! What it offers, all at the crate root:
//! - [`IdempotencyLayer`] (built with [`IdempotencyLayer::builder`]): the tower/axum layer;
//!   a handler that writes through an [`IdempotentTx`] or splits its work into [`Phases`]
//!   commits its writes with the stored result;
//! - [`PgIdempotencyStore`]: the PostgreSQL key store, the source of truth (concurrent writes
//!   grouped, [`GroupOptions`]), created by [`migrate`], and its expired keys' collection;
//! - [`RedisCache`] (feature `redis`): the optional Redis fast path in front of it;
//! - [`IdempotentClient`] (feature `client`): a client that retries with one key until it gets
//!   an answer;
//! - [`IdempotencyKey`] and [`Fingerprint`]: a key as the header carries it, and the request
//!   it was first used for;
//! - the errors: [`StoreError`], [`CacheError`], [`ClientError`], [`KeyError`], and the answers
//!   the layer gives itself ([`Rejection`], [`TxRejection`], [`PhaseError`]).
//!
//! How the store claims, completes and releases a key, and how the layer uses Redis, is the
//! crate's own business: no service implements a store of its own (the layer takes a
//! [`PgIdempotencyStore`]), so that protocol is private, and can change without breaking anyone.
//!
//! Cargo features: `redis` (the fast path, on the `redis` crate) and `client` (the retrying
//! client, on `reqwest`), both on by default; with `default-features = false` neither crate is
//! built, and the layer answers from PostgreSQL alone. `test-util` (off) opens the store's
//! protocol, its statement counter and the layer's crash points to this crate's own tests
//! (module `test_util`); it is not part of the promised surface.
//!
//! The checkout example (`examples/checkout`, crate `idempotency-key-checkout`) shows all of
//! them in one service. Inside, the modules are private: `key.rs`, `fingerprint/`, `layer/`
//! (the request flow, the held claim, rejections, the transaction, phases), `records.rs`,
//! `store/` and `group/`, `redis.rs`, `client.rs`.
//!
//! Guarantees:
//! - for one `(account, key)`, the wrapped handler runs at most once while the key lives
//!   (24 h by default), however many requests, processes or Redis failures there are; the
//!   PostgreSQL primary key decides every race;
//! - a retry gets the stored status, the headers that matter and the body, with
//!   `Idempotent-Replayed: true`; 5xx results release the key (unless `keep_5xx`);
//! - a crashed request's key is refused with 409 until its lease lapses, then one retry takes it
//!   over; a request whose lease was taken over cannot store its result over the new one;
//! - a handler that writes through an [`IdempotentTx`] commits its rows and the stored result
//!   in one transaction: a crash leaves both or neither, so the retry replays or runs once;
//! - a handler split into [`Phases`] records each finished phase with its writes; a retry after
//!   a crash or a 5xx resumes at the first unfinished phase;
//! - reusing a key for a different request is refused with 422 and changes nothing.

#[cfg(feature = "client")]
mod client;
mod fingerprint;
mod group;
mod key;
mod layer;
mod records;
#[cfg(feature = "redis")]
mod redis;
mod store;
#[cfg(feature = "test-util")]
pub mod test_util;

#[cfg(test)]
mod proptest_support;

#[cfg(feature = "client")]
pub use client::{ClientError, ClientResponse, IdempotentClient, RetryPolicy};
pub use fingerprint::Fingerprint;
pub use group::GroupOptions;
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use layer::{
    ErrorStyle, IdempotencyLayer, IdempotencyLayerBuilder, IdempotencyService, IdempotentTx,
    NotExecuted, Phase, PhaseError, PhaseErrorKind, PhaseRun, Phases, Rejection, TxRejection,
    IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, MAX_ACCOUNT_LEN,
};
pub use records::StoreError;
#[cfg(feature = "redis")]
pub use redis::{CacheError, RedisCache};
pub use store::PgIdempotencyStore;

/// Applies the crate's PostgreSQL migrations, this module's table included.
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), StoreError> {
    PgIdempotencyStore::migrate(pool).await
}
