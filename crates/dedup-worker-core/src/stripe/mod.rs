//! Stripe: the shapes in which it delivers a change ([`shape`]: snapshot events, thin events,
//! EventBridge envelopes, and the dedup key of each) and its HTTP API ([`api`]: listing events
//! for the backfill, fetching a thin event's full event for the consumer), with timeouts, size
//! limits and retries. Its signature is `signature::stripe`'s.

pub mod api;
pub mod shape;

pub use api::{ApiError, RetryPolicy, StripeApi};
pub use shape::{
    eventbridge_detail, eventbridge_envelope, stripe_change, thin_event_beside, EnvelopeError,
    EventBridgeEnvelope, StripeChange, StripeEventHead, StripeShapeError, ThinEventError, SOURCE,
};
