//! Standard Webhooks' HMAC secrets (`whsec_<base64>`, decoded once into the key) and the keys
//! the HTTP sink signs with (a `whsec_` secret's `v1,` item, a `whsk_` ed25519 key's `v1a,`
//! item): the one definition of the MAC both the signer and the ingress's verifier use. None of
//! them appears in `Debug` output.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::ed25519::{
    describe_base64_error, signed_content, InvalidEd25519Key, StandardSigningKey, SECRET_KEY_PREFIX,
};

/// The fewest key bytes accepted in a Standard Webhooks `whsec_` secret (`standard_webhooks.secrets`,
/// `outbox.signing_secret`). The specification has senders generate 24 to 64 random bytes; a
/// shorter key is a typo, a truncated paste or a placeholder, and one of a few bytes can be
/// found by trying them all.
pub const MIN_STANDARD_KEY_BYTES: usize = 16;

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

#[cfg(test)]
mod tests {
    use super::*;

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
