//! Durations in both spellings, the deprecation of the old integer keys, and the refusals.

use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;

use super::{adopt_old_keys, RENAMED};
use crate::config::{defaults, ConfigError, Settings};

fn with(toml: &str) -> Figment {
    defaults()
        .merge(Serialized::default("stripe.secrets", "whsec_test"))
        .merge(Toml::string(toml))
}

fn load(toml: &str) -> Result<Settings, ConfigError> {
    Settings::from_figment(with(toml))
}

fn refusal(toml: &str) -> String {
    load(toml).expect_err(toml).to_string()
}

#[test]
fn a_duration_reads_the_same_in_both_spellings() {
    for (old, new, expected) in [
        ("poll_interval_ms = 250", "poll_interval = \"250ms\"", 250),
        ("lease_secs = 30", "lease = \"30s\"", 30_000),
        ("retry_max_ms = 120000", "retry_max = \"2m\"", 120_000),
        (
            "dedup_window_secs = 90",
            "dedup_window = \"1m 30s\"",
            90_000,
        ),
    ] {
        let old = load(&format!(
            "[consumer]\n{old}\nallow_short_dedup_retention = true\n"
        ))
        .unwrap_or_else(|e| panic!("{old}: {e}"));
        let new = load(&format!(
            "[consumer]\n{new}\nallow_short_dedup_retention = true\n"
        ))
        .unwrap_or_else(|e| panic!("{new}: {e}"));
        let expected = Duration::from_millis(expected);
        let read = |s: &Settings| {
            let c = &s.consumer;
            [c.poll_interval, c.lease, c.retry_max, c.dedup_window()]
        };
        assert!(read(&new).contains(&expected), "{:?}", read(&new));
        assert_eq!(read(&old), read(&new));
    }
}

#[test]
fn every_old_key_is_read_as_its_new_one_and_warned_about() {
    for renamed in &RENAMED {
        let (section, old_name) = renamed.old.split_once('.').expect("dotted");
        let figment = with(&format!("[{section}]\n{old_name} = 7\n"));
        let (figment, old_keys) = adopt_old_keys(figment).expect("adopted");
        let read: String = figment.extract_inner(renamed.new).expect(renamed.new);
        let expected = match renamed.unit {
            super::Unit::Millis => "7ms",
            super::Unit::Secs => "7s",
        };
        assert_eq!(read, expected, "{}", renamed.old);
        let warnings = old_keys.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(&format!("`{}`", renamed.old))
                && warnings[0].contains(&format!("`{}`", renamed.new)),
            "{}",
            warnings[0]
        );
    }
    let (_, none) = adopt_old_keys(with("")).expect("the defaults");
    assert!(none.warnings().is_empty());
}

/// A source's tolerance is one key per configured source: each source's old key is read as
/// seconds under its new one and warned about by its own name.
#[test]
fn each_sources_old_tolerance_key_is_read_as_seconds_and_warned_about() {
    let toml = "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance_secs = 90\n\
                [sources.zoom]\nscheme = \"zoom\"\nsecrets = \"y\"\ntolerance = \"2m\"\n";
    let (_, old_keys) = adopt_old_keys(with(toml)).expect("adopted");
    let warnings = old_keys.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`sources.slack.tolerance_secs`")
            && warnings[0].contains("`sources.slack.tolerance`"),
        "{}",
        warnings[0]
    );
    let settings = load(toml).expect("valid");
    assert_eq!(settings.sources["slack"].tolerance_secs(), 90);
    assert_eq!(settings.sources["zoom"].tolerance_secs(), 120);
}

#[test]
fn a_key_given_in_both_spellings_is_refused_naming_both() {
    let text = refusal("[consumer]\npoll_interval_ms = 250\npoll_interval = \"250ms\"\n");
    assert!(
        text.contains("`consumer.poll_interval_ms`") && text.contains("`consumer.poll_interval`"),
        "{text}"
    );
    // The new key written with its default value is still written: refused as well.
    let text = refusal("[outbox]\nlease_secs = 30\nlease = \"10s\"\n");
    assert!(
        text.contains("outbox.lease_secs") && text.contains("outbox.lease`"),
        "{text}"
    );
}

#[test]
fn a_bad_duration_is_refused_naming_the_key() {
    for (toml, key) in [
        (
            "[consumer]\npoll_interval = \"10 parsecs\"\n",
            "`consumer.poll_interval`",
        ),
        (
            "[consumer]\npoll_interval = 500\n",
            "`consumer.poll_interval`",
        ),
        ("[shutdown]\ngrace = \"\"\n", "`shutdown.grace`"),
        (
            "[consumer]\npoll_interval_ms = \"500ms\"\n",
            "`consumer.poll_interval_ms`",
        ),
        ("[consumer]\nlease_secs = -1\n", "`consumer.lease_secs`"),
    ] {
        let text = refusal(toml);
        assert!(text.contains(key), "{toml}: {text}");
    }
    let text = refusal("[consumer]\npoll_interval = \"10 parsecs\"\n");
    assert!(text.contains("\"10s\""), "says how to write one: {text}");
}

/// A check that refuses a value names the key as written: the old one for an old spelling.
#[test]
fn a_refused_value_names_the_key_as_written() {
    for (toml, key) in [
        ("[consumer]\nlease_secs = 1\n", "`consumer.lease_secs`"),
        ("[consumer]\nlease = \"1s\"\n", "`consumer.lease`"),
        (
            "[transport]\nsqs_wait_time_secs = 0\n",
            "`transport.sqs_wait_time_secs`",
        ),
        (
            "[transport]\nsqs_wait_time = \"1500ms\"\n",
            "`transport.sqs_wait_time`",
        ),
        ("[stripe]\ntolerance = \"1500ms\"\n", "`stripe.tolerance`"),
        (
            "[http]\nrequest_timeout_ms = 0\n",
            "`http.request_timeout_ms`",
        ),
    ] {
        let text = refusal(toml);
        assert!(text.contains(key), "{toml}: {text}");
    }
}

/// A refused value still says which layer it came from, after the old keys were renamed.
#[test]
fn a_refusal_after_a_rename_still_names_its_source() {
    let text = refusal("[consumer]\npoll_interval_ms = 250\n[http]\nlisten = \"nowhere\"\n");
    assert!(
        text.contains("`http.listen`") && text.contains("TOML source string"),
        "{text}"
    );
}
