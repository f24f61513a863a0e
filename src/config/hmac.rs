//! `scheme = "hmac"`: a sender's signature rules written as settings rather than code, in
//! `[sources.NAME.hmac]`, over an optional named preset (`preset = "typeform"`, see
//! [`super::hmac_presets`]). What is given in the source wins over the preset, field by field.
//! Resolved once into [`HmacRules`], validated naming the key of any error
//! (`sources.NAME.hmac.signed`); the verifying is `crate::webhook::sources::hmac`.

use serde::Deserialize;

use super::hmac_presets::{preset, preset_names};
pub use super::hmac_template::{parse_template, Piece};
use super::sources::{SchemeKind, SourceSettings};
use super::ConfigError;

/// Most signatures one header may carry: each is compared, so the work per delivery is bounded.
pub const MAX_SIGNATURES_PER_HEADER: usize = 16;

/// `[sources.NAME.hmac]` (and a preset's `hmac` table): every field optional, so a source may
/// override one field of its preset. Defaults are applied by [`resolve`].
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
    fn into_vec(self) -> Vec<String> {
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

/// Where a value of the delivery is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locator {
    /// A request header (lowercase name).
    Header(String),
    /// JSON pointers into the body, their values joined with `:` (one, mostly).
    Pointer(Vec<String>),
}

/// Where the signed timestamp is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimestampAt {
    /// A header of its own (lowercase name).
    Header(String),
    /// A `key=value` part of the signature header.
    Key(String),
}

/// A source's `hmac` settings, its preset's under them, with defaults applied and validated.
#[derive(Debug, Clone)]
pub struct HmacRules {
    /// The HMAC's hash.
    pub algorithm: Algorithm,
    /// How each signature is written.
    pub encoding: Encoding,
    /// The signature header, lowercase.
    pub signature_header: String,
    /// Text before each signature; empty for none.
    pub signature_prefix: String,
    /// The signed string, in pieces.
    pub signed: Vec<Piece>,
    /// Where the timestamp is and how it is written, if one is signed.
    pub timestamp: Option<(TimestampAt, TimestampFormat)>,
    /// Splits the signature header into parts; `None`: one signature.
    pub separator: Option<String>,
    /// The key of the `key=value` parts that are signatures.
    pub signature_key: Option<String>,
    /// How secrets become keys.
    pub secret_encoding: SecretEncoding,
    /// Stripped from each secret when present.
    pub secret_prefix: String,
    /// Where the dedup id is.
    pub id: Locator,
    /// Where the event type is, if anywhere.
    pub event_type: Option<Locator>,
    /// The pointer to the array of events, when the body is a batch (`""`: the body).
    pub items: Option<String>,
    /// The preset's tolerance, used when the source sets none.
    pub default_tolerance_secs: Option<u64>,
}

impl HmacRules {
    /// Whether the signed string has `{url}`, so `public_url` is required.
    pub fn signs_the_url(&self) -> bool {
        self.signed.contains(&Piece::Url)
    }

    /// The key each secret gives, or why it gives none (the secret is never shown).
    pub fn key_of(&self, secret: &str) -> Result<Vec<u8>, &'static str> {
        use base64::Engine;
        let text = secret.strip_prefix(&self.secret_prefix).unwrap_or(secret);
        let key = match self.secret_encoding {
            SecretEncoding::Raw => text.as_bytes().to_vec(),
            SecretEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| "is not base64 (after its prefix, if any)")?,
            SecretEncoding::Hex => hex::decode(text).map_err(|_| "is not hex")?,
        };
        if key.is_empty() {
            return Err("gives an empty key");
        }
        Ok(key)
    }
}

/// A refusal of `sources.NAME.hmac.FIELD` (or `sources.NAME.FIELD` for a top-level `field`).
fn refuse(name: &str, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid_at(format!("sources.{name}.{field}"), reason)
}

/// The rules of `source` (`scheme = "hmac"`), named `name`: its preset, its own `hmac` table
/// over it, defaults, then every check, naming the key it is about.
pub fn resolve(name: &str, source: &SourceSettings) -> Result<HmacRules, ConfigError> {
    let (base, default_tolerance_secs) = match &source.preset {
        None => (HmacSettings::default(), None),
        Some(wanted) => {
            let found = preset(wanted)
                .map_err(|e| refuse(name, "preset", format!("the built-in presets: {e}")))?
                .ok_or_else(|| {
                    refuse(
                        name,
                        "preset",
                        format!("unknown preset `{wanted}`; known: {}", preset_names()),
                    )
                })?;
            (found.hmac.clone(), found.tolerance_secs)
        }
    };
    let own = source.hmac.clone().unwrap_or_default();
    let merged = overlay(base, own);
    let key = |field: &str| format!("hmac.{field}");
    let header = |field: &str, value: Option<String>| -> Result<Option<String>, ConfigError> {
        match value {
            Some(v) if v.parse::<http::HeaderName>().is_err() => {
                Err(refuse(name, &key(field), "is not a valid HTTP header name"))
            }
            v => Ok(v.map(|v| v.to_ascii_lowercase())),
        }
    };
    let signature_header =
        header("signature_header", merged.signature_header)?.ok_or_else(|| {
            refuse(
                name,
                &key("signature_header"),
                "is required: the header the sender puts its signature in (or set `preset`)",
            )
        })?;
    let signed = parse_template(merged.signed.as_deref().unwrap_or("{body}"))
        .map_err(|why| refuse(name, &key("signed"), why))?;
    let separator = match merged.separator {
        Some(s) if s.is_empty() => {
            return Err(refuse(name, &key("separator"), "must not be empty"))
        }
        s => s,
    };
    for (field, value) in [
        ("signature_key", &merged.signature_key),
        ("timestamp_key", &merged.timestamp_key),
    ] {
        if value.is_some() && separator.is_none() {
            return Err(refuse(
                name,
                &key(field),
                "needs `separator`: it names a `key=value` part of the signature header",
            ));
        }
    }
    if merged.timestamp_key.is_some() && merged.signature_key.is_none() {
        return Err(refuse(
            name,
            &key("timestamp_key"),
            "needs `signature_key`: the other parts of the header are then the signatures",
        ));
    }
    let timestamp_header = header("timestamp_header", merged.timestamp_header)?;
    let format = merged.timestamp_format.unwrap_or(TimestampFormat::Unix);
    let timestamp = match (timestamp_header, merged.timestamp_key) {
        (Some(_), Some(_)) => {
            return Err(refuse(
                name,
                &key("timestamp_key"),
                "set either `timestamp_header` or `timestamp_key`, not both",
            ))
        }
        (Some(h), None) => Some((TimestampAt::Header(h), format)),
        (None, Some(k)) => Some((TimestampAt::Key(k), format)),
        (None, None) => None,
    };
    if timestamp.is_none() && signed.contains(&Piece::Timestamp) {
        return Err(refuse(
            name,
            &key("signed"),
            "has {timestamp} but neither `timestamp_header` nor `timestamp_key` says where it is",
        ));
    }
    let locate = |header_field: &str, header_value: Option<String>, pointer: Option<Pointers>| {
        let pointer_field = header_field.replace("header", "pointer");
        match (
            header(header_field, header_value)?,
            pointer.map(Pointers::into_vec),
        ) {
            (Some(_), Some(_)) => Err(refuse(
                name,
                &key(&pointer_field),
                format!("set either `{header_field}` or `{pointer_field}`, not both"),
            )),
            (Some(h), None) => Ok(Some(Locator::Header(h))),
            (None, Some(p)) if p.is_empty() || p.iter().any(|p| !p.starts_with('/')) => {
                Err(refuse(
                    name,
                    &key(&pointer_field),
                    "must be a JSON pointer: `/` then the path (`/event_id`, `/data/id`)",
                ))
            }
            (None, Some(p)) => Ok(Some(Locator::Pointer(p))),
            (None, None) => Ok(None),
        }
    };
    let id = locate("id_header", merged.id_header, merged.id_pointer)?.ok_or_else(|| {
        refuse(
            name,
            &key("id_header"),
            "set `id_header` or `id_pointer`: where the sender's id for the event is, the same on \
             every retry (its events are deduplicated on it)",
        )
    })?;
    let event_type = locate(
        "type_header",
        merged.type_header,
        merged.type_pointer.map(Pointers::One),
    )?;
    let items = merged.items_pointer;
    match (&items, &id) {
        (Some(p), _) if !p.is_empty() && !p.starts_with('/') => {
            return Err(refuse(
                name,
                &key("items_pointer"),
                "must be a JSON pointer (`/events`) or \"\" for a body that is the array",
            ))
        }
        // One header per delivery: every event of the batch would share its id, and all but
        // the first would be dropped as duplicates.
        (Some(_), Locator::Header(_)) => {
            return Err(refuse(
                name,
                &key("items_pointer"),
                "needs `id_pointer` (read in each item), not `id_header`: one header cannot \
                 tell the events of a batch apart",
            ))
        }
        _ => {}
    }
    Ok(HmacRules {
        algorithm: merged.algorithm.unwrap_or(Algorithm::Sha256),
        encoding: merged.encoding.unwrap_or(Encoding::Hex),
        signature_header,
        signature_prefix: merged.signature_prefix.unwrap_or_default(),
        signed,
        timestamp,
        separator,
        signature_key: merged.signature_key,
        secret_encoding: merged.secret_encoding.unwrap_or(SecretEncoding::Raw),
        secret_prefix: merged.secret_prefix.unwrap_or_default(),
        id,
        event_type,
        items,
        default_tolerance_secs,
    })
}

/// The rules of `source` when its scheme is `hmac` (and each secret giving a key where the
/// ingress uses them), `None` for a named scheme, which takes neither `preset` nor `hmac`.
pub(super) fn check(
    name: &str,
    source: &SourceSettings,
    ingress: bool,
) -> Result<Option<HmacRules>, ConfigError> {
    if source.scheme != SchemeKind::Hmac {
        return match (&source.preset, &source.hmac) {
            (None, None) => Ok(None),
            (preset, _) => Err(refuse(
                name,
                if preset.is_some() { "preset" } else { "hmac" },
                format!(
                    "only `scheme = \"hmac\"` takes `preset` and `hmac`; the {} scheme's rules \
                     are fixed",
                    source.scheme.name()
                ),
            )),
        };
    }
    let rules = resolve(name, source)?;
    if ingress {
        for (i, secret) in source.secrets.iter().enumerate() {
            rules.key_of(secret.expose()).map_err(|why| {
                refuse(
                    name,
                    "secrets",
                    format!(
                        "secret number {} {why} (hmac.secret_encoding, hmac.secret_prefix)",
                        i + 1
                    ),
                )
            })?;
        }
    }
    Ok(Some(rules))
}

/// `own` over `base`, field by field.
fn overlay(base: HmacSettings, own: HmacSettings) -> HmacSettings {
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

#[cfg(test)]
#[path = "hmac_tests.rs"]
mod tests;
