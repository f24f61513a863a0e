//! Where the settings come from, later wins: the embedded `config/default.toml`, the file given
//! with `--config`, then the environment (the fixed names of the design, and
//! `DEDUP_<SECTION>__<KEY>` for any other key).

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};

use super::{LogSettings, Settings, DEFAULT_TOML};

/// The name of the defaults' layer, in messages ("from …") and to tell a value the user gave
/// from a default (a deprecated key beside its new spelling is refused only if the user gave
/// both).
pub(super) const DEFAULTS_NAME: &str = "the built-in defaults (config/default.toml)";

/// Fixed environment names and the keys they set.
const FIXED_ENV: &[(&str, &str)] = &[
    ("DATABASE_URL", "database_url"),
    ("DEDUP_LISTEN", "http.listen"),
    ("DEDUP_TRANSPORT", "transport.kind"),
    ("AMQP_URL", "transport.amqp_url"),
    ("DEDUP_QUEUE", "transport.queue"),
    ("STRIPE_WEBHOOK_SECRET", "stripe.secrets"),
    ("DEDUP_SINK", "outbox.sink"),
    ("DEDUP_SINK_SIGNING_SECRET", "outbox.signing_secret"),
    ("STRIPE_API_BASE", "stripe.api_base"),
    ("STRIPE_API_KEY", "stripe.api_key"),
];

/// The embedded defaults as a layer, named [`DEFAULTS_NAME`].
struct Defaults;

impl Provider for Defaults {
    fn metadata(&self) -> Metadata {
        Metadata::named(DEFAULTS_NAME)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Toml::string(DEFAULT_TOML).data()
    }
}

/// The embedded defaults alone, the first layer of every configuration (tests add theirs on
/// top).
pub fn defaults() -> Figment {
    Figment::from(Defaults)
}

impl Settings {
    /// The layered sources, before extraction (tests add their own layers on top).
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut figment = defaults();
        if let Some(path) = file {
            figment = figment.merge(Toml::file_exact(path));
        }
        let fixed = Env::raw()
            .only(&FIXED_ENV.iter().map(|(name, _)| *name).collect::<Vec<_>>())
            .map(|name| {
                let key = FIXED_ENV
                    .iter()
                    .find(|(env, _)| name.as_str().eq_ignore_ascii_case(env))
                    .map(|(_, key)| *key)
                    .unwrap_or("");
                key.into()
            });
        // DEDUP_<SECTION>__<KEY>; the fixed DEDUP_* names have no `__` and are excluded.
        let nested = Env::prefixed("DEDUP_")
            .filter(|key| key.as_str().contains("__"))
            .split("__");
        figment.merge(fixed).merge(nested)
    }

    /// The `[log]` settings alone, from the same layers, so logging is set up before the rest is
    /// validated (whose errors are then logged as configured); defaults if they do not parse
    /// (the full load reports why).
    pub fn log_settings(file: Option<&Path>) -> LogSettings {
        Self::figment(file).extract_inner("log").unwrap_or_default()
    }
}
