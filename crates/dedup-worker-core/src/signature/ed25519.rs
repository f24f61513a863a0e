//! Standard Webhooks' asymmetric scheme, `v1a` (ed25519): `whsk_` secret keys sign what the HTTP
//! sink forwards, `whpk_` public keys are what the ingress verifies with. Parsed once while the
//! configuration loads, like the `whsec_` secrets of `secrets.rs`, so a refused key names its
//! configuration key at start-up.
//!
//! What a `whsk_` key holds: the specification (spec/standard-webhooks.md, "Signature scheme")
//! says only "standard ed25519 key pair", "base64 encoded, prefixed with `whsk_` for the secret
//! key, and `whpk_` for the public key"; it does not say whether the secret key is RFC 8032's
//! 32-byte seed or the 64-byte seed ‖ public key that libsodium's `crypto_sign_keypair` writes.
//! Both are accepted. The 64-byte form's public half must be its seed's: a mismatched pair would
//! sign with one key and advertise another, and nothing it signs would verify anywhere.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ed25519_dalek::{
    Signer as _, SigningKey, VerifyingKey, KEYPAIR_LENGTH, PUBLIC_KEY_LENGTH, SECRET_KEY_LENGTH,
};

/// Prefix of a serialised ed25519 secret (signing) key.
pub const SECRET_KEY_PREFIX: &str = "whsk_";
/// Prefix of a serialised ed25519 public key.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";
/// Most `standard_webhooks.public_keys`: every `v1a` candidate is checked against each of them,
/// and each check is a full ed25519 verification (about 50 µs plus hashing the body), so the
/// ingress bounds candidates × keys; this bound leaves room for a rotation's two signatures
/// against every key (see `standard::MAX_ED25519_VERIFICATIONS`).
pub const MAX_PUBLIC_KEYS: usize = 8;

/// Why a `whsk_` or `whpk_` key was refused. Never contains secret key material.
#[derive(Debug, thiserror::Error)]
pub enum InvalidEd25519Key {
    #[error("a Standard Webhooks ed25519 {kind} key starts with {prefix}")]
    MissingPrefix {
        kind: &'static str,
        prefix: &'static str,
    },
    /// Nothing after the prefix (an unset variable in a template such as `whsk_${X}`).
    #[error("the {kind} key is empty after {prefix}")]
    Empty {
        kind: &'static str,
        prefix: &'static str,
    },
    /// Described without base64's own error, whose text quotes the offending byte: part of a
    /// secret key.
    #[error("the {kind} key is not base64 after its prefix: {detail}")]
    NotBase64 { kind: &'static str, detail: String },
    #[error("the {kind} key decodes to {len} bytes; {expected}")]
    WrongLength {
        kind: &'static str,
        len: usize,
        expected: &'static str,
    },
    #[error("the public key is not a point of the ed25519 curve: {0}")]
    NotOnCurve(#[source] ed25519_dalek::SignatureError),
    /// `verify_strict` refuses every signature under such a key, and plain verification would
    /// accept forgeries under it: it can only be a mistake.
    #[error("the public key is a small-order point, under which no signature is valid")]
    Weak,
    #[error(
        "the 64-byte secret key (seed and public key, as libsodium writes it) has a public half \
         that is not its seed's public key"
    )]
    MismatchedPair,
}

/// Strips `prefix` and base64-decodes the rest.
fn decode(
    text: &str,
    prefix: &'static str,
    kind: &'static str,
) -> Result<Vec<u8>, InvalidEd25519Key> {
    let encoded = text
        .strip_prefix(prefix)
        .ok_or(InvalidEd25519Key::MissingPrefix { kind, prefix })?;
    if encoded.trim().is_empty() {
        return Err(InvalidEd25519Key::Empty { kind, prefix });
    }
    BASE64
        .decode(encoded)
        .map_err(|e| InvalidEd25519Key::NotBase64 {
            kind,
            detail: describe_base64_error(&e),
        })
}

/// What is wrong with base64 text, without the offending byte's value (it is part of a secret).
pub(super) fn describe_base64_error(error: &base64::DecodeError) -> String {
    match error {
        base64::DecodeError::InvalidByte(offset, _) => {
            format!("a character base64 does not use at offset {offset}")
        }
        base64::DecodeError::InvalidLength(len) => {
            format!("{len} characters, a length base64 text cannot have")
        }
        base64::DecodeError::InvalidLastSymbol(offset, _) => {
            format!("an impossible last character at offset {offset}")
        }
        base64::DecodeError::InvalidPadding => "missing or misplaced `=` padding".to_owned(),
    }
}

/// The content both Standard Webhooks schemes sign: `{id}.{timestamp}.{payload}`, in one buffer
/// (ed25519 hashes the message whole; the HMAC of `secrets::standard_mac` streams the same bytes).
pub fn signed_content(id: &str, timestamp: i64, payload: &[u8]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + payload.len() + 2);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(payload);
    content
}

/// A `whsk_` ed25519 secret key. Its `Debug` form does not reveal it, and ed25519-dalek wipes the
/// key's memory when it is dropped.
#[derive(Clone)]
pub struct StandardSigningKey {
    key: SigningKey,
}

impl StandardSigningKey {
    /// Decodes `whsk_<base64>` of a 32-byte seed or a 64-byte seed ‖ public key (see the module
    /// documentation for why both).
    pub fn parse(text: &str) -> Result<Self, InvalidEd25519Key> {
        let bytes = decode(text, SECRET_KEY_PREFIX, "secret")?;
        match bytes.len() {
            SECRET_KEY_LENGTH => {
                let mut seed = [0u8; SECRET_KEY_LENGTH];
                seed.copy_from_slice(&bytes);
                Ok(Self::from_seed(&seed))
            }
            KEYPAIR_LENGTH => {
                let mut pair = [0u8; KEYPAIR_LENGTH];
                pair.copy_from_slice(&bytes);
                // Checks that the public half is the seed's.
                SigningKey::from_keypair_bytes(&pair)
                    .map(|key| StandardSigningKey { key })
                    .map_err(|_| InvalidEd25519Key::MismatchedPair)
            }
            len => Err(InvalidEd25519Key::WrongLength {
                kind: "secret",
                len,
                expected:
                    "an ed25519 secret key is a 32-byte seed, or 64 bytes of seed and public \
                           key",
            }),
        }
    }

    /// The key of an RFC 8032 32-byte seed.
    pub fn from_seed(seed: &[u8; SECRET_KEY_LENGTH]) -> Self {
        StandardSigningKey {
            key: SigningKey::from_bytes(seed),
        }
    }

    /// The matching public key (what a receiver configures as `whpk_`).
    pub fn public_key(&self) -> StandardPublicKey {
        StandardPublicKey {
            key: self.key.verifying_key(),
        }
    }

    /// The ed25519 signature of `content` (RFC 8032: deterministic).
    pub fn sign_content(&self, content: &[u8]) -> [u8; 64] {
        self.key.sign(content).to_bytes()
    }

    /// The `webhook-signature` item (`v1a,<base64>`) for content from [`signed_content`].
    pub fn item(&self, content: &[u8]) -> String {
        format!("v1a,{}", BASE64.encode(self.sign_content(content)))
    }

    /// The `webhook-signature` item (`v1a,<base64>`) for one message.
    pub fn sign(&self, id: &str, timestamp: i64, payload: &[u8]) -> String {
        self.item(&signed_content(id, timestamp, payload))
    }
}

impl std::fmt::Debug for StandardSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StandardSigningKey(***)")
    }
}

/// A `whpk_` ed25519 public key, checked to be a usable point when parsed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StandardPublicKey {
    key: VerifyingKey,
}

impl StandardPublicKey {
    /// Decodes `whpk_<base64>` of 32 bytes. The prefix is required: it is what tells a public key
    /// from a pasted secret seed, which is 32 bytes of base64 too.
    pub fn parse(text: &str) -> Result<Self, InvalidEd25519Key> {
        let bytes = decode(text, PUBLIC_KEY_PREFIX, "public")?;
        let bytes: [u8; PUBLIC_KEY_LENGTH] =
            bytes
                .try_into()
                .map_err(|bytes: Vec<u8>| InvalidEd25519Key::WrongLength {
                    kind: "public",
                    len: bytes.len(),
                    expected: "an ed25519 public key is 32 bytes",
                })?;
        Self::from_bytes(&bytes)
    }

    /// The key of 32 compressed-point bytes; refuses bytes that are not a point of the curve, and
    /// small-order points.
    pub fn from_bytes(bytes: &[u8; PUBLIC_KEY_LENGTH]) -> Result<Self, InvalidEd25519Key> {
        let key = VerifyingKey::from_bytes(bytes).map_err(InvalidEd25519Key::NotOnCurve)?;
        if key.is_weak() {
            return Err(InvalidEd25519Key::Weak);
        }
        Ok(StandardPublicKey { key })
    }

    /// The dalek key, for `verify_strict`.
    pub fn verifying_key(&self) -> &VerifyingKey {
        &self.key
    }
}

/// `whpk_<base64>`, the form it is configured in.
impl std::fmt::Display for StandardPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PUBLIC_KEY_PREFIX}{}",
            BASE64.encode(self.key.as_bytes())
        )
    }
}

/// Public, so shown: an operator can tell which configured key is which.
impl std::fmt::Debug for StandardPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StandardPublicKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032 section 7.1, TEST 1.
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    fn b64(hex_text: &str) -> String {
        BASE64.encode(hex::decode(hex_text).expect("hex"))
    }

    #[test]
    fn secret_keys_parse_as_seed_or_seed_and_public_key() {
        let from_seed = StandardSigningKey::parse(&format!("whsk_{}", b64(SEED))).expect("seed");
        assert_eq!(
            from_seed.public_key().verifying_key().as_bytes()[..],
            hex::decode(PUBLIC).expect("hex")[..]
        );
        let pair = StandardSigningKey::parse(&format!("whsk_{}", b64(&format!("{SEED}{PUBLIC}"))))
            .expect("seed and public key");
        assert_eq!(pair.public_key(), from_seed.public_key());
        assert_eq!(
            pair.sign("msg_1", 1, b"{}"),
            from_seed.sign("msg_1", 1, b"{}")
        );
        assert_eq!(format!("{from_seed:?}"), "StandardSigningKey(***)");
    }

    #[test]
    fn bad_secret_keys_say_why_without_showing_the_key() {
        let other_public = StandardSigningKey::from_seed(&[7; 32]).public_key();
        let mismatched = format!(
            "whsk_{}",
            BASE64.encode(
                [
                    hex::decode(SEED).expect("hex"),
                    other_public.verifying_key().as_bytes().to_vec()
                ]
                .concat()
            )
        );
        for (text, wanted) in [
            (format!("whsec_{}", b64(SEED)), "starts with whsk_"),
            (b64(SEED), "starts with whsk_"),
            ("whsk_not base64!".to_owned(), "not base64"),
            ("whsk_".to_owned(), "empty after whsk_"),
            (format!("whsk_{}", BASE64.encode([1u8; 31])), "31 bytes"),
            (format!("whsk_{}", BASE64.encode([1u8; 33])), "33 bytes"),
            (mismatched, "not its seed's public key"),
        ] {
            let error = StandardSigningKey::parse(&text)
                .expect_err(&text)
                .to_string();
            assert!(error.contains(wanted), "{text}: {error}");
            let material = &text[text.len().min(5)..];
            assert!(
                material.is_empty() || !error.contains(material),
                "{error} shows the key"
            );
        }
    }

    #[test]
    fn public_keys_must_be_32_bytes_of_a_usable_point() {
        let key = StandardPublicKey::parse(&format!("whpk_{}", b64(PUBLIC))).expect("valid");
        assert_eq!(key.to_string(), format!("whpk_{}", b64(PUBLIC)));
        assert_eq!(
            format!("{key:?}"),
            format!("StandardPublicKey(whpk_{})", b64(PUBLIC))
        );
        // y = 2 has no x on the curve (x² = (y² − 1) / (d·y² + 1) is not a square mod p).
        let mut off_curve = [0u8; 32];
        off_curve[0] = 2;
        // The neutral element (y = 1): order 1, the universal-forgery key.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        for (text, wanted) in [
            (b64(PUBLIC), "starts with whpk_"),
            (format!("whsk_{}", b64(PUBLIC)), "starts with whpk_"),
            ("whpk_%%%%".to_owned(), "not base64"),
            ("whpk_".to_owned(), "empty after whpk_"),
            (format!("whpk_{}", BASE64.encode([1u8; 31])), "31 bytes"),
            (
                format!("whpk_{}", b64(&format!("{SEED}{PUBLIC}"))),
                "64 bytes",
            ),
            (format!("whpk_{}", BASE64.encode(off_curve)), "not a point"),
            (format!("whpk_{}", BASE64.encode(identity)), "small-order"),
        ] {
            let error = StandardPublicKey::parse(&text)
                .expect_err(&text)
                .to_string();
            assert!(error.contains(wanted), "{text}: {error}");
        }
    }

    #[test]
    fn signed_content_is_id_timestamp_payload() {
        assert_eq!(
            signed_content("msg_1", -5, b"{\"a\":1}"),
            b"msg_1.-5.{\"a\":1}"
        );
    }
}
