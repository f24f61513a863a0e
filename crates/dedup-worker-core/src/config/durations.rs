//! Durations in the configuration: written with their unit (`"500ms"`, `"10s"`, `"2m"`,
//! `"1h 30m"`) and read by humantime, in TOML and in the environment alike
//! (`DEDUP_CONSUMER__POLL_INTERVAL=500ms`).
//!
//! Before this, each was an integer whose unit was in its name (`poll_interval_ms = 500`). Those
//! keys are still read, as their durations, with a warning at start naming the new spelling
//! ([`RENAMED`]); one given in both spellings is refused, as nothing says which one was meant.
//! A refusal of a value given under its old key names the old key, the one the user wrote.

use std::fmt;
use std::time::Duration;

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::{self, Deserializer, Visitor};

use super::layers::DEFAULTS_NAME;
use super::ConfigError;

/// What a duration value says it expects, in every refusal of one.
const EXPECTED: &str = "a duration with its unit, such as \"500ms\", \"10s\" or \"2m\"";

/// The unit an old integer key was counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    Millis,
    Secs,
}

impl Unit {
    fn duration(self, amount: u64) -> Duration {
        match self {
            Unit::Millis => Duration::from_millis(amount),
            Unit::Secs => Duration::from_secs(amount),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Millis => "milliseconds",
            Unit::Secs => "seconds",
        }
    }
}

/// An integer key that became a duration: its old dotted key, its new one, the old one's unit.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Renamed {
    pub(super) old: &'static str,
    pub(super) new: &'static str,
    pub(super) unit: Unit,
}

const fn renamed(old: &'static str, new: &'static str, unit: Unit) -> Renamed {
    Renamed { old, new, unit }
}

/// Every duration setting and the integer key it replaces (a unit test checks that each new
/// key is a duration of `config/default.toml`, `consumer.dedup_window` aside: it has no default).
pub(super) const RENAMED: [Renamed; 23] = {
    use Unit::{Millis, Secs};
    [
        renamed(
            "database.acquire_timeout_ms",
            "database.acquire_timeout",
            Millis,
        ),
        renamed(
            "database.statement_timeout_ms",
            "database.statement_timeout",
            Millis,
        ),
        renamed(
            "http.header_read_timeout_ms",
            "http.header_read_timeout",
            Millis,
        ),
        renamed(
            "http.body_read_timeout_ms",
            "http.body_read_timeout",
            Millis,
        ),
        renamed("http.request_timeout_ms", "http.request_timeout", Millis),
        renamed("stripe.tolerance_secs", "stripe.tolerance", Secs),
        renamed("stripe.api_timeout_ms", "stripe.api_timeout", Millis),
        renamed(
            "standard_webhooks.tolerance_secs",
            "standard_webhooks.tolerance",
            Secs,
        ),
        renamed(
            "transport.publish_timeout_ms",
            "transport.publish_timeout",
            Millis,
        ),
        renamed(
            "transport.sqs_wait_time_secs",
            "transport.sqs_wait_time",
            Secs,
        ),
        renamed("consumer.lease_secs", "consumer.lease", Secs),
        renamed("consumer.step_timeout_ms", "consumer.step_timeout", Millis),
        renamed(
            "consumer.poll_interval_ms",
            "consumer.poll_interval",
            Millis,
        ),
        renamed("consumer.retry_base_ms", "consumer.retry_base", Millis),
        renamed("consumer.retry_max_ms", "consumer.retry_max", Millis),
        renamed("consumer.dedup_window_secs", "consumer.dedup_window", Secs),
        renamed(
            "consumer.retention_interval_secs",
            "consumer.retention_interval",
            Secs,
        ),
        renamed("outbox.poll_interval_ms", "outbox.poll_interval", Millis),
        renamed("outbox.lease_secs", "outbox.lease", Secs),
        renamed("outbox.retry_base_ms", "outbox.retry_base", Millis),
        renamed("outbox.retry_max_ms", "outbox.retry_max", Millis),
        renamed("outbox.http_timeout_ms", "outbox.http_timeout", Millis),
        renamed("shutdown.grace_secs", "shutdown.grace", Secs),
    ]
};

/// Why `tolerance` cannot be a signature's tolerance: the signed timestamps are whole seconds,
/// and so is the skew they are held to. `None` when it is whole seconds.
pub(super) fn not_whole_seconds(tolerance: Duration) -> Option<String> {
    (tolerance.subsec_nanos() != 0)
        .then(|| format!("is {}: it must be whole seconds", shown(tolerance)))
}

/// A duration as written in messages: `1h`, `500ms`, `2m 30s`.
pub(super) fn shown(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// `#[serde(deserialize_with)]` of a duration setting: a string with its unit. A bare number is
/// refused: its unit would be a guess.
pub(super) fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_str(DurationVisitor)
}

/// As [`read`], for a setting that may be absent (with `#[serde(default)]`).
pub(super) fn read_optional<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    read(deserializer).map(Some)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text)
            .map_err(|e| E::custom(format!("`{text}` is not {EXPECTED}: {e}")))
    }
}

/// A source's integer tolerance (`sources.NAME.tolerance_secs`): one per configured source,
/// so it is not in [`RENAMED`], whose keys are fixed.
const SOURCE_TOLERANCE: (&str, &str, Unit) = ("tolerance_secs", "tolerance", Unit::Secs);

/// An old key a configuration was written with, as written (`sources.slack.tolerance_secs`), and
/// the key it is now read under.
#[derive(Debug, PartialEq, Eq)]
struct OldSpelling {
    old: String,
    new: String,
}

/// The old keys a configuration was written with, each now read under its new key.
#[derive(Debug, Default)]
pub(super) struct OldSpellings(Vec<OldSpelling>);

impl OldSpellings {
    /// The deprecation warnings, one per old key: it names the new key and the value in the new
    /// spelling.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|r| {
                format!(
                    "configuration key `{}` is deprecated: write `{}` with a unit \
                     (\"500ms\", \"10s\", \"2m\"); the old key is read for now and will be \
                     removed",
                    r.old, r.new
                )
            })
            .collect()
    }

    /// Logs [`OldSpellings::warnings`], once per load (at start).
    pub(super) fn warn(&self) {
        for warning in self.warnings() {
            tracing::warn!("{warning}");
        }
    }

    /// `error` naming the key as the user wrote it: the old key where the value came from one.
    pub(super) fn as_written(&self, error: ConfigError) -> ConfigError {
        let written = |key: &str| self.0.iter().find(|r| r.new == key).map(|r| r.old.clone());
        match error {
            ConfigError::Invalid { key, reason } => match written(key) {
                Some(old) => ConfigError::InvalidAt { key: old, reason },
                None => ConfigError::Invalid { key, reason },
            },
            ConfigError::InvalidAt { key, reason } => ConfigError::InvalidAt {
                key: written(&key).unwrap_or(key),
                reason,
            },
            other => other,
        }
    }
}

/// Reads each old integer key of `figment` as its new duration key, and refuses one given in
/// both spellings. A figment without old keys is returned as it is.
pub(super) fn adopt_old_keys(figment: Figment) -> Result<(Figment, OldSpellings), ConfigError> {
    // A figment that cannot be read is refused by the extraction, with its own message.
    let Ok(mut data) = figment.data() else {
        return Ok((figment, OldSpellings::default()));
    };
    let mut found = OldSpellings::default();
    let mut note = |old: String, new: String| {
        let spelling = OldSpelling { old, new };
        if !found.0.contains(&spelling) {
            found.0.push(spelling);
        }
    };
    for dict in data.values_mut() {
        for renamed in &RENAMED {
            let (section, _) = renamed.old.split_once('.').unwrap_or(("", renamed.old));
            let Some(Value::Dict(_, section)) = dict.get_mut(section) else {
                continue;
            };
            let key = Key {
                old: renamed.old.to_owned(),
                new: renamed.new.to_owned(),
                unit: renamed.unit,
            };
            if adopt(&figment, section, &key)? {
                note(key.old, key.new);
            }
        }
        if let Some(Value::Dict(_, sources)) = dict.get_mut("sources") {
            let (old_name, new_name, unit) = SOURCE_TOLERANCE;
            for (name, source) in sources.iter_mut() {
                let Value::Dict(_, source) = source else {
                    continue;
                };
                let key = Key {
                    old: format!("sources.{name}.{old_name}"),
                    new: format!("sources.{name}.{new_name}"),
                    unit,
                };
                if adopt(&figment, source, &key)? {
                    note(key.old, key.new);
                }
            }
        }
    }
    if found.0.is_empty() {
        return Ok((figment, found));
    }
    // The rewritten values keep their tags, so refusals still say where each value came from:
    // focusing on a key that does not exist gives an empty figment that keeps `figment`'s
    // profile and its table of sources, and the rewritten data is merged into it.
    let sources = figment.focus("\u{0}no key");
    Ok((Figment::from(sources).merge(Rewritten(data)), found))
}

/// One old key of one table: the dotted keys, as messages name them (the table holds each under
/// its last part).
struct Key {
    old: String,
    new: String,
    unit: Unit,
}

/// The last part of a dotted key: its name in the table that holds it.
fn name_in_table(dotted: &str) -> &str {
    dotted.rsplit_once('.').map_or(dotted, |(_, name)| name)
}

/// Moves `key.old_name` of `section` (the table that holds it) to `key.new_name` as a duration;
/// whether it was there.
fn adopt(figment: &Figment, section: &mut Dict, key: &Key) -> Result<bool, ConfigError> {
    let (old_name, new_name) = (name_in_table(&key.old), name_in_table(&key.new));
    let Some(old) = section.remove(old_name) else {
        return Ok(false);
    };
    if let Some(new) = section.get(new_name) {
        let from_defaults = figment
            .get_metadata(new.tag())
            .is_some_and(|m| m.name == DEFAULTS_NAME);
        if !from_defaults {
            return Err(ConfigError::invalid_at(
                &key.old,
                format!(
                    "is given together with `{}`, its new spelling; keep only `{}`",
                    key.new, key.new
                ),
            ));
        }
    }
    // TOML gives signed integers, the environment unsigned ones.
    let amount = old
        .to_u128()
        .and_then(|n| u64::try_from(n).ok())
        .or_else(|| old.to_i128().and_then(|n| u64::try_from(n).ok()));
    let Some(amount) = amount else {
        return Err(ConfigError::invalid_at(
            &key.old,
            format!(
                "must be a whole number of {} (or write `{}` with its unit, such as \"10s\")",
                key.unit.name(),
                key.new
            ),
        ));
    };
    let duration = shown(key.unit.duration(amount));
    section.insert(new_name.to_owned(), Value::String(old.tag(), duration));
    Ok(true)
}

/// The figment's data after [`adopt_old_keys`], as a layer.
struct Rewritten(Map<Profile, Dict>);

impl Provider for Rewritten {
    fn metadata(&self) -> Metadata {
        Metadata::named("the configuration, with its deprecated keys renamed")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
#[path = "durations_tests.rs"]
mod tests;
