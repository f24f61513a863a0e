//! `[admin]`: the operator console's listener (issue 28), apart from the webhook listener so
//! that it can stay on loopback or a private network while webhooks face the internet.

use std::net::SocketAddr;

use serde::{Deserialize, Deserializer};

use super::{invalid, ConfigError, Secret};

/// Shortest accepted `admin.token`: it is the only thing between the network and bulk actions
/// on payment events, so it must not be guessable.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// Where the console listens; off (no listener) when empty, the default.
    #[serde(deserialize_with = "optional_addr")]
    pub listen: Option<SocketAddr>,
    /// What a person types on the login page, or a script sends as `Authorization: Bearer`.
    /// Required unless `listen` is on loopback; the session cookie is signed with a key derived
    /// from it, so changing it logs everyone out.
    pub token: Secret,
    /// Whether pages show payloads (dead letters', queued messages', outbox rows'). Payloads can
    /// hold personal data: `"auto"` (`None`) shows them on loopback only.
    #[serde(deserialize_with = "bool_or_auto")]
    pub show_payloads: Option<bool>,
}

impl AdminSettings {
    /// Whether the console listens on loopback only.
    pub fn on_loopback(&self) -> bool {
        self.listen.is_some_and(|addr| addr.ip().is_loopback())
    }

    /// `show_payloads` as set, or by where the console listens.
    pub fn payloads_shown(&self) -> bool {
        self.show_payloads.unwrap_or_else(|| self.on_loopback())
    }

    /// A console reachable from elsewhere needs a token, and a token must not be guessable.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let Some(addr) = self.listen else {
            return Ok(());
        };
        let token = self.token.expose();
        if token.is_empty() && !addr.ip().is_loopback() {
            return Err(invalid(
                "admin.token",
                format!(
                    "required when admin.listen ({addr}) is not on loopback (DEDUP_ADMIN__TOKEN): \
                     the console can redrive and re-send payment events"
                ),
            ));
        }
        if !token.is_empty() && token.chars().count() < MIN_ADMIN_TOKEN_CHARS {
            return Err(invalid(
                "admin.token",
                format!("shorter than {MIN_ADMIN_TOKEN_CHARS} characters"),
            ));
        }
        Ok(())
    }
}

/// An address, or nothing for an empty string.
fn optional_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

/// `true`, `false`, or `"auto"` (`None`).
fn bool_or_auto<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrText {
        Bool(bool),
        Text(String),
    }
    match BoolOrText::deserialize(d)? {
        BoolOrText::Bool(b) => Ok(Some(b)),
        BoolOrText::Text(t) => match t.trim() {
            "auto" => Ok(None),
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err(serde::de::Error::custom(format!(
                "{other:?} is not true, false or \"auto\""
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use figment::providers::Serialized;

    use crate::config::{defaults, Settings};

    fn admin(values: &[(&str, serde_json::Value)]) -> Result<Settings, String> {
        let mut figment = defaults().merge(Serialized::default("stripe.secrets", "whsec_test"));
        for (key, value) in values {
            figment = figment.merge(Serialized::default(key, value.clone()));
        }
        Settings::from_figment(figment).map_err(|e| e.to_string())
    }

    #[test]
    fn the_console_is_off_by_default() {
        let s = admin(&[]).expect("valid");
        assert_eq!(s.admin.listen, None);
        assert!(!s.admin.payloads_shown());
    }

    #[test]
    fn a_console_off_loopback_without_a_token_is_refused_naming_the_key() {
        let err = admin(&[("admin.listen", "0.0.0.0:8081".into())]).expect_err("no token");
        assert!(err.contains("admin.token"), "{err}");
        let err = admin(&[
            ("admin.listen", "10.0.0.5:8081".into()),
            ("admin.token", "short".into()),
        ])
        .expect_err("short token");
        assert!(err.contains("admin.token") && err.contains("16"), "{err}");
        let s = admin(&[
            ("admin.listen", "0.0.0.0:8081".into()),
            ("admin.token", "a-token-long-enough".into()),
        ])
        .expect("valid");
        assert!(!s.admin.payloads_shown(), "hidden off loopback unless set");
    }

    #[test]
    fn on_loopback_the_token_may_be_left_out_and_payloads_show() {
        let s = admin(&[("admin.listen", "127.0.0.1:0".into())]).expect("valid");
        assert!(s.admin.on_loopback() && s.admin.payloads_shown());
        let s = admin(&[
            ("admin.listen", "[::1]:0".into()),
            ("admin.show_payloads", false.into()),
        ])
        .expect("valid");
        assert!(!s.admin.payloads_shown(), "an explicit value wins");
        let s = admin(&[
            ("admin.listen", "0.0.0.0:1".into()),
            ("admin.token", "a-token-long-enough".into()),
            ("admin.show_payloads", "true".into()),
        ])
        .expect("valid");
        assert!(s.admin.payloads_shown());
        let err = admin(&[("admin.show_payloads", "sometimes".into())]).expect_err("not a choice");
        assert!(err.contains("admin.show_payloads"), "{err}");
        let err = admin(&[("admin.listen", "nowhere".into())]).expect_err("not an address");
        assert!(err.contains("admin.listen"), "{err}");
    }
}
