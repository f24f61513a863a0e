//! Configuration tests: defaults, and that each refused value names its key.

use super::*;
use crate::signature::ed25519::MAX_PUBLIC_KEYS;
use crate::signature::secrets::webhook_signature;
use crate::signature::secrets::SigningSecret;
use base64::prelude::{Engine as _, BASE64_STANDARD};
use figment::providers::Serialized;

fn with<T: serde::Serialize>(key: &str, value: T) -> Figment {
    defaults()
        .merge(Serialized::default("stripe.secrets", "whsec_test"))
        .merge(Serialized::default(key, value))
}

#[test]
fn defaults_need_only_a_secret() {
    let s = Settings::from_figment(
        defaults().merge(Serialized::default("stripe.secrets", "whsec_a, whsec_b")),
    )
    .expect("valid");
    assert_eq!(s.stripe.secrets.len(), 2);
    assert_eq!(s.stripe.secrets[1].expose(), "whsec_b");
    assert!(s.is_sqlite());
    assert_eq!(s.sqlite_path(), Some(PathBuf::from("data/dedup-worker.db")));
}

#[test]
fn missing_secret_names_the_key() {
    let err = Settings::from_figment(defaults()).expect_err("no secret");
    assert!(err.to_string().contains("stripe.secrets"), "{err}");
}

#[test]
fn bad_listen_address_names_the_key() {
    let err = Settings::from_figment(with("http.listen", "not-an-address")).expect_err("bad");
    assert!(err.to_string().contains("http.listen"), "{err}");
}

#[test]
fn bad_sink_names_the_key() {
    let err = Settings::from_figment(with("outbox.sink", "ftp://x")).expect_err("bad");
    assert!(err.to_string().contains("outbox.sink"), "{err}");
}

#[test]
fn default_dedup_retention_is_above_the_minimum_without_the_override() {
    let s = Settings::from_figment(with("http.listen", "127.0.0.1:0")).expect("valid");
    assert!(s.consumer.dedup_retention_days >= MIN_DEDUP_RETENTION_DAYS);
    assert!(!s.consumer.allow_short_dedup_retention);
}

#[test]
fn short_dedup_retention_is_refused_naming_the_key_the_minimum_and_why() {
    for days in [0, MIN_DEDUP_RETENTION_DAYS - 1] {
        let err = Settings::from_figment(with("consumer.dedup_retention_days", days))
            .expect_err("a window shorter than Stripe's retries");
        let text = err.to_string();
        for needed in [
            "consumer.dedup_retention_days",
            &format!("is {days}"),
            "minimum of 4 days",
            "Stripe retries",
            "consumer.allow_short_dedup_retention = true",
        ] {
            assert!(text.contains(needed), "{needed:?} missing from: {text}");
        }
    }
    let s = Settings::from_figment(with(
        "consumer.dedup_retention_days",
        MIN_DEDUP_RETENTION_DAYS,
    ))
    .expect("the minimum itself is accepted");
    assert_eq!(s.consumer.dedup_retention_days, 4);
}

#[test]
fn short_dedup_retention_is_accepted_when_explicitly_allowed() {
    for days in [0, 1] {
        let s = Settings::from_figment(with("consumer.dedup_retention_days", days).merge(
            Serialized::default("consumer.allow_short_dedup_retention", true),
        ))
        .expect("overridden");
        assert_eq!(s.consumer.dedup_retention_days, days);
        assert!(s.consumer.allow_short_dedup_retention);
    }
}

#[test]
fn dedup_window_replaces_the_days_under_the_same_minimum() {
    let days = Settings::from_figment(with("http.listen", "127.0.0.1:0")).expect("valid");
    assert_eq!(
        days.consumer.dedup_window(),
        Duration::from_secs(30 * 86_400)
    );

    let err = Settings::from_figment(with("consumer.dedup_window", "1m"))
        .expect_err("a minute is below Stripe's retries");
    let text = err.to_string();
    for needed in [
        "consumer.dedup_window",
        "is 1m",
        "minimum of 4 days",
        "allow_short_dedup_retention",
    ] {
        assert!(text.contains(needed), "{needed:?} missing from: {text}");
    }

    let s = Settings::from_figment(with("consumer.dedup_window", "60s").merge(
        Serialized::default("consumer.allow_short_dedup_retention", true),
    ))
    .expect("allowed explicitly");
    assert_eq!(s.consumer.dedup_window(), Duration::from_secs(60));

    let err = Settings::from_figment(with("consumer.dedup_window", "3651days"))
        .expect_err("above the days' bound");
    assert!(err.to_string().contains("`consumer.dedup_window`"), "{err}");

    // Set and long enough, it needs no override, and the days no longer count.
    let s = Settings::from_figment(
        with("consumer.dedup_window", "5days")
            .merge(Serialized::default("consumer.dedup_retention_days", 0)),
    )
    .expect("the window decides");
    assert_eq!(s.consumer.dedup_window(), Duration::from_secs(5 * 86_400));
}

#[test]
fn retention_batch_must_be_positive() {
    for batch in [0i64, -1] {
        let err = Settings::from_figment(with("consumer.retention_batch", batch))
            .expect_err("not a bounded batch");
        assert!(
            err.to_string().contains("consumer.retention_batch"),
            "{err}"
        );
    }
}

#[test]
fn sqs_wait_outside_long_poll_range_names_the_key() {
    for value in ["0s", "21s", "1500ms"] {
        let err = Settings::from_figment(with("transport.sqs_wait_time", value))
            .expect_err("out of range");
        assert!(
            err.to_string().contains("`transport.sqs_wait_time`"),
            "{err}"
        );
    }
}

#[test]
fn leases_below_the_minimum_are_refused_naming_the_key() {
    let minimum = format!("{MIN_LEASE_SECS}s");
    for key in ["consumer.lease", "outbox.lease"] {
        let err = Settings::from_figment(with(key, "1999ms")).expect_err("too short");
        assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
        Settings::from_figment(with(key, &minimum)).expect("the minimum is accepted");
    }
}

#[test]
fn zero_store_timeouts_are_refused_naming_the_key() {
    // 0 would mean "no limit" to PostgreSQL, the opposite of what a small value asks for.
    for key in ["database.statement_timeout", "consumer.step_timeout"] {
        let err = Settings::from_figment(with(key, "0s")).expect_err("zero");
        assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
    }
}

#[test]
fn signing_secrets_are_decoded_while_loading_and_a_bad_one_names_its_key() {
    let s = Settings::from_figment(with(
        "outbox.signing_secret",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_ZGVkdXAtd29ya2VyLXNlY29uZC1rZXkh",
    ))
    .expect("valid");
    assert_eq!(s.outbox.signing_secret.len(), 2);
    assert!(Settings::from_figment(with("http.listen", "127.0.0.1:0"))
        .expect("valid")
        .outbox
        .signing_secret
        .is_empty());
    let err = Settings::from_figment(with("outbox.signing_secret", "whsec_not base64!"))
        .expect_err("not base64");
    assert!(err.to_string().contains("outbox.signing_secret"), "{err}");
}

#[test]
fn fetching_thin_events_needs_a_key_and_a_timeout_inside_the_batch() {
    let err = Settings::from_figment(with("stripe.fetch_thin_events", true)).expect_err("no key");
    assert!(err.to_string().contains("stripe.api_key"), "{err}");
    let keyed = |timeout: &str| {
        with("stripe.fetch_thin_events", true)
            .merge(Serialized::default("stripe.api_key", "rk_test_1"))
            .merge(Serialized::default("stripe.api_timeout", timeout))
    };
    assert!(Settings::from_figment(keyed("10s")).is_ok());
    for refused in ["0s", "10001ms"] {
        let err = Settings::from_figment(keyed(refused)).expect_err("outside the batch");
        assert!(err.to_string().contains("`stripe.api_timeout`"), "{err}");
    }
    let s = Settings::from_figment(with("consumer.envelope", "eventbridge")).expect("valid");
    assert_eq!(s.consumer.envelope, EnvelopeKind::Eventbridge);
    let err = Settings::from_figment(with("consumer.envelope", "sns")).expect_err("unknown");
    assert!(err.to_string().contains("envelope"), "{err}");
}

/// RFC 8032 section 7.1 TEST 1's key pair, as `whsk_` (seed) and `whpk_`.
const WHSK: &str = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
const WHPK: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";

#[test]
fn standard_public_keys_parse_and_a_bad_one_names_its_key_and_entry() {
    let whpk = WHPK.to_owned();
    let s = Settings::from_figment(with(
        "standard_webhooks.public_keys",
        format!("{whpk}, {whpk}"),
    ))
    .expect("valid");
    assert_eq!(s.standard_webhooks.public_keys.len(), 2);
    assert_eq!(s.standard_webhooks.public_keys[0].to_string(), whpk);
    let listed = Settings::from_figment(with("standard_webhooks.public_keys", vec![whpk.clone()]))
        .expect("a list");
    assert_eq!(listed.standard_webhooks.public_keys.len(), 1);
    assert!(Settings::from_figment(with("http.listen", "127.0.0.1:0"))
        .expect("valid")
        .standard_webhooks
        .public_keys
        .is_empty());
    let short = format!("whpk_{}", "A".repeat(40));
    for (value, wanted) in [
        (
            short.clone(),
            format!("{short:?}: the public key decodes to 30 bytes"),
        ),
        (
            WHSK.to_owned(),
            "entry 1: a Standard Webhooks ed25519 public key starts with whpk_".to_owned(),
        ),
    ] {
        let err = Settings::from_figment(with("standard_webhooks.public_keys", &value))
            .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("standard_webhooks.public_keys"), "{text}");
        assert!(text.contains(&wanted), "{wanted:?} missing from: {text}");
        // A secret key pasted in the wrong place is not repeated into the logs.
        assert!(!text.contains(&WHSK[5..]), "{text}");
    }
    let nine = vec![whpk; MAX_PUBLIC_KEYS + 1];
    let err = Settings::from_figment(with("standard_webhooks.public_keys", nine)).expect_err("9");
    assert!(
        err.to_string().contains("standard_webhooks.public_keys")
            && err.to_string().contains("more than 8"),
        "{err}"
    );
}

#[test]
fn signing_secrets_take_whsk_keys_beside_whsec_and_never_show_them() {
    let s = Settings::from_figment(with(
        "outbox.signing_secret",
        format!("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, {WHSK}"),
    ))
    .expect("valid");
    assert!(matches!(
        s.outbox.signing_secret[..],
        [SigningSecret::Hmac(_), SigningSecret::Ed25519(_)]
    ));
    let shown = format!("{s:?}");
    assert!(shown.contains("StandardSigningKey(***)"), "{shown}");
    assert!(!shown.contains(&WHSK[5..15]), "{shown}");
    let signature = webhook_signature(&s.outbox.signing_secret, "msg_1", 1_614_265_330, b"{}");
    let items: Vec<&str> = signature.split(' ').collect();
    assert_eq!(items.len(), 2, "{signature}");
    assert!(
        items[0].starts_with("v1,") && items[1].starts_with("v1a,"),
        "{signature}"
    );
    let bad = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
    let err = Settings::from_figment(with(
        "outbox.signing_secret",
        format!("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw,{bad}"),
    ))
    .expect_err("unpadded base64");
    let text = err.to_string();
    assert!(
        text.contains("outbox.signing_secret") && text.contains("entry 2"),
        "{text}"
    );
    assert!(!text.contains(&bad[5..]), "{text}");
}

/// Issue 26, item 4: a secret with no key material (`whsec_`, as a template `whsec_${X}` with
/// `X` unset leaves it) verifies nothing anyone signs with the empty key; each of the three keys
/// refuses it, naming the key and the entry, never the other entries' secrets.
#[test]
fn secrets_that_verify_nothing_are_refused_naming_key_and_entry() {
    const GOOD_HMAC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    for key in [
        "stripe.secrets",
        "standard_webhooks.secrets",
        "outbox.signing_secret",
    ] {
        for (value, entry) in [
            ("whsec_".to_owned(), "entry 1"),
            (format!("{GOOD_HMAC}, whsec_"), "entry 2"),
            (format!("{GOOD_HMAC},whsec_ \t"), "entry 2"),
        ] {
            let figment = defaults()
                .merge(Serialized::default("stripe.secrets", GOOD_HMAC))
                .merge(Serialized::default(key, &value));
            let text = Settings::from_figment(figment)
                .expect_err("an empty secret")
                .to_string();
            for needed in [key, entry, "empty after whsec_"] {
                assert!(text.contains(needed), "{needed:?} missing from: {text}");
            }
            assert!(!text.contains(&GOOD_HMAC[6..]), "{text}");
        }
    }
    // ed25519 secret keys and public keys: empty after their prefix.
    for (key, value) in [
        ("outbox.signing_secret", "whsk_"),
        ("standard_webhooks.public_keys", "whpk_"),
    ] {
        let text = Settings::from_figment(with(key, value))
            .expect_err("empty")
            .to_string();
        assert!(text.contains(key) && text.contains("empty after"), "{text}");
    }
}

/// Standard Webhooks keys (`v1` secrets we verify with or sign with) shorter than 16 bytes are
/// refused, naming the key, the entry and the length; Stripe's are only warned about (README's
/// quick start uses `whsec_local`), but an empty one is refused as above.
#[test]
fn short_standard_keys_are_refused_and_short_stripe_secrets_accepted() {
    let fifteen = format!("whsec_{}", BASE64_STANDARD.encode([9u8; 15]));
    let sixteen = format!("whsec_{}", BASE64_STANDARD.encode([9u8; 16]));
    for key in ["standard_webhooks.secrets", "outbox.signing_secret"] {
        let text = Settings::from_figment(with(key, format!("{sixteen},{fifteen}")))
            .expect_err("15 bytes")
            .to_string();
        for needed in [key, "entry 2", "15 bytes, fewer than 16"] {
            assert!(text.contains(needed), "{needed:?} missing from: {text}");
        }
        Settings::from_figment(with(key, &sixteen)).expect("16 bytes are enough");
    }
    let s = Settings::from_figment(with("stripe.secrets", "whsec_local")).expect("warned only");
    assert_eq!(s.stripe.secrets[0].expose(), "whsec_local");
}
