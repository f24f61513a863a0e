//! `POST /webhooks/standard`, the optional second provider: its keys from the configuration.
//! The verification itself (`v1` HMAC, `v1a` ed25519, the bounds on the work) is
//! `signature::standard`'s.

use std::sync::Arc;

use crate::config::StandardWebhookSettings;
use crate::signature::ed25519::StandardPublicKey;
use crate::signature::standard::StandardKeys;

/// `/webhooks/standard`'s configuration, secrets already decoded.
#[derive(Clone)]
pub struct StandardProvider {
    /// HMAC keys (`v1`), each tried (rotation).
    pub keys: Arc<Vec<Vec<u8>>>,
    /// Ed25519 public keys (`v1a`), each tried.
    pub public_keys: Arc<Vec<StandardPublicKey>>,
    /// Accepted clock difference in both directions.
    pub tolerance_secs: u64,
    /// Source half of the dedup key (the id is `webhook-id`).
    pub source: String,
}

impl StandardProvider {
    /// The provider, or `None` when neither a secret nor a public key is configured (the route
    /// is then not served).
    pub fn from_settings(settings: &StandardWebhookSettings) -> Option<Self> {
        (!settings.secrets.is_empty() || !settings.public_keys.is_empty()).then(|| {
            StandardProvider {
                keys: Arc::new(settings.secrets.iter().map(|s| s.key().to_vec()).collect()),
                public_keys: Arc::new(settings.public_keys.clone()),
                tolerance_secs: settings.tolerance.as_secs(),
                source: settings.source.clone(),
            }
        })
    }

    /// The keys to verify a delivery with.
    pub fn verifying_keys(&self) -> StandardKeys<'_> {
        StandardKeys {
            secrets: &self.keys,
            public_keys: &self.public_keys,
        }
    }
}
