//! Signatures, on the ground floor because both ends use them: the ingress verifies what
//! arrives, the HTTP sink signs what it forwards, the consumer checks again the copy the
//! ingress carried, and the configuration parses the keys once at start-up.
//!
//! * [`stripe`]: `Stripe-Signature`, HMAC-SHA256 keyed with the whole `whsec_` string: the
//!   ingress's check within the tolerance, the consumer's check of the carried copy, and
//!   signing (tests, `dedup-worker sign`).
//! * [`standard`]: Standard Webhooks verification, `v1` (HMAC) and `v1a` (ed25519) items, with
//!   the bounds on the work one delivery may cost.
//! * [`secrets`]: Standard Webhooks' `whsec_` secrets decoded into their keys, the MAC both
//!   sides compute, and the sink's signing keys (`whsec_` or `whsk_`).
//! * [`ed25519`]: the `whsk_` secret and `whpk_` public keys of `v1a`.
//! * [`certificate`]: an X.509 certificate's RSA key and validity, for senders that sign with
//!   `SHA256withRSA` (PayPal).
//!
//! It imports nothing of the pipeline: the configuration holds these types, never the reverse.

pub mod certificate;
pub mod ed25519;
pub mod secrets;
pub mod standard;
pub mod stripe;
