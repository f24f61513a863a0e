//! `/webhooks/stripe`'s provider: its secrets and tolerance. The verifier itself is
//! `signature::stripe`, shared with the consumer (which checks the signature the ingress
//! carried with the message before it trusts an event's `created`).

use std::sync::Arc;

use crate::config::StripeSettings;

/// `/webhooks/stripe`'s configuration, as [`StandardProvider`](super::standard::StandardProvider)
/// is `/webhooks/standard`'s.
#[derive(Clone)]
pub struct StripeProvider {
    /// Signing secrets (`whsec_…`), each tried (rotation).
    pub secrets: Arc<Vec<String>>,
    /// Accepted clock difference in both directions.
    pub tolerance_secs: u64,
    /// Source half of the dedup key for these events (the id is the event's `id`).
    pub source: &'static str,
}

impl StripeProvider {
    pub fn from_settings(settings: &StripeSettings) -> Self {
        StripeProvider {
            secrets: Arc::new(
                settings
                    .secrets
                    .iter()
                    .map(|s| s.expose().to_owned())
                    .collect(),
            ),
            tolerance_secs: settings.tolerance.as_secs(),
            source: crate::stripe::SOURCE,
        }
    }
}
