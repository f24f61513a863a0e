//! The HTTP ingress: signature schemes and the routes that receive webhooks (Stripe's, Standard
//! Webhooks', and the named senders of `[sources.NAME]` in [`sources`]).
//!
//! Guarantee: a 2xx is answered only after the event is durable in the transport; anything that
//! prevents that is a non-2xx (400 for bad input, 413 for an oversized body, 503 when the
//! transport or store is down), so the provider retries.

pub mod deliver;
pub mod ingress;
pub mod sources;
pub mod standard;
pub mod stripe;

pub use ingress::{router, Clock, IngressState};
pub use standard::StandardProvider;
pub use stripe::StripeProvider;
