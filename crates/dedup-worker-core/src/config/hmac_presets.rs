//! Named presets of `scheme = "hmac"`, as data: `hmac_presets.toml`, compiled in. Each entry is
//! a sender's documented rules (the `doc` URL says where they are documented), an `hmac` table
//! of the same keys as `[sources.NAME.hmac]`, and the tolerance its documentation states. A
//! source's own `hmac` table overrides its preset's, field by field (`super::hmac::resolve`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use figment::providers::{Format, Toml};
use figment::Figment;
use serde::Deserialize;

use super::hmac_settings::HmacSettings;

/// The presets, as shipped.
const PRESETS_TOML: &str = include_str!("hmac_presets.toml");

/// One named preset.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Where the sender documents its scheme (a URL).
    pub doc: String,
    /// Anything a user of the preset must know (a batch body, an unanswered handshake).
    #[serde(default)]
    pub caveat: Option<String>,
    /// The tolerance the sender's documentation states, when it signs a timestamp.
    #[serde(default)]
    pub tolerance_secs: Option<u64>,
    /// The rules.
    pub hmac: HmacSettings,
}

/// Every preset by name, parsed once; why the shipped file does not parse otherwise (a unit
/// test keeps that from shipping).
pub fn presets() -> Result<&'static BTreeMap<String, Preset>, String> {
    static PARSED: OnceLock<Result<BTreeMap<String, Preset>, String>> = OnceLock::new();
    PARSED
        .get_or_init(|| {
            Figment::from(Toml::string(PRESETS_TOML))
                .extract()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The preset named `name`, if there is one.
pub fn preset(name: &str) -> Result<Option<&'static Preset>, String> {
    Ok(presets()?.get(name))
}

/// The presets' names, comma-separated, for a message.
pub fn preset_names() -> String {
    presets()
        .map(|all| {
            all.keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}
