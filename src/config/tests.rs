//! Configuration tests: defaults, and that each refused value names its key.

use super::*;
use figment::providers::Serialized;

fn with(key: &str, value: &str) -> Figment {
    Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("stripe.secrets", "whsec_test"))
        .merge(Serialized::default(key, value))
}

#[test]
fn defaults_need_only_a_secret() {
    let s = Settings::from_figment(
        Figment::from(Toml::string(DEFAULT_TOML))
            .merge(Serialized::default("stripe.secrets", "whsec_a, whsec_b")),
    )
    .expect("valid");
    assert_eq!(s.stripe.secrets.len(), 2);
    assert_eq!(s.stripe.secrets[1].expose(), "whsec_b");
    assert!(s.is_sqlite());
    assert_eq!(s.sqlite_path(), Some(PathBuf::from("data/dedup-worker.db")));
}

#[test]
fn missing_secret_names_the_key() {
    let err =
        Settings::from_figment(Figment::from(Toml::string(DEFAULT_TOML))).expect_err("no secret");
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
