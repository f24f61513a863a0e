//! Whether a `[sources.NAME]` can work, checked once at load (`validate.rs`): its name, its
//! secrets as its scheme keys them, `public_url` and `tolerance` where the scheme (or the
//! declarative scheme's rules) signs a URL or a timestamp, PayPal's keys, `id_field`; each
//! refusal names the key it is about.

use std::time::Duration;

use super::durations::{not_whole_seconds, shown};
use super::hmac::{refuse, resolve, HmacRules};
use super::paypal::check_paypal_keys;
use super::sources::{SchemeKind, SourceSettings, MAX_SOURCE_NAME_CHARS, MAX_TOLERANCE_SECS};
use super::ConfigError;

/// Why a source's settings cannot work, with the dotted key they are about
/// (`sources.github.secrets`). `taken`: names other routes or key spaces own. Its secrets are
/// required where the ingress verifies with them (`ingress`), as `stripe.secrets` are; its name
/// everywhere, since every role files or lists its events under it.
pub(super) fn check_source(
    name: &str,
    source: &SourceSettings,
    taken: &[&str],
    ingress: bool,
) -> Result<(), ConfigError> {
    let key = |field: &str| {
        if field.is_empty() {
            format!("sources.{name}")
        } else {
            format!("sources.{name}.{field}")
        }
    };
    let name_ok = (1..=MAX_SOURCE_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !name_ok {
        // The name is shown escaped and cut: it may be anything the file held.
        return Err(ConfigError::invalid_at(
            format!("sources.{}", crate::event::printable(name, 80)),
            format!(
                "a source's name is 1 to {MAX_SOURCE_NAME_CHARS} of a-z, 0-9, _ and -: it is the \
                 path of POST /webhooks/NAME, a metrics label and the source half of its events' \
                 dedup key"
            ),
        ));
    }
    if let Some(other) = taken.iter().find(|t| **t == name) {
        return Err(ConfigError::invalid_at(
            key(""),
            format!(
                "the name `{other}` is taken: POST /webhooks/stripe and /webhooks/standard are \
                 served whatever the configuration says, and the Standard Webhooks route files \
                 its events under standard_webhooks.source; choose another name"
            ),
        ));
    }
    check_paypal_keys(source, ingress, &name.to_ascii_uppercase(), &key)?;
    if let Some(field) = &source.id_field {
        if matches!(source.scheme, SchemeKind::Adyen | SchemeKind::Hmac) {
            return Err(ConfigError::invalid_at(
                key("id_field"),
                format!(
                    "the {} scheme says where each event's id is itself (adyen: each item's own \
                     ids; hmac: hmac.id_pointer or hmac.id_header); remove it",
                    source.scheme.name()
                ),
            ));
        }
        if field.trim().is_empty() || field.len() > 256 {
            return Err(ConfigError::invalid_at(
                key("id_field"),
                "must be a JSON pointer into the body (/payload/object/uuid) or a form \
                 parameter's name (MessageSid), at most 256 characters",
            ));
        }
    }
    if ingress && source.secrets.is_empty() && source.scheme != SchemeKind::Paypal {
        return Err(ConfigError::invalid_at(
            key("secrets"),
            format!(
                "no secret configured for this {} source (an unset variable in a template?): \
                 set its signing secret, several comma-separated during a rotation \
                 (env DEDUP_SOURCES__{}__SECRETS)",
                source.scheme.name(),
                name.to_ascii_uppercase()
            ),
        ));
    }
    if ingress {
        for secret in &source.secrets {
            source
                .scheme
                .key_of(secret.expose())
                .map_err(|why| ConfigError::invalid_at(key("secrets"), why))?;
        }
    }
    let rules = check_hmac(name, source, ingress)?;
    let signs_the_url = rules
        .as_ref()
        .map_or(source.scheme.signs_the_url(), |r| r.signs_the_url());
    let signs_a_timestamp = rules
        .as_ref()
        .map_or(source.scheme.signs_a_timestamp(), |r| r.timestamp.is_some());
    match (&source.public_url, signs_the_url) {
        // Required where the ingress verifies with it, as the secrets are.
        (None, true) if ingress => {
            return Err(ConfigError::invalid_at(
                key("public_url"),
                format!(
                    "the {} scheme signs the URL it posts to: set it, exactly as configured at \
                     the sender (https://<your host>/webhooks/{name})",
                    source.scheme.name()
                ),
            ))
        }
        (Some(_), false) => {
            return Err(ConfigError::invalid_at(
                key("public_url"),
                format!(
                    "the {} scheme signs no URL, so it would not be checked; remove it",
                    source.scheme.name()
                ),
            ))
        }
        (Some(url), true) if !absolute_http_url(url) => {
            return Err(ConfigError::invalid_at(
                key("public_url"),
                "must be an absolute http:// or https:// URL with a host, as the sender was \
                 given it",
            ))
        }
        _ => {}
    }
    match source.tolerance {
        Some(_) if !signs_a_timestamp => Err(ConfigError::invalid_at(
            key("tolerance"),
            format!(
                "the {} scheme signs no timestamp, so there is nothing to hold it to; remove it",
                source.scheme.name()
            ),
        )),
        Some(tolerance) if tolerance.is_zero() => Err(ConfigError::invalid_at(
            key("tolerance"),
            "must be greater than zero",
        )),
        Some(tolerance) => match not_whole_seconds(tolerance) {
            Some(reason) => Err(ConfigError::invalid_at(key("tolerance"), reason)),
            None if tolerance.as_secs() > MAX_TOLERANCE_SECS => Err(ConfigError::invalid_at(
                key("tolerance"),
                format!(
                    "is {}, more than {}, the most it accepts (as stripe.tolerance: a replayed \
                     delivery is accepted for that long)",
                    shown(tolerance),
                    shown(Duration::from_secs(MAX_TOLERANCE_SECS))
                ),
            )),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// Whether `url` is an absolute `http`/`https` URL naming a host, with nothing around it.
fn absolute_http_url(url: &str) -> bool {
    if url.trim() != url || url.is_empty() {
        return false;
    }
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.host().is_some_and(|h| !h.is_empty())
        }
        Err(_) => false,
    }
}

/// The rules of `source` when its scheme is `hmac` (and each secret giving a key where the
/// ingress uses them), `None` for a named scheme, which takes neither `preset` nor `hmac`.
fn check_hmac(
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
    let rules = resolve(name, source.preset.as_deref(), source.hmac.as_ref())?;
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
