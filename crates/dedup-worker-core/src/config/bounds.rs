//! Upper bounds of the numeric settings, and the conversions of day and hour counts to
//! durations.
//!
//! Every number in `config/default.toml` has a largest accepted value, far above what any
//! deployment needs and far below where the durations and counts made from it could overflow
//! (`dedup_retention_days * 86_400` wraps in a release build: a window of 2⁶⁴ + 61,184 seconds
//! becomes 17 hours, and retention empties a two-day-old dedup generation). A value above its
//! bound refuses the configuration, naming the key; config/default.toml gives each bound beside
//! its key. The conversions saturate as well, so nothing wraps even if a bound is lifted.

use std::time::Duration;

use super::{invalid, ConfigError, ConsumerSettings, OutboxSettings, Settings};

/// One hour in milliseconds: the bound of every `*_ms` timeout and poll interval.
const HOUR_MS: u64 = 3_600_000;
/// One day in milliseconds: the bound of the retry backoffs.
const DAY_MS: u64 = 86_400_000;
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

/// The largest `consumer.dedup_retention_days`, and in seconds `consumer.dedup_window_secs`.
const MAX_DEDUP_DAYS: u64 = 3_650;

impl ConsumerSettings {
    /// How long processed ids are kept: `dedup_window_secs` when set, else
    /// `dedup_retention_days` as a duration.
    pub fn dedup_window(&self) -> Duration {
        match self.dedup_window_secs {
            Some(secs) => Duration::from_secs(secs),
            None => whole_days(self.dedup_retention_days),
        }
    }

    /// The key that set [`ConsumerSettings::dedup_window`], for error messages.
    pub fn dedup_window_key(&self) -> &'static str {
        match self.dedup_window_secs {
            Some(_) => "consumer.dedup_window_secs",
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
    pub(super) fn bounded_values(&self) -> [(&'static str, u64, u64); 41] {
        let (d, h, st, sw, t) = (
            &self.database,
            &self.http,
            &self.stripe,
            &self.standard_webhooks,
            &self.transport,
        );
        let (c, o) = (&self.consumer, &self.outbox);
        [
            ("database.max_connections", wide(d.max_connections), 1_000),
            ("database.acquire_timeout_ms", d.acquire_timeout_ms, HOUR_MS),
            (
                "database.statement_timeout_ms",
                d.statement_timeout_ms,
                HOUR_MS,
            ),
            (
                "http.body_limit_bytes",
                wide(h.body_limit_bytes),
                SIXTY_FOUR_MIB,
            ),
            (
                "http.header_read_timeout_ms",
                h.header_read_timeout_ms,
                HOUR_MS,
            ),
            ("http.max_header_bytes", wide(h.max_header_bytes), 1_048_576),
            ("http.body_read_timeout_ms", h.body_read_timeout_ms, HOUR_MS),
            ("http.request_timeout_ms", h.request_timeout_ms, HOUR_MS),
            (
                "http.max_concurrent_requests",
                wide(h.max_concurrent_requests),
                1_000_000,
            ),
            ("http.max_connections", wide(h.max_connections), 1_000_000),
            // The consumer's use of a verified Stripe `created` (which dedup generations to look
            // in) is sound only while the accepted signature age is far below a day.
            ("stripe.tolerance_secs", st.tolerance_secs, 3_600),
            ("stripe.api_timeout_ms", st.api_timeout_ms, HOUR_MS),
            ("standard_webhooks.tolerance_secs", sw.tolerance_secs, 3_600),
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
            (
                "transport.publish_timeout_ms",
                t.publish_timeout_ms,
                HOUR_MS,
            ),
            ("transport.delivery_limit", wide(t.delivery_limit), 1_000),
            ("transport.sqs_wait_time_secs", t.sqs_wait_time_secs, 20),
            ("consumer.batch_size", wide(c.batch_size), 10_000),
            ("consumer.workers", wide(c.workers), 256),
            ("consumer.lease_secs", c.lease_secs, 3_600),
            ("consumer.step_timeout_ms", c.step_timeout_ms, HOUR_MS),
            ("consumer.poll_interval_ms", c.poll_interval_ms, HOUR_MS),
            ("consumer.max_attempts", wide(c.max_attempts), 100_000),
            ("consumer.retry_base_ms", c.retry_base_ms, DAY_MS),
            ("consumer.retry_max_ms", c.retry_max_ms, DAY_MS),
            (
                "consumer.dedup_retention_days",
                c.dedup_retention_days,
                MAX_DEDUP_DAYS,
            ),
            (
                "consumer.retention_interval_secs",
                c.retention_interval_secs,
                86_400,
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
            ("outbox.poll_interval_ms", o.poll_interval_ms, HOUR_MS),
            ("outbox.lease_secs", o.lease_secs, 3_600),
            ("outbox.max_attempts", wide(o.max_attempts), 100_000),
            ("outbox.retry_base_ms", o.retry_base_ms, DAY_MS),
            ("outbox.retry_max_ms", o.retry_max_ms, DAY_MS),
            ("outbox.http_timeout_ms", o.http_timeout_ms, HOUR_MS),
            ("outbox.retention_hours", o.retention_hours, 87_600),
            ("shutdown.grace_secs", self.shutdown.grace_secs, 3_600),
        ]
    }

    /// Refuses any numeric value above its bound, naming the key.
    pub(super) fn check_upper_bounds(&self) -> Result<(), ConfigError> {
        // The optional window in seconds (absent from the defaults, so not in the table above):
        // the days' bound.
        let window_secs = self.consumer.dedup_window_secs.map(|secs| {
            let key = "consumer.dedup_window_secs";
            (key, secs, MAX_DEDUP_DAYS * 86_400)
        });
        for (key, value, max) in self.bounded_values().into_iter().chain(window_secs) {
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
    use figment::providers::{Format, Serialized, Toml};
    use figment::value::{Dict, Value};
    use figment::Figment;

    use super::*;
    use crate::config::DEFAULT_TOML;

    /// The value: times 86,400 it wraps to 61,184 seconds.
    const WRAPPING_DAYS: u64 = 213_503_982_334_602;

    fn with(key: &str, value: u64) -> Result<Settings, ConfigError> {
        Settings::from_figment(
            Figment::from(Toml::string(DEFAULT_TOML))
                .merge(Serialized::default("stripe.secrets", "whsec_test"))
                .merge(Serialized::default(key, value)),
        )
    }

    fn defaults() -> Settings {
        with("consumer.batch_size", 256).expect("the defaults are valid")
    }

    /// Dotted keys of the integer values under `dict`.
    fn integer_keys(prefix: &str, dict: &Dict, keys: &mut Vec<String>) {
        for (name, value) in dict {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                Value::Dict(_, inner) => integer_keys(&key, inner, keys),
                Value::Num(_, num) if num.to_i128().is_some() => keys.push(key),
                _ => {}
            }
        }
    }

    #[test]
    fn every_integer_key_of_the_defaults_has_a_bound_and_no_other_key_does() {
        let dict: Dict = Figment::from(Toml::string(DEFAULT_TOML))
            .extract()
            .expect("the defaults parse");
        let mut in_file = Vec::new();
        integer_keys("", &dict, &mut in_file);
        in_file.sort();
        let mut bounded: Vec<String> = defaults()
            .bounded_values()
            .iter()
            .map(|(key, _, _)| key.to_string())
            .collect();
        bounded.sort();
        assert_eq!(bounded, in_file);
    }

    /// Table-driven over every bounded key: its bound is accepted, one more is refused naming the
    /// key and the bound, and so is the largest number the key's type holds.
    #[test]
    fn a_value_over_its_bound_is_refused_naming_the_key() {
        for (key, _, max) in defaults().bounded_values() {
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

    /// config/default.toml says each key's bound in the comment just above the key.
    #[test]
    fn the_defaults_file_states_each_bound_beside_its_key() {
        let lines: Vec<&str> = DEFAULT_TOML.lines().collect();
        for (key, _, max) in defaults().bounded_values() {
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
