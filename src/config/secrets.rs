//! Secrets as typed values, parsed once while the configuration loads: a refused secret names
//! its key at start-up, and nothing downstream parses it again.
//!
//! None of them appears in `Debug` output (logs, panics, `dedup-worker config`-style dumps).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer};
use sha2::Sha256;

use super::ed25519::{
    describe_base64_error, signed_content, InvalidEd25519Key, StandardPublicKey,
    StandardSigningKey, PUBLIC_KEY_PREFIX, SECRET_KEY_PREFIX,
};

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
/// whole user info when it is a bare token (`https://***@host/`); other URLs as they are.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let masked = match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{scheme}://{masked}{}", &rest[at..])
}

/// The fewest key bytes accepted in a Standard Webhooks `whsec_` secret (`standard_webhooks.secrets`,
/// `outbox.signing_secret`). The specification has senders generate 24 to 64 random bytes; a
/// shorter key is a typo, a truncated paste or a placeholder, and one of a few bytes can be
/// found by trying them all.
pub const MIN_STANDARD_KEY_BYTES: usize = 16;

/// Below this many characters after `whsec_`, a Stripe signing secret is logged as suspicious at
/// start-up (not refused: Stripe issues 32 or more, and README's local quick start uses
/// `whsec_local`).
pub const STRIPE_SECRET_WARN_CHARS: usize = 16;

/// The prefix of Stripe's and Standard Webhooks' HMAC secrets.
pub const HMAC_SECRET_PREFIX: &str = "whsec_";

/// A Standard Webhooks secret (`whsec_<base64>`), already decoded into the HMAC key it names: at
/// least [`MIN_STANDARD_KEY_BYTES`] bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct StandardSecret {
    /// The decoded key: what the HMAC is keyed with.
    key: Vec<u8>,
}

impl StandardSecret {
    /// Decodes `whsec_<base64>` (the prefix is optional, as in the official libraries) and
    /// refuses a key that verifies nothing: empty (a template such as `whsec_${X}` with `X`
    /// unset; anyone can sign with the empty key) or shorter than [`MIN_STANDARD_KEY_BYTES`].
    pub fn parse(secret: &str) -> Result<Self, InvalidStandardSecret> {
        let encoded = secret.strip_prefix(HMAC_SECRET_PREFIX).unwrap_or(secret);
        // Whitespace alone would otherwise be refused as "not base64", hiding the real mistake.
        if encoded.trim().is_empty() {
            return Err(InvalidStandardSecret::Empty);
        }
        let key = Self::decode(secret)?;
        if key.is_empty() {
            return Err(InvalidStandardSecret::Empty);
        }
        if key.len() < MIN_STANDARD_KEY_BYTES {
            return Err(InvalidStandardSecret::TooShort { len: key.len() });
        }
        Ok(StandardSecret { key })
    }

    /// The key bytes of `whsec_<base64>`, of any length (the verifier's own tests and fuzz
    /// targets sign with arbitrary keys; configuration goes through [`StandardSecret::parse`]).
    pub fn decode(secret: &str) -> Result<Vec<u8>, InvalidStandardSecret> {
        let encoded = secret.strip_prefix(HMAC_SECRET_PREFIX).unwrap_or(secret);
        BASE64
            .decode(encoded)
            .map_err(|e| InvalidStandardSecret::NotBase64(describe_base64_error(&e)))
    }

    /// The HMAC key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// This secret's `webhook-signature` entry (`v1,<base64>`) for a message.
    pub fn sign(&self, id: &str, timestamp: i64, payload: &[u8]) -> String {
        format!(
            "v1,{}",
            BASE64.encode(
                standard_mac(&self.key, id, timestamp, payload)
                    .finalize()
                    .into_bytes()
            )
        )
    }
}

/// The Standard Webhooks MAC: HMAC-SHA256 under `key` of `{id}.{timestamp}.{payload}`. One
/// definition for signing ([`StandardSecret::sign`]) and verifying (the ingress).
pub fn standard_mac(key: &[u8], id: &str, timestamp: i64, payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

impl std::fmt::Debug for StandardSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StandardSecret(***)")
    }
}

/// A Standard Webhooks secret that was refused (reported at start-up, naming the key and entry).
/// Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidStandardSecret {
    #[error("a Standard Webhooks secret must be base64 (optionally prefixed whsec_): {0}")]
    NotBase64(String),
    /// Nothing after `whsec_`, or base64 of zero bytes: the empty HMAC key, which anyone can
    /// sign with.
    #[error(
        "the secret is empty after whsec_ (an unset variable in a template such as whsec_${{X}}?): \
         an empty HMAC key verifies anything anyone signs with it"
    )]
    Empty,
    #[error(
        "the secret decodes to {len} bytes, fewer than {MIN_STANDARD_KEY_BYTES}: Standard Webhooks \
         keys are 24 to 64 random bytes, and a short one can be guessed"
    )]
    TooShort { len: usize },
}

/// One entry of `outbox.signing_secret`: a `whsec_` secret signs with a `v1,` HMAC item, a
/// `whsk_` ed25519 secret key with a `v1a,` item. Neither shows in `Debug` output.
#[derive(Clone, Debug)]
pub enum SigningSecret {
    Hmac(StandardSecret),
    Ed25519(StandardSigningKey),
}

/// An `outbox.signing_secret` entry that is neither kind (reported at start-up, naming the key).
#[derive(Debug, thiserror::Error)]
pub enum InvalidSigningSecret {
    #[error(transparent)]
    Hmac(#[from] InvalidStandardSecret),
    #[error(transparent)]
    Ed25519(#[from] InvalidEd25519Key),
}

impl SigningSecret {
    /// `whsk_…` is an ed25519 key; anything else is read as a `whsec_` secret (whose prefix is
    /// optional, as in the official libraries).
    pub fn parse(secret: &str) -> Result<Self, InvalidSigningSecret> {
        Ok(if secret.starts_with(SECRET_KEY_PREFIX) {
            SigningSecret::Ed25519(StandardSigningKey::parse(secret)?)
        } else {
            SigningSecret::Hmac(StandardSecret::parse(secret)?)
        })
    }
}

/// The `webhook-signature` value for one message: one item per secret, in their order,
/// space-separated, so a receiver holding any one of the secrets, or the public key of any one of
/// the ed25519 keys, verifies it.
pub fn webhook_signature(
    secrets: &[SigningSecret],
    id: &str,
    timestamp: i64,
    payload: &[u8],
) -> String {
    // Built once for every ed25519 key, and only if there is one (it copies the payload).
    let mut content: Option<Vec<u8>> = None;
    secrets
        .iter()
        .map(|secret| match secret {
            SigningSecret::Hmac(secret) => secret.sign(id, timestamp, payload),
            SigningSecret::Ed25519(key) => {
                key.item(content.get_or_insert_with(|| signed_content(id, timestamp, payload)))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

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
        ] {
            assert_eq!(redact_url(url), shown);
        }
        let url = ConnectionUrl("postgres://app:s3cret@db/x".into());
        assert!(!format!("{url:?} {url}").contains("s3cret"));
        assert_eq!(url.expose(), "postgres://app:s3cret@db/x");
    }

    #[test]
    fn standard_secrets_decode_with_or_without_the_prefix_and_bad_ones_say_why() {
        let key = StandardSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("valid")
            .key()
            .to_vec();
        assert_eq!(
            StandardSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .expect("valid")
                .key(),
            key
        );
        let err = StandardSecret::parse("whsec_not base64!").expect_err("invalid");
        assert!(err.to_string().contains("base64"), "{err}");
        // base64's own message quotes the offending byte, part of the secret.
        assert!(!err.to_string().contains("32"), "{err}");
        assert_eq!(
            format!(
                "{:?}",
                StandardSecret::parse(&format!("whsec_{}", BASE64.encode([7u8; 16])))
                    .expect("valid")
            ),
            "StandardSecret(***)"
        );
    }

    #[test]
    fn standard_secrets_that_verify_nothing_are_refused() {
        for empty in ["whsec_", "", "whsec_  ", " \t"] {
            assert_eq!(
                StandardSecret::parse(empty),
                Err(InvalidStandardSecret::Empty),
                "{empty:?}"
            );
        }
        for len in [1, MIN_STANDARD_KEY_BYTES - 1] {
            let short = format!("whsec_{}", BASE64.encode(vec![7u8; len]));
            assert_eq!(
                StandardSecret::parse(&short),
                Err(InvalidStandardSecret::TooShort { len })
            );
        }
        let shortest = format!("whsec_{}", BASE64.encode([7u8; MIN_STANDARD_KEY_BYTES]));
        assert_eq!(
            StandardSecret::parse(&shortest).expect("16 bytes").key(),
            [7u8; MIN_STANDARD_KEY_BYTES]
        );
        // Decoding alone (the verifier's, for keys of any length) still takes them.
        assert_eq!(StandardSecret::decode("whsec_"), Ok(Vec::new()));
        assert_eq!(StandardSecret::decode("whsec_AAAA"), Ok(vec![0, 0, 0]));
        let short = SigningSecret::parse("whsec_AAAA").expect_err("3 bytes");
        assert!(short.to_string().contains("3 bytes"), "{short}");
    }
}
