//! `scheme = "hmac"`: a sender's signature rules written as settings rather than code, in
//! `[sources.NAME.hmac]`, over an optional named preset (`preset = "typeform"`, see
//! [`super::hmac_presets`]). What is given in the source wins over the preset, field by field.
//! Resolved once into [`HmacRules`], validated naming the key of any error
//! (`sources.NAME.hmac.signed`); the verifying is `crate::webhook::sources::hmac`.

use super::hmac_presets::{preset, preset_names};
use super::hmac_settings::overlay;
pub use super::hmac_settings::{
    Algorithm, Encoding, HmacSettings, Pointers, SecretEncoding, TimestampFormat,
    MAX_SIGNATURES_PER_HEADER,
};
pub use super::hmac_template::{parse_template, Piece};
use super::ConfigError;

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
pub(super) fn refuse(name: &str, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid_at(format!("sources.{name}.{field}"), reason)
}

/// The rules of source `name` (`scheme = "hmac"`): its `preset`, its own `hmac` table (`own`)
/// over it, defaults, then every check, naming the key it is about.
pub fn resolve(
    name: &str,
    preset_name: Option<&str>,
    own: Option<&HmacSettings>,
) -> Result<HmacRules, ConfigError> {
    let (base, default_tolerance_secs) = match preset_name {
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
    let own = own.cloned().unwrap_or_default();
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

#[cfg(test)]
#[path = "hmac_tests.rs"]
mod tests;
