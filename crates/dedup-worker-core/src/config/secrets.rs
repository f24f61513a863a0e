//! Secrets as typed values, parsed once while the configuration loads: a refused secret names
//! its key at start-up, and nothing downstream parses it again.
//!
//! None of them appears in `Debug` output (logs, panics, `dedup-worker config`-style dumps).

use serde::{Deserialize, Deserializer};

use crate::signature::ed25519::{StandardPublicKey, PUBLIC_KEY_PREFIX};
use crate::signature::secrets::{SigningSecret, StandardSecret, HMAC_SECRET_PREFIX};

/// A secret string whose `Debug` form does not reveal it (Stripe's `whsec_…` signing secrets are
/// used as given: Stripe signs with the string itself).
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A URL that may carry credentials (`postgres://user:password@host/db`, `amqp://…`): used as
/// it is, shown with its password masked in `Debug` and `Display` ([`redact_url`]).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ConnectionUrl(pub String);

impl ConnectionUrl {
    /// The URL with its credentials, for the client that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for ConnectionUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

impl std::fmt::Display for ConnectionUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// `url` with the password of its user info masked (`postgres://app:***@db:5432/x`), or the
/// whole user info when it is a bare token (`https://***@host/`), and each host label or path
/// segment that looks like a generated token ([`token_like`]) masked too
/// (`https://***.m.pipedream.net/`, `https://webhook.site/***`): such a URL's secret is its
/// address. Other URLs as they are.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let path_end = after.find(['?', '#']).unwrap_or(after.len());
    let (path, tail) = after.split_at(path_end);
    let path: Vec<String> = path.split('/').map(masked_segment).collect();
    format!(
        "{scheme}://{}{}{tail}",
        masked_authority(authority),
        path.join("/")
    )
}

/// An authority (`user:password@host:port`) with its password masked, or its user info when it
/// is a bare token, and its host's token-like labels masked.
pub(super) fn masked_authority(authority: &str) -> String {
    let (user_info, host) = match authority.rfind('@') {
        Some(at) => {
            let masked = match authority[..at].split_once(':') {
                Some((user, _password)) => format!("{user}:***@"),
                None => "***@".to_owned(),
            };
            (masked, &authority[at + 1..])
        }
        None => (String::new(), authority),
    };
    // An IPv6 literal holds no name.
    if host.starts_with('[') {
        return format!("{user_info}{host}");
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, format!(":{port}")),
        None => (host, String::new()),
    };
    let labels: Vec<String> = name.split('.').map(masked_segment).collect();
    format!("{user_info}{}{port}", labels.join("."))
}

/// `***` for a host label or path segment that is [`token_like`], else the text itself.
pub(super) fn masked_segment(text: &str) -> String {
    if token_like(text) {
        "***".to_owned()
    } else {
        text.to_owned()
    }
}

/// Whether a host label or path segment looks generated rather than named, so it may be a
/// URL's secret (webhook.site's `/<UUID>`, a Pipedream host `eo1234abcd.m.pipedream.net`, a
/// request bin's id): letters, digits, `-` and `_` only, 8 characters or more, and
/// * a UUID or any other run of 16 or more hex digits (dashes aside), or
/// * at least three digits and three letters mixed (`eo1234abcd`; not `web01`, `us-east-1`,
///   `ip-10-0-0-1`), or
/// * 20 characters or more in both cases (base62 and base64url tokens).
///
/// Names are rarely like that; masking one that is costs a log reader a name, while printing a
/// token gives anyone who reads the log the right to post to it.
pub fn token_like(text: &str) -> bool {
    let bytes = text.as_bytes();
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_';
    if bytes.len() < 8 || !bytes.iter().all(allowed) {
        return false;
    }
    let count = |f: fn(&u8) -> bool| bytes.iter().filter(|b| f(b)).count();
    let (digits, letters) = (count(u8::is_ascii_digit), count(u8::is_ascii_alphabetic));
    let hex = bytes
        .iter()
        .filter(|b| b.is_ascii_alphanumeric())
        .all(u8::is_ascii_hexdigit);
    let mixed_case = count(u8::is_ascii_uppercase) > 0 && count(u8::is_ascii_lowercase) > 0;
    (hex && digits + letters >= 16)
        || (digits >= 3 && letters >= 3)
        || (bytes.len() >= 20 && mixed_case)
}

/// Below this many characters after `whsec_`, a Stripe signing secret is logged as suspicious at
/// start-up (not refused: Stripe issues 32 or more, and README's local quick start uses
/// `whsec_local`).
pub const STRIPE_SECRET_WARN_CHARS: usize = 16;

/// Accepts a list or one comma-separated string (`STRIPE_WEBHOOK_SECRET=whsec_a,whsec_b`);
/// blanks around and between the commas are dropped.
fn comma_separated_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let items = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split(',').map(str::to_owned).collect(),
        OneOrMany::Many(v) => v,
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

/// `stripe.secrets`: a list, or one comma-separated string, of secrets tried in turn (rotation).
/// One with nothing after `whsec_` refuses the configuration, naming the key and the entry's
/// position (never the entry: it is a secret).
pub(super) fn comma_separated_stripe<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<Secret>, D::Error> {
    comma_separated_strings(d)?
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            if stripe_key_material(&s).trim().is_empty() {
                return Err(serde::de::Error::custom(format!(
                    "entry {}: the Stripe webhook secret is empty after whsec_ (an unset variable \
                     in a template such as whsec_${{X}}?): an empty HMAC key verifies anything \
                     anyone signs with it",
                    i + 1
                )));
            }
            Ok(Secret(s))
        })
        .collect()
}

/// What follows `whsec_` in a Stripe secret (the whole string without the prefix). Stripe keys
/// its HMAC with the whole string, prefix included, so this is the part only the secret's holder
/// knows.
pub fn stripe_key_material(secret: &str) -> &str {
    secret.strip_prefix(HMAC_SECRET_PREFIX).unwrap_or(secret)
}

/// `standard_webhooks.secrets`: as [`comma_separated_stripe`], each decoded; one that does not
/// decode, or decodes to a key that verifies nothing, refuses the configuration, naming the key
/// and the entry's position.
pub(super) fn comma_separated_standard<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<StandardSecret>, D::Error> {
    comma_separated_strings(d)?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            StandardSecret::parse(s)
                .map_err(|e| serde::de::Error::custom(format!("entry {}: {e}", i + 1)))
        })
        .collect()
}

/// `outbox.signing_secret`: as [`comma_separated_stripe`], each parsed as a [`SigningSecret`]; one that
/// does not parse refuses the configuration, naming the key and the entry's position (never the
/// entry: it is a secret).
pub(super) fn comma_separated_signing<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<SigningSecret>, D::Error> {
    comma_separated_strings(d)?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            SigningSecret::parse(s)
                .map_err(|e| serde::de::Error::custom(format!("entry {}: {e}", i + 1)))
        })
        .collect()
}

/// `standard_webhooks.public_keys`: as [`comma_separated_stripe`], each parsed as a `whpk_` key; one
/// that does not parse refuses the configuration, naming the key and the entry: its text when it
/// is `whpk_`-prefixed (public), only its position otherwise (a secret pasted in the wrong place
/// must not reach the logs).
pub(super) fn comma_separated_public_keys<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<StandardPublicKey>, D::Error> {
    comma_separated_strings(d)?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            StandardPublicKey::parse(s).map_err(|e| {
                let entry = if s.starts_with(PUBLIC_KEY_PREFIX) {
                    format!("{:?}", crate::event::printable(s, 80))
                } else {
                    format!("entry {}", i + 1)
                };
                serde::de::Error::custom(format!("{entry}: {e}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_never_show() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            (
                "amqp://guest:p%40ss@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            (
                "https://tok3n@hooks.example/a@b",
                "https://***@hooks.example/a@b",
            ),
            ("sqlite://data/x.db", "sqlite://data/x.db"),
            (
                "https://hooks.example/?user=a@b",
                "https://hooks.example/?user=a@b",
            ),
            ("not a url", "not a url"),
            // A token that is the URL's address: a host label, a path segment.
            (
                "https://eo1234abcd.m.pipedream.net/",
                "https://***.m.pipedream.net/",
            ),
            (
                "https://webhook.site/0b6e5c1a-3f2d-4e8b-9a7c-1d2e3f4a5b6c?x=1",
                "https://webhook.site/***?x=1",
            ),
            (
                "amqp://u:pw@rabbit-0.example:5672/0b6e5c1a3f2d4e8b9a7c1d2e3f4a5b6c",
                "amqp://u:***@rabbit-0.example:5672/***",
            ),
            // Names stay.
            (
                "postgres://app:pw@db-01.us-east-1.rds.amazonaws.com:5432/orders",
                "postgres://app:***@db-01.us-east-1.rds.amazonaws.com:5432/orders",
            ),
            ("http://[::1]:8080/a/b", "http://[::1]:8080/a/b"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        for token in [
            "0b6e5c1a-3f2d-4e8b-9a7c-1d2e3f4a5b6c",
            "0b6e5c1a3f2d4e8b9a7c1d2e3f4a5b6c",
            "eo1234abcd",
            "en7xk2qj9a0b4",
            "AbCdEfGhIjKlMnOpQrStUv",
            "1234567890123456",
        ] {
            assert!(token_like(token), "{token}");
        }
        for name in [
            "hooks",
            "services",
            "us-east-1",
            "web01",
            "ip-10-0-0-1",
            "123456789012",
            "%2f",
            "localhost",
            "amazonaws",
            "catch",
            "rabbit-0",
            "127",
        ] {
            assert!(!token_like(name), "{name}");
        }
        let url = ConnectionUrl("postgres://app:s3cret@db/x".into());
        assert!(!format!("{url:?} {url}").contains("s3cret"));
        assert_eq!(url.expose(), "postgres://app:s3cret@db/x");
    }
}
