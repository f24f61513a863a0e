//! `[retention]`: how long the history is kept (event bodies, per-minute counts, the action
//! log), and `[search]`: where in a body the fields the console searches by are.
//!
//! The dedup window (`consumer.dedup_retention_days`) and the outbox's (`outbox.retention_hours`)
//! stay with their sections: they are about the pipeline's work, these about its record.

use serde::Deserialize;

use super::{check_pointer, ConfigError};

/// The longest `retention.payload_days` and `retention.history_days` accepted: ten years. Past
/// it the number is a typo, and one partition a day would be 3,650 tables.
pub const MAX_RETENTION_DAYS: u32 = 3_650;

/// `[retention]`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Days a handled event's body (and, later, each delivery attempt) is kept; 0 keeps none.
    /// Bodies carry personal data, so they are kept shorter than the ids (14 by default: the
    /// book's "Retention" says why).
    pub payload_days: u32,
    /// Days the per-minute counts and the console's and CLI's action log are kept.
    pub history_days: u32,
}

impl RetentionSettings {
    /// Whether bodies are kept at all (`payload_days > 0`).
    pub fn keeps_payloads(&self) -> bool {
        self.payload_days > 0
    }
}

/// `[search]`: the JSON pointers whose values are kept beside each body, indexed, so the console
/// finds an object's or a customer's events without reading bodies.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    /// Where the object an event is about has its id (Stripe: `/data/object/id`).
    pub object_pointer: String,
    /// Where the customer an event is about is (Stripe: `/data/object/customer`).
    pub customer_pointer: String,
}

impl SearchSettings {
    /// Refuses a pointer that is not one (RFC 6901), naming the key.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        for (key, pointer) in [
            ("search.object_pointer", &self.object_pointer),
            ("search.customer_pointer", &self.customer_pointer),
        ] {
            check_pointer(pointer).map_err(|reason| ConfigError::invalid_at(key, reason))?;
        }
        Ok(())
    }
}
