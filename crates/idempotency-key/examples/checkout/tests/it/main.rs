//! The checkout example's tests, one binary (`cargo test -p idempotency-key-checkout`), against
//! the real PostgreSQL and Redis, each test on a database and Redis key prefix of its own
//! ([`helpers`]):
//!
//! * [`phases`]: recovery points: the checkout killed between any two phases, retried by the
//!   client helper, charges once and answers the same;
//! * [`client`]: the double-charge timeline: a lost response and a retry charge once;
//! * [`hostile`]: deep JSON is a 4xx, not a crash; accounts PostgreSQL cannot index are refused
//!   alone.
//!
//! The layer's own tests are its crate's (`cargo test -p idempotency-key`); these need the
//! example's service, which needs the layer's default features, so they live here.

mod client;
mod helpers;
mod hostile;
mod phases;
