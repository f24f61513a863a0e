//! The `[sources.NAME]` keys of the `paypal` scheme. PayPal shares no secret: it signs with a
//! private key and names, in each delivery, the certificate to verify with; what the receiver
//! must know is its own `webhook_id` (PayPal signs it into every delivery), and where that
//! certificate may come from: only PayPal's own hosts (`certificate_url_prefixes`, defaulting
//! to [`PAYPAL_CERTIFICATE_URL_PREFIXES`]), or a `certificate` configured here, used instead of
//! fetching any.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};
use url::Url;

use super::{ConfigError, SourceSettings};
use crate::signature::certificate::{RsaCertificate, MAX_PEM_BYTES};

/// Where PayPal's certificates are published (`PAYPAL-CERT-URL` is
/// `https://api.paypal.com/v1/notifications/certs/CERT-…`, `api.sandbox.paypal.com` in the
/// sandbox; the `api-m` hosts serve the same API): the only places fetched from by default.
/// Exact hosts, not `*.paypal.com`: no other PayPal host is a certificate's source.
pub const PAYPAL_CERTIFICATE_URL_PREFIXES: &[&str] = &[
    "https://api.paypal.com/v1/notifications/certs/",
    "https://api-m.paypal.com/v1/notifications/certs/",
    "https://api.sandbox.paypal.com/v1/notifications/certs/",
    "https://api-m.sandbox.paypal.com/v1/notifications/certs/",
];

/// What a PayPal message-verification certificate's common name starts and ends with
/// (`messageverificationcerts.paypal.com`, `messageverificationcerts.sandbox.paypal.com`), as
/// PayPal's Java SDK checks it (`SSLUtil.validateCertificateChain`).
pub const PAYPAL_CERTIFICATE_NAME: (&str, &str) = ("messageverificationcerts.", ".paypal.com");

/// Whether `certificate` is named as PayPal's message-verification certificates are.
pub fn is_paypal_signing_certificate(certificate: &RsaCertificate) -> bool {
    let (starts, ends) = PAYPAL_CERTIFICATE_NAME;
    certificate.common_name().is_some_and(|cn| {
        let cn = cn.to_ascii_lowercase();
        cn.starts_with(starts) && cn.ends_with(ends)
    })
}

/// `certificate`: the PEM text itself (it contains `-----BEGIN`), or the path of a file holding
/// it; read and parsed while the configuration loads, so a bad one names its key at start.
pub(super) fn configured_certificate<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<RsaCertificate>, D::Error> {
    let Some(given) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let pem = if given.contains("-----BEGIN") {
        given.into_bytes()
    } else {
        read_bounded(given.trim()).map_err(serde::de::Error::custom)?
    };
    RsaCertificate::from_pem(&pem)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("not a usable PEM certificate: {e}")))
}

/// The file at `path`, at most [`MAX_PEM_BYTES`] of it.
fn read_bounded(path: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("neither PEM text nor a readable file ({path}): {e}"))?;
    let mut pem = Vec::new();
    file.take(MAX_PEM_BYTES as u64 + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(pem)
}

/// `certificate_url_prefixes`: a list, or one comma-separated string (the environment), each
/// checked by [`certificate_url_prefix`].
pub(super) fn certificate_url_prefixes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<Url>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        One(String),
        Many(Vec<String>),
    }
    let items: Vec<String> = match Given::deserialize(d)? {
        Given::One(s) => s.split(',').map(str::to_owned).collect(),
        Given::Many(v) => v,
    };
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| certificate_url_prefix(s).map_err(serde::de::Error::custom))
        .collect()
}

/// One allowed prefix: an `https://` URL (or `http://` on a loopback host, for a test's own
/// certificate server) with no user, query or fragment, whose path ends with `/`, so it names
/// a folder (`/certs` would admit `/certs-of-anyone`). Hosts are compared whole, so
/// `https://api.paypal.com` cannot be extended into `https://api.paypal.com.example`.
pub fn certificate_url_prefix(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    let plain = url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none();
    if !scheme_ok || !plain || url.host().is_none() || !url.path().ends_with('/') {
        return Err(format!(
            "`{text}` must be an https:// URL (http:// only on a loopback host) ending with /, \
             without user, query or fragment"
        ));
    }
    Ok(url)
}

/// The `paypal` scheme's own rules, `key` building a key's dotted path; and, for every other
/// scheme, that none of its keys is set.
pub(super) fn check_paypal_keys(
    source: &SourceSettings,
    ingress: bool,
    env_name: &str,
    key: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    let is_paypal = source.scheme == super::SchemeKind::Paypal;
    if !is_paypal {
        for (set, field) in [
            (source.webhook_id.is_some(), "webhook_id"),
            (source.certificate.is_some(), "certificate"),
            (
                !source.certificate_url_prefixes.is_empty(),
                "certificate_url_prefixes",
            ),
        ] {
            if set {
                return Err(ConfigError::invalid_at(
                    key(field),
                    format!(
                        "only the paypal scheme reads it, not {}; remove it",
                        source.scheme.name()
                    ),
                ));
            }
        }
        return Ok(());
    }
    if !source.secrets.is_empty() {
        return Err(ConfigError::invalid_at(
            key("secrets"),
            "PayPal shares no secret (it signs with its certificate): remove it, and set \
             webhook_id",
        ));
    }
    match source.webhook_id.as_deref().map(str::trim) {
        None | Some("") if ingress => {
            return Err(ConfigError::invalid_at(
                key("webhook_id"),
                format!(
                    "no webhook id configured for this paypal source: set the id PayPal shows \
                     for the webhook (Apps & Credentials → the app → Webhooks), which it signs \
                     into every delivery (env DEDUP_SOURCES__{env_name}__WEBHOOK_ID)"
                ),
            ))
        }
        Some(id) if !id.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            return Err(ConfigError::invalid_at(
                key("webhook_id"),
                "a PayPal webhook id is letters and digits only (as `1JE4291016473214C`)",
            ))
        }
        _ => {}
    }
    if let Some(certificate) = &source.certificate {
        if !source.certificate_url_prefixes.is_empty() {
            return Err(ConfigError::invalid_at(
                key("certificate_url_prefixes"),
                "a configured certificate is used instead of fetching any, so these would not \
                 be used; remove one of the two",
            ));
        }
        if !is_paypal_signing_certificate(certificate) {
            return Err(ConfigError::invalid_at(
                key("certificate"),
                format!(
                    "its subject's common name ({:?}) is not PayPal's message-verification \
                     certificate's ({}…{})",
                    certificate.common_name().unwrap_or_default(),
                    PAYPAL_CERTIFICATE_NAME.0,
                    PAYPAL_CERTIFICATE_NAME.1
                ),
            ));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if !certificate.is_valid_at(now) {
            return Err(ConfigError::invalid_at(
                key("certificate"),
                "the certificate is outside its validity period now: download PayPal's current \
                 one (the PAYPAL-CERT-URL of a recent delivery), or remove the key to fetch it",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use figment::providers::{Format, Serialized, Toml};

    use crate::config::{defaults, ConfigError, Settings};

    const PEM: &str = include_str!("../signature/testdata/rsa_test_certificate.pem");

    fn load(extra: &str) -> Result<Settings, ConfigError> {
        Settings::from_figment(
            defaults()
                .merge(Serialized::default("stripe.secrets", "whsec_test"))
                .merge(Toml::string(extra)),
        )
    }

    #[test]
    fn a_paypal_source_needs_its_webhook_id_and_no_secret() {
        let s = load("[sources.paypal]\nscheme = \"paypal\"\nwebhook_id = \"1JE4291016473214C\"\n")
            .expect("valid");
        let paypal = &s.sources["paypal"];
        assert_eq!(paypal.webhook_id.as_deref(), Some("1JE4291016473214C"));
        assert!(paypal.certificate.is_none() && paypal.certificate_url_prefixes.is_empty());
        assert_eq!(paypal.tolerance_secs(), 300);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paypal.pem");
        std::fs::write(&path, PEM).unwrap();
        for certificate in [PEM.to_owned(), path.display().to_string()] {
            let s = load(&format!(
                "[sources.paypal]\nscheme = \"paypal\"\nwebhook_id = \"W1\"\ncertificate = '''{certificate}'''\n"
            ))
            .expect("a configured certificate, inline or by path");
            assert!(s.sources["paypal"].certificate.is_some());
        }
        let s = load(
            "[sources.paypal]\nscheme = \"paypal\"\nwebhook_id = \"W1\"\n\
             certificate_url_prefixes = \"http://127.0.0.1:4000/certs/, https://certs.example.com/p/\"\n",
        )
        .expect("prefixes, comma-separated");
        assert_eq!(s.sources["paypal"].certificate_url_prefixes.len(), 2);
    }

    #[test]
    fn each_paypal_refusal_names_the_key() {
        let base = "[sources.paypal]\nscheme = \"paypal\"\n";
        for (extra, key, why) in [
            ("", "sources.paypal.webhook_id", "no webhook id"),
            ("webhook_id = \" \"\n", "sources.paypal.webhook_id", "no webhook id"),
            ("webhook_id = \"1JE-42\"\n", "sources.paypal.webhook_id", "letters and digits"),
            (
                "webhook_id = \"W1\"\nsecrets = \"s\"\n",
                "sources.paypal.secrets",
                "shares no secret",
            ),
            (
                "webhook_id = \"W1\"\ncertificate = \"/nonexistent/paypal.pem\"\n",
                "sources.paypal.certificate",
                "readable file",
            ),
            (
                "webhook_id = \"W1\"\ncertificate = \"-----BEGIN CERTIFICATE-----\\nAA==\\n-----END CERTIFICATE-----\\n\"\n",
                "sources.paypal.certificate",
                "not a usable PEM certificate",
            ),
            (
                "webhook_id = \"W1\"\ncertificate_url_prefixes = [\"http://certs.example.com/\"]\n",
                "sources.paypal.certificate_url_prefixes",
                "https://",
            ),
            (
                "webhook_id = \"W1\"\ncertificate_url_prefixes = [\"https://api.paypal.com/v1/certs\"]\n",
                "sources.paypal.certificate_url_prefixes",
                "ending with /",
            ),
            (
                "webhook_id = \"W1\"\ncertificate_url_prefixes = [\"https://u@api.paypal.com/c/\"]\n",
                "sources.paypal.certificate_url_prefixes",
                "without user",
            ),
        ] {
            let text = load(&format!("{base}{extra}")).expect_err(extra).to_string();
            assert!(text.contains(key) && text.contains(why), "{extra}: {text}");
        }
        let both = format!(
            "{base}webhook_id = \"W1\"\ncertificate = '''{PEM}'''\n\
             certificate_url_prefixes = [\"https://api.paypal.com/c/\"]\n"
        );
        let text = load(&both).expect_err("both").to_string();
        assert!(
            text.contains("`sources.paypal.certificate_url_prefixes`"),
            "{text}"
        );
        let text =
            load("[sources.github]\nscheme = \"github\"\nsecrets = \"x\"\nwebhook_id = \"W1\"\n")
                .expect_err("webhook_id on github")
                .to_string();
        assert!(
            text.contains("`sources.github.webhook_id`") && text.contains("only the paypal"),
            "{text}"
        );
        load("[roles]\ningress = false\n[sources.paypal]\nscheme = \"paypal\"\n")
            .expect("a consume-only process needs no webhook id");
    }
}
