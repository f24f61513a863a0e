//! Upper bounds of the numeric and duration settings, and the conversions of day and hour counts
//! to durations.
//!
//! Every number and duration in `config/default.toml` has a largest accepted value, far above what any
//! deployment needs and far below where the durations and counts made from it could overflow
//! (`dedup_retention_days * 86_400` wraps in a release build: a window of 2⁶⁴ + 61,184 seconds
//! becomes 17 hours, and retention empties a two-day-old dedup generation). A value above its
//! bound refuses the configuration, naming the key; config/default.toml gives each bound beside
//! its key. The conversions saturate as well, so nothing wraps even if a bound is lifted.

use std::time::Duration;

use super::durations::shown;
use super::{invalid, ConfigError, ConsumerSettings, OutboxSettings, Settings, MAX_RETENTION_DAYS};

/// The bound of every timeout, lease and poll interval, and of the signature tolerances.
const HOUR: Duration = Duration::from_secs(3_600);
/// The bound of the retry backoffs and of the retention interval.
const DAY: Duration = Duration::from_secs(86_400);
/// SQS's longest long poll (`WaitTimeSeconds`).
pub(super) const SQS_LONGEST_POLL: Duration = Duration::from_secs(20);
/// 64 MiB: the bound of the body and message sizes.
const SIXTY_FOUR_MIB: u64 = 64 * 1024 * 1024;

/// `days` whole days; saturates instead of wrapping.
pub fn whole_days(days: u64) -> Duration {
    Duration::from_secs(days.saturating_mul(86_400))
}

/// `hours` whole hours; saturates instead of wrapping.
pub fn whole_hours(hours: u64) -> Duration {
    Duration::from_secs(hours.saturating_mul(3_600))
}

/// The largest `consumer.dedup_retention_days`, and in days `consumer.dedup_window`.
const MAX_DEDUP_DAYS: u64 = 3_650;

impl ConsumerSettings {
    /// How long processed ids are kept: `dedup_window` when set, else `dedup_retention_days` as
    /// a duration.
    pub fn dedup_window(&self) -> Duration {
        self.dedup_window
            .unwrap_or_else(|| whole_days(self.dedup_retention_days))
    }

    /// The key that set [`ConsumerSettings::dedup_window`], for error messages.
    pub fn dedup_window_key(&self) -> &'static str {
        match self.dedup_window {
            Some(_) => "consumer.dedup_window",
            None => "consumer.dedup_retention_days",
        }
    }
}

impl OutboxSettings {
    /// `retention_hours` as a duration.
    pub fn retention(&self) -> Duration {
        whole_hours(self.retention_hours)
    }
}

/// Widens any integer setting for the comparison; a negative one counts as 0 (the lower-bound
/// checks refuse those).
fn wide<T: TryInto<u64>>(value: T) -> u64 {
    value.try_into().unwrap_or(0)
}

impl Settings {
    /// Each numeric key, its value and its bound: every integer key of config/default.toml (a
    /// unit test checks both ways, and that the file states each bound beside its key).
    pub(super) fn bounded_values(&self) -> [(&'static str, u64, u64); 25] {
        let (d, h, t, c, o) = (
            &self.database,
            &self.http,
            &self.transport,
            &self.consumer,
            &self.outbox,
        );
        [
            ("database.max_connections", wide(d.max_connections), 1_000),
            (
                "http.body_limit_bytes",
                wide(h.body_limit_bytes),
                SIXTY_FOUR_MIB,
            ),
            ("http.max_header_bytes", wide(h.max_header_bytes), 1_048_576),
            (
                "http.max_concurrent_requests",
                wide(h.max_concurrent_requests),
                1_000_000,
            ),
            ("http.max_connections", wide(h.max_connections), 1_000_000),
            (
                "transport.publish_batch_max",
                wide(t.publish_batch_max),
                10_000,
            ),
            ("transport.publish_writers", wide(t.publish_writers), 256),
            (
                "transport.publish_channel_capacity",
                wide(t.publish_channel_capacity),
                1_000_000,
            ),
            ("transport.delivery_limit", wide(t.delivery_limit), 1_000),
            ("consumer.batch_size", wide(c.batch_size), 10_000),
            ("consumer.workers", wide(c.workers), 256),
            ("consumer.max_attempts", wide(c.max_attempts), 100_000),
            (
                "consumer.dedup_retention_days",
                c.dedup_retention_days,
                MAX_DEDUP_DAYS,
            ),
            (
                "consumer.retention_batch",
                wide(c.retention_batch),
                1_000_000,
            ),
            (
                "consumer.max_message_bytes",
                wide(c.max_message_bytes),
                SIXTY_FOUR_MIB,
            ),
            ("outbox.batch_size", wide(o.batch_size), 10_000),
            ("outbox.concurrency", wide(o.concurrency), 10_000),
            ("outbox.max_attempts", wide(o.max_attempts), 100_000),
            ("outbox.retention_hours", o.retention_hours, 87_600),
            (
                "outbox.response_excerpt_bytes",
                wide(o.response_excerpt_bytes),
                65_536,
            ),
            ("outbox.breaker.failures", wide(o.breaker.failures), 100_000),
            ("outbox.breaker.window", wide(o.breaker.window), 100_000),
            (
                "outbox.breaker.min_requests",
                wide(o.breaker.min_requests),
                100_000,
            ),
            (
                "retention.payload_days",
                wide(self.retention.payload_days),
                wide(MAX_RETENTION_DAYS),
            ),
            (
                "retention.history_days",
                wide(self.retention.history_days),
                wide(MAX_RETENTION_DAYS),
            ),
        ]
    }

    /// Each duration key, its value and its bound: every duration of config/default.toml (a unit
    /// test checks both ways, and that the file states each bound beside its key).
    pub(super) fn bounded_durations(&self) -> [(&'static str, Duration, Duration); 25] {
        let (d, h, st, sw, t) = (
            &self.database,
            &self.http,
            &self.stripe,
            &self.standard_webhooks,
            &self.transport,
        );
        let (c, o) = (&self.consumer, &self.outbox);
        [
            ("database.acquire_timeout", d.acquire_timeout, HOUR),
            ("database.statement_timeout", d.statement_timeout, HOUR),
            ("http.header_read_timeout", h.header_read_timeout, HOUR),
            ("http.body_read_timeout", h.body_read_timeout, HOUR),
            ("http.request_timeout", h.request_timeout, HOUR),
            // The consumer's use of a verified Stripe `created` (which dedup generations to look
            // in) is sound only while the accepted signature age is far below a day.
            ("stripe.tolerance", st.tolerance, HOUR),
            ("stripe.api_timeout", st.api_timeout, HOUR),
            ("standard_webhooks.tolerance", sw.tolerance, HOUR),
            ("transport.publish_timeout", t.publish_timeout, HOUR),
            ("transport.sqs_wait_time", t.sqs_wait_time, SQS_LONGEST_POLL),
            ("consumer.lease", c.lease, HOUR),
            ("consumer.step_timeout", c.step_timeout, HOUR),
            ("consumer.poll_interval", c.poll_interval, HOUR),
            ("consumer.retry_base", c.retry_base, DAY),
            ("consumer.retry_max", c.retry_max, DAY),
            ("consumer.retention_interval", c.retention_interval, DAY),
            ("outbox.poll_interval", o.poll_interval, HOUR),
            ("outbox.lease", o.lease, HOUR),
            ("outbox.retry_base", o.retry_base, DAY),
            ("outbox.retry_max", o.retry_max, DAY),
            ("outbox.http_timeout", o.http_timeout, HOUR),
            ("outbox.max_retry_after", o.max_retry_after, HOUR),
            ("outbox.breaker.probe_after", o.breaker.probe_after, HOUR),
            ("outbox.breaker.probe_max", o.breaker.probe_max, DAY),
            ("shutdown.grace", self.shutdown.grace, HOUR),
        ]
    }

    /// Refuses any numeric value or duration above its bound, naming the key.
    pub(super) fn check_upper_bounds(&self) -> Result<(), ConfigError> {
        // The optional window (absent from the defaults, so not in the table): the days' bound.
        let window = self.consumer.dedup_window.map(|window| {
            let key = "consumer.dedup_window";
            (key, window, whole_days(MAX_DEDUP_DAYS))
        });
        for (key, value, max) in self.bounded_durations().into_iter().chain(window) {
            if value > max {
                return Err(invalid(
                    key,
                    format!(
                        "is {}, more than {}, the most it accepts (far beyond what a deployment \
                         needs; see config/default.toml)",
                        shown(value),
                        shown(max)
                    ),
                ));
            }
        }
        for (key, value, max) in self.bounded_values() {
            if value > max {
                return Err(invalid(
                    key,
                    format!(
                        "is {value}, more than {max}, the most it accepts (far beyond what a \
                         deployment needs; see config/default.toml)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use figment::providers::Serialized;
    use figment::value::{Dict, Value};

    use super::*;
    use crate::config::durations::RENAMED;
    use crate::config::{defaults, DEFAULT_TOML};

    /// The value: times 86,400 it wraps to 61,184 seconds.
    const WRAPPING_DAYS: u64 = 213_503_982_334_602;

    fn with<T: serde::Serialize>(key: &str, value: T) -> Result<Settings, ConfigError> {
        Settings::from_figment(
            defaults()
                .merge(Serialized::default("stripe.secrets", "whsec_test"))
                .merge(Serialized::default(key, value)),
        )
    }

    fn defaults_settings() -> Settings {
        with("consumer.batch_size", 256).expect("the defaults are valid")
    }

    /// Dotted keys of the values under `dict` that `is_kind` picks.
    fn keys_of(prefix: &str, dict: &Dict, is_kind: fn(&Value) -> bool, keys: &mut Vec<String>) {
        for (name, value) in dict {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                Value::Dict(_, inner) => keys_of(&key, inner, is_kind, keys),
                value if is_kind(value) => keys.push(key),
                _ => {}
            }
        }
    }

    fn default_keys(is_kind: fn(&Value) -> bool) -> Vec<String> {
        let dict: Dict = defaults().extract().expect("the defaults parse");
        let mut keys = Vec::new();
        keys_of("", &dict, is_kind, &mut keys);
        keys.sort();
        keys
    }

    fn is_integer(value: &Value) -> bool {
        matches!(value, Value::Num(_, num) if num.to_i128().is_some())
    }

    fn is_duration(value: &Value) -> bool {
        matches!(value, Value::String(_, text) if humantime::parse_duration(text).is_ok())
    }

    #[test]
    fn every_integer_key_of_the_defaults_has_a_bound_and_no_other_key_does() {
        let mut bounded: Vec<String> = defaults_settings()
            .bounded_values()
            .iter()
            .map(|(key, _, _)| key.to_string())
            .collect();
        bounded.sort();
        assert_eq!(bounded, default_keys(is_integer));
    }

    /// And each is one of the renamed integer keys' new spellings (all of them but the dedup
    /// window, which has no default).
    const BORN_WITH_UNITS: [&str; 3] = [
        "outbox.max_retry_after",
        "outbox.breaker.probe_after",
        "outbox.breaker.probe_max",
    ];

    #[test]
    fn every_duration_key_of_the_defaults_has_a_bound_and_no_other_key_does() {
        let mut bounded: Vec<String> = defaults_settings()
            .bounded_durations()
            .iter()
            .map(|(key, _, _)| key.to_string())
            .collect();
        bounded.sort();
        assert_eq!(bounded, default_keys(is_duration));
        let mut renamed: Vec<String> = RENAMED
            .iter()
            .map(|r| r.new.to_owned())
            .filter(|key| key != "consumer.dedup_window")
            .collect();
        renamed.sort();
        // Durations born with their unit (issue 39's) were never spelled otherwise.
        bounded.retain(|key| !BORN_WITH_UNITS.contains(&key.as_str()));
        assert_eq!(renamed, bounded);
    }

    /// Table-driven over every bounded key: its bound is accepted, one more is refused naming the
    /// key and the bound, and so is the largest number the key's type holds.
    #[test]
    fn a_value_over_its_bound_is_refused_naming_the_key() {
        for (key, _, max) in defaults_settings().bounded_values() {
            let at = with(key, max).unwrap_or_else(|e| panic!("{key} = {max}: {e}"));
            let read = at.bounded_values().into_iter().find(|(k, _, _)| *k == key);
            assert_eq!(read.map(|(_, value, _)| value), Some(max), "{key}");
            for over in [max + 1, u64::from(u32::MAX) + 1, u64::MAX] {
                let text = with(key, over).expect_err(key).to_string();
                assert!(text.contains(&format!("`{key}`")), "{key} = {over}: {text}");
            }
            let text = with(key, max + 1).expect_err(key).to_string();
            assert!(text.contains(&format!("more than {max}")), "{text}");
        }
        let text = with("consumer.dedup_retention_days", WRAPPING_DAYS)
            .expect_err("the issue's value")
            .to_string();
        assert!(
            text.contains("consumer.dedup_retention_days") && text.contains("more than 3650"),
            "{text}"
        );
    }

    /// The same for the durations, in both spellings: the refusal names the key as written.
    #[test]
    fn a_duration_over_its_bound_is_refused_naming_the_key_as_written() {
        for (key, _, max) in defaults_settings().bounded_durations() {
            let at = with(key, shown(max)).unwrap_or_else(|e| panic!("{key} = {max:?}: {e}"));
            let read = at
                .bounded_durations()
                .into_iter()
                .find(|(k, _, _)| *k == key);
            assert_eq!(read.map(|(_, value, _)| value), Some(max), "{key}");
            let over = shown(max + Duration::from_secs(1));
            let text = with(key, &over).expect_err(key).to_string();
            assert!(
                text.contains(&format!("`{key}`")) && text.contains(&shown(max)),
                "{key} = {over}: {text}"
            );
            if BORN_WITH_UNITS.contains(&key) {
                continue;
            }
            let old = RENAMED.iter().find(|r| r.new == key).expect("renamed").old;
            for over in [max.as_secs() * 1_000 + 1_000, u64::MAX] {
                let text = with(old, over).expect_err(old).to_string();
                assert!(text.contains(&format!("`{old}`")), "{old} = {over}: {text}");
            }
        }
        let window = shown(whole_days(MAX_DEDUP_DAYS + 1));
        let text = with("consumer.dedup_window", &window)
            .expect_err("over")
            .to_string();
        assert!(text.contains("`consumer.dedup_window`"), "{text}");
        let text = with("consumer.dedup_window", u64::MAX)
            .expect_err("over")
            .to_string();
        assert!(text.contains("`consumer.dedup_window`"), "{text}");
    }

    /// config/default.toml says each key's bound in the comment just above the key.
    #[test]
    fn the_defaults_file_states_each_bound_beside_its_key() {
        let settings = defaults_settings();
        let numbers = settings
            .bounded_values()
            .map(|(key, _, max)| (key, max.to_string()));
        let durations = settings
            .bounded_durations()
            .map(|(key, _, max)| (key, shown(max)));
        let lines: Vec<&str> = DEFAULT_TOML.lines().collect();
        for (key, max) in numbers.into_iter().chain(durations) {
            let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
            let header = format!("[{section}]");
            let start = lines
                .iter()
                .position(|l| section.is_empty() || *l == header)
                .unwrap_or_else(|| panic!("{header} in config/default.toml"));
            let at = lines[start..]
                .iter()
                .position(|l| l.starts_with(&format!("{name} = ")))
                .map(|i| start + i)
                .unwrap_or_else(|| panic!("{key} in config/default.toml"));
            let comment: String = lines[..at]
                .iter()
                .rev()
                .take_while(|l| l.starts_with('#'))
                .map(|l| l.replace('_', ""))
                .collect();
            assert!(
                comment.contains(&format!("At most {max}")),
                "{key}: the comment above it does not say `At most {max}`"
            );
        }
    }

    #[test]
    fn day_and_hour_counts_saturate_instead_of_wrapping() {
        assert_eq!(whole_days(30), Duration::from_secs(30 * 86_400));
        assert_eq!(whole_hours(168), Duration::from_secs(168 * 3_600));
        assert_eq!(whole_days(WRAPPING_DAYS), Duration::from_secs(u64::MAX));
        assert_eq!(whole_hours(u64::MAX), Duration::from_secs(u64::MAX));
    }
}
