//! `[sources.NAME.hmac]` as written (and a preset's `hmac` table): the declarative scheme's
//! settings as data, every field optional, before [`super::hmac::resolve`] applies a preset under
//! them, the defaults and the checks. Imports nothing of the rest of `config`, so the presets
//! (`hmac_presets.rs`) and the sources' settings (`sources.rs`) can both name it.

use serde::Deserialize;

/// Most signatures one header may carry: each is compared, so the work per delivery is bounded.
pub const MAX_SIGNATURES_PER_HEADER: usize = 16;

/// `[sources.NAME.hmac]` (and a preset's `hmac` table): every field optional, so a source may
/// override one field of its preset. Defaults are applied by [`super::hmac::resolve`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HmacSettings {
    /// The HMAC's hash: `sha1`, `sha256` (the default) or `sha512`.
    pub algorithm: Option<Algorithm>,
    /// How the signature is written in the header: `hex` (the default), `base64`, `base64url`.
    pub encoding: Option<Encoding>,
    /// The header that carries the signature(s). Required.
    pub signature_header: Option<String>,
    /// Text before each signature (`sha256=`, `v0=`, `v1,`); a part without it is skipped, as
    /// Standard Webhooks' verifiers skip signature versions they do not know.
    pub signature_prefix: Option<String>,
    /// What is signed: text with `{body}` (required: the raw body), `{timestamp}` (as sent),
    /// `{url}` (`public_url`), `{method}` (`POST`) and `{header:Name}`. Default `{body}`.
    pub signed: Option<String>,
    /// The header carrying the signed timestamp, if one is; held to `tolerance_secs`.
    pub timestamp_header: Option<String>,
    /// The key of the signature header's `key=value` part carrying the timestamp (Calendly's
    /// `t`); needs `separator`. Exclusive with `timestamp_header`.
    pub timestamp_key: Option<String>,
    /// How the timestamp is written: `unix` seconds (the default), `unix_ms`, or `rfc3339`.
    pub timestamp_format: Option<TimestampFormat>,
    /// Splits the signature header into parts (`,` or ` `), each a signature or, with
    /// `signature_key`, a `key=value` pair. Unset: the whole header is one signature.
    pub separator: Option<String>,
    /// With `separator`: the parts are `key=value`, and those of this key are signatures
    /// (Calendly's `v1`). Parts of other keys are ignored.
    pub signature_key: Option<String>,
    /// How each configured secret is turned into the HMAC key: `raw` bytes (the default),
    /// `base64` or `hex` decoded.
    pub secret_encoding: Option<SecretEncoding>,
    /// Stripped from each secret when present before it is decoded (`whsec_`).
    pub secret_prefix: Option<String>,
    /// The header holding the dedup id. Exactly one of `id_header`, `id_pointer`.
    pub id_header: Option<String>,
    /// The JSON pointer (RFC 6901, `/event_id`) into the body holding the dedup id, or a list
    /// of them whose values are joined with `:` (`["/event", "/payload/uri"]`) for a sender
    /// whose events carry no id of their own.
    pub id_pointer: Option<Pointers>,
    /// The header holding the event type, if the sender says. At most one of the two.
    pub type_header: Option<String>,
    /// The JSON pointer into the body holding the event type.
    pub type_pointer: Option<String>,
    /// The JSON pointer to an array in the body each element of which is an event of its own
    /// (HubSpot's batches); `""` for the body itself. `id_pointer` and `type_pointer` are then
    /// read in each element.
    pub items_pointer: Option<String>,
}

/// One JSON pointer or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Pointers {
    /// One pointer.
    One(String),
    /// Several, their values joined with `:`.
    Many(Vec<String>),
}

impl Pointers {
    pub(super) fn into_vec(self) -> Vec<String> {
        match self {
            Pointers::One(p) => vec![p],
            Pointers::Many(v) => v,
        }
    }
}

/// The HMAC's hash function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// HMAC-SHA1 (Intercom, Vercel): 20-byte signatures.
    Sha1,
    /// HMAC-SHA256: 32-byte signatures.
    Sha256,
    /// HMAC-SHA512: 64-byte signatures.
    Sha512,
}

impl Algorithm {
    /// The length in bytes of the HMAC's output.
    pub fn digest_len(self) -> usize {
        match self {
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }
}

/// How a signature is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Hex digits, either case.
    Hex,
    /// The standard base64 alphabet, padding optional.
    Base64,
    /// The URL-safe base64 alphabet, padding optional.
    Base64url,
}

/// How the signed timestamp is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestampFormat {
    /// Unix seconds.
    Unix,
    /// Unix milliseconds (HubSpot).
    UnixMs,
    /// An RFC 3339 date and time (Twitch).
    Rfc3339,
}

/// How a configured secret becomes the HMAC key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    /// The secret's UTF-8 bytes, as given.
    Raw,
    /// Base64-decoded (Standard Webhooks' `whsec_…`).
    Base64,
    /// Hex-decoded.
    Hex,
}

/// `own` over `base`, field by field.
pub(super) fn overlay(base: HmacSettings, own: HmacSettings) -> HmacSettings {
    HmacSettings {
        algorithm: own.algorithm.or(base.algorithm),
        encoding: own.encoding.or(base.encoding),
        signature_header: own.signature_header.or(base.signature_header),
        signature_prefix: own.signature_prefix.or(base.signature_prefix),
        signed: own.signed.or(base.signed),
        timestamp_header: own.timestamp_header.or(base.timestamp_header),
        timestamp_key: own.timestamp_key.or(base.timestamp_key),
        timestamp_format: own.timestamp_format.or(base.timestamp_format),
        separator: own.separator.or(base.separator),
        signature_key: own.signature_key.or(base.signature_key),
        secret_encoding: own.secret_encoding.or(base.secret_encoding),
        secret_prefix: own.secret_prefix.or(base.secret_prefix),
        id_header: own.id_header.or(base.id_header),
        id_pointer: own.id_pointer.or(base.id_pointer),
        type_header: own.type_header.or(base.type_header),
        type_pointer: own.type_pointer.or(base.type_pointer),
        items_pointer: own.items_pointer.or(base.items_pointer),
    }
}
