//! `[sources.NAME]`: named senders, each served at `POST /webhooks/NAME` and verified by its
//! scheme (`crate::webhook::sources`). NAME is the source half of the dedup key of their events,
//! and the `source` label of their metrics.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::hmac_presets::preset;
use super::hmac_settings::HmacSettings;
use super::paypal::{certificate_url_prefixes, configured_certificate};
use super::Secret;
use crate::signature::certificate::RsaCertificate;

/// Routes that exist whatever the configuration says: a source of that name would be shadowed
/// by them (axum matches a fixed path before `/webhooks/{name}`), and its events would share a
/// key space with theirs.
pub const RESERVED_SOURCE_NAMES: &[&str] = &["stripe", "standard"];

/// Longest source name: it is a path segment, a metrics label and the source half of every key.
pub const MAX_SOURCE_NAME_CHARS: usize = 64;

/// The default `tolerance`, in seconds, of a scheme whose sender signs a timestamp (Slack's five
/// minutes, as its SDK checks; Paddle's SDKs check five seconds, too tight for a clock the
/// ingress does not control).
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// The largest `tolerance`, in seconds, as `stripe.tolerance`'s.
pub const MAX_TOLERANCE_SECS: u64 = 3_600;

/// A sender's signature scheme. Adding one is a variant here and a file in
/// `crate::webhook::sources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeKind {
    /// `X-Hub-Signature-256: sha256=<hex>` over the raw body; id `X-GitHub-Delivery`.
    Github,
    /// `Linear-Signature: <hex>` over the body, its `webhookTimestamp` held to the tolerance; id
    /// `Linear-Delivery`.
    Linear,
    /// `Paddle-Signature: ts=<unix>;h1=<hex>` over `{ts}:{body}`; id the body's `event_id`.
    Paddle,
    /// `PAYPAL-TRANSMISSION-SIG`, `SHA256withRSA` under PayPal's certificate over
    /// `{transmission id}|{transmission time}|{webhook_id}|{crc32(body)}`; id the body's `id`.
    Paypal,
    /// `X-Shopify-Hmac-Sha256: <base64>` over the raw body; id `X-Shopify-Event-Id`.
    Shopify,
    /// `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{body}`; id the body's `event_id`.
    Slack,
    /// `x-square-hmacsha256-signature: <base64>` over `{public_url}{body}`; id the body's
    /// `event_id`.
    Square,
    /// `X-Twilio-Signature: <base64>`, HMAC-SHA1 over `{public_url}[?{query}]` and the sorted
    /// form parameters (or, with `bodySHA256` in the query, the URL alone and the body's hash);
    /// id `I-Twilio-Idempotency-Token`, else the resource's sid and status.
    Twilio,
    /// The HMAC-SHA256 (hex key) inside each item of a notification batch; each item its own
    /// event, id `{merchantAccountCode}:{pspReference}:{eventCode}:{success}`; answered
    /// `[accepted]`.
    Adyen,
    /// `x-zm-signature: v0=<hex>` over `v0:{timestamp}:{body}`; id the body's event, time and
    /// object; `endpoint.url_validation` answered.
    Zoom,
    /// Declarative: the rules are the source's `hmac` table, over its `preset`
    /// (`super::hmac`).
    Hmac,
}

impl SchemeKind {
    /// The name `scheme` takes in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            SchemeKind::Github => "github",
            SchemeKind::Linear => "linear",
            SchemeKind::Paddle => "paddle",
            SchemeKind::Paypal => "paypal",
            SchemeKind::Shopify => "shopify",
            SchemeKind::Slack => "slack",
            SchemeKind::Square => "square",
            SchemeKind::Twilio => "twilio",
            SchemeKind::Adyen => "adyen",
            SchemeKind::Zoom => "zoom",
            SchemeKind::Hmac => "hmac",
        }
    }

    /// Whether the sender signs a timestamp, so `tolerance_secs` means something (for `hmac`,
    /// its rules say: see `source_checks.rs`).
    pub fn signs_a_timestamp(self) -> bool {
        matches!(
            self,
            SchemeKind::Linear
                | SchemeKind::Paddle
                | SchemeKind::Paypal
                | SchemeKind::Slack
                | SchemeKind::Zoom
        )
    }

    /// Whether the sender signs the URL it posts to, so `public_url` is required.
    pub fn signs_the_url(self) -> bool {
        matches!(self, SchemeKind::Square | SchemeKind::Twilio)
    }

    /// The HMAC key a configured secret stands for: its UTF-8 bytes, but Adyen's, which is
    /// given as hex (as the Customer Area shows it) and keys the HMAC once decoded. `Err` says
    /// why the secret cannot be a key (the start is refused, naming `sources.NAME.secrets`).
    pub fn key_of(self, secret: &str) -> Result<Vec<u8>, String> {
        match self {
            // The decoder's error is not shown: it quotes the offending character of the secret.
            SchemeKind::Adyen => hex::decode(secret).map_err(|_| {
                "an adyen HMAC key is the hex string the Customer Area shows (it keys the HMAC \
                 once hex-decoded); one of the secrets is not hex (an even number of 0-9, a-f)"
                    .to_owned()
            }),
            _ => Ok(secret.as_bytes().to_vec()),
        }
    }

    /// The tolerance when `tolerance_secs` is unset: [`DEFAULT_TOLERANCE_SECS`], but Linear's
    /// 60 s, as its SDK checks (which works for retries only if Linear stamps each attempt's
    /// `webhookTimestamp` anew: not confirmed from Linear's pages).
    pub fn default_tolerance_secs(self) -> u64 {
        match self {
            SchemeKind::Linear => LINEAR_TOLERANCE_SECS,
            _ => DEFAULT_TOLERANCE_SECS,
        }
    }
}

/// Linear's default `tolerance_secs`: `@linear/sdk`'s `LinearWebhookClient.verify` window.
pub const LINEAR_TOLERANCE_SECS: u64 = 60;

/// One `[sources.NAME]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    /// How the sender signs and identifies its deliveries.
    pub scheme: SchemeKind,
    /// Signing secrets, each tried (rotation): a list, or one comma-separated string
    /// (`DEDUP_SOURCES__NAME__SECRETS=a,b`). Kept out of `Debug` output by [`Secret`]. At least
    /// one is required, except for `paypal`, which shares none (and refuses them).
    #[serde(default, deserialize_with = "comma_separated_source_secrets")]
    pub secrets: Vec<Secret>,
    /// Accepted clock difference in both directions, for schemes that sign a timestamp
    /// (`"5m"`; whole seconds, as the timestamps are); the scheme's default when unset
    /// ([`SchemeKind::default_tolerance_secs`]). Refused for schemes that sign none (it would
    /// promise a check that is not made). Formerly `tolerance_secs`, an integer, still read
    /// with a warning (`super::durations`).
    #[serde(default, deserialize_with = "super::durations::read_optional")]
    pub tolerance: Option<Duration>,
    /// The URL the sender posts to, exactly as given to it (Square signs it with the body): an
    /// absolute `http`/`https` URL, required for the schemes that sign it and refused for the
    /// others. Behind a proxy, the public one, not the one this process sees.
    #[serde(default)]
    pub public_url: Option<String>,
    /// `paypal` only, and required there: the webhook's id as PayPal shows it, which PayPal
    /// signs into every delivery (a delivery for another webhook does not verify).
    #[serde(default)]
    pub webhook_id: Option<String>,
    /// `paypal` only: PayPal's certificate (PEM text, or the path of a PEM file), used for every
    /// delivery instead of fetching the one it names. Parsed at start.
    #[serde(default, deserialize_with = "configured_certificate")]
    pub certificate: Option<RsaCertificate>,
    /// `paypal` only: where a delivery's `PAYPAL-CERT-URL` may point, as URL prefixes (a list
    /// or one comma-separated string); empty means PayPal's own
    /// ([`super::PAYPAL_CERTIFICATE_URL_PREFIXES`]). For a test's certificate server, not for
    /// production: anything else lets whoever serves there sign deliveries.
    #[serde(default, deserialize_with = "certificate_url_prefixes")]
    pub certificate_url_prefixes: Vec<url::Url>,
    /// `scheme = "hmac"` only: a named preset of rules (`super::hmac_presets`).
    #[serde(default)]
    pub preset: Option<String>,
    /// `scheme = "hmac"` only: the rules, over the preset's.
    #[serde(default)]
    pub hmac: Option<HmacSettings>,
    /// The field the dedup id is read from instead of the one the scheme chooses (Zoom and
    /// Twilio document none): a JSON pointer (`/payload/object/uuid`) into a JSON body, or a
    /// form parameter's name (`MessageSid`) in a form-encoded one. Refused for `adyen` (each
    /// item is its own event) and `hmac` (its rules say where the id is).
    #[serde(default)]
    pub id_field: Option<String>,
}

impl SourceSettings {
    /// The tolerance the scheme applies.
    pub fn tolerance_secs(&self) -> u64 {
        self.tolerance
            .map(|tolerance| tolerance.as_secs())
            .or_else(|| self.preset_tolerance_secs())
            .unwrap_or_else(|| self.scheme.default_tolerance_secs())
    }

    /// The tolerance the preset's sender documents, if it has one.
    fn preset_tolerance_secs(&self) -> Option<u64> {
        let name = self.preset.as_deref()?;
        preset(name).ok().flatten()?.tolerance_secs
    }
}

/// Every configured source, by name (sorted, so routes, logs and listings come in one order).
pub type Sources = BTreeMap<String, SourceSettings>;

/// A source's secrets: as `stripe.secrets`, a list or one comma-separated string, blanks
/// dropped. A value the environment layer read as a number or a boolean (figment parses
/// `DEDUP_…=12345` as an integer) is refused rather than turned back into text: `007` would come
/// back as `7`, a key that verifies nothing the sender signs.
fn comma_separated_source_secrets<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<Secret>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        One(String),
        Many(Vec<String>),
        Other(serde::de::IgnoredAny),
    }
    let items = match Given::deserialize(d)? {
        Given::One(s) => s.split(',').map(str::to_owned).collect(),
        Given::Many(v) => v,
        Given::Other(_) => {
            return Err(serde::de::Error::custom(
                "must be a list of strings or one comma-separated string; a secret that reads \
                 as a number or true/false must be quoted (in the environment too: \
                 DEDUP_SOURCES__NAME__SECRETS='\"0123\"')",
            ))
        }
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .map(Secret)
        .collect())
}

#[cfg(test)]
mod tests {
    use figment::providers::{Format, Serialized, Toml};

    use crate::config::{defaults, ConfigError, SchemeKind, Settings};

    fn load(extra: &str) -> Result<Settings, ConfigError> {
        Settings::from_figment(
            defaults()
                .merge(Serialized::default("stripe.secrets", "whsec_test"))
                .merge(Toml::string(extra)),
        )
    }

    fn refused(extra: &str) -> String {
        load(extra).expect_err(extra).to_string()
    }

    #[test]
    fn sources_load_with_their_secrets_kept_out_of_debug() {
        let s = load(
            "[sources.github]\nscheme = \"github\"\nsecrets = \"s3cret-one, s3cret-two\"\n\
             [sources.slack]\nscheme = \"slack\"\nsecrets = [\"s3cret-three\"]\n\
             [sources.shop-1]\nscheme = \"shopify\"\nsecrets = [\"s3cret-four\"]\n\
             [sources.paddle]\nscheme = \"paddle\"\nsecrets = [\"pdl_ntfset_s3cret\"]\ntolerance = \"30s\"\n\
             [sources.linear]\nscheme = \"linear\"\nsecrets = [\"lin_wh_s3cret\"]\n\
             [sources.square]\nscheme = \"square\"\nsecrets = [\"sq\"]\n\
             public_url = \"https://hooks.example.com/webhooks/square\"\n\
             [sources.adyen]\nscheme = \"adyen\"\nsecrets = [\"44782DEF547AAA06\"]\n\
             [sources.twilio]\nscheme = \"twilio\"\nsecrets = [\"tw\"]\n\
             public_url = \"https://hooks.example.com/webhooks/twilio\"\n",
        )
        .expect("valid");
        let names: Vec<&str> = s.sources.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["adyen", "github", "linear", "paddle", "shop-1", "slack", "square", "twilio"]
        );
        assert_eq!(
            s.sources["square"].public_url.as_deref(),
            Some("https://hooks.example.com/webhooks/square")
        );
        assert_eq!(s.sources["linear"].tolerance_secs(), 60);
        assert_eq!(s.sources["paddle"].scheme, SchemeKind::Paddle);
        assert_eq!(s.sources["paddle"].tolerance_secs(), 30);
        let github = &s.sources["github"];
        assert_eq!(github.scheme, SchemeKind::Github);
        assert_eq!(github.secrets.len(), 2);
        assert_eq!(github.secrets[1].expose(), "s3cret-two");
        assert_eq!(s.sources["slack"].tolerance_secs(), 300);
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn no_sources_by_default() {
        assert!(load("").expect("valid").sources.is_empty());
    }

    #[test]
    fn each_refusal_names_the_key() {
        for (toml, key, why) in [
            (
                "[sources.github]\nscheme = \"github\"\n",
                "`sources.github.secrets`",
                "no secret",
            ),
            (
                "[sources.github]\nscheme = \"github\"\nsecrets = \" , \"\n",
                "`sources.github.secrets`",
                "no secret",
            ),
            (
                "[sources.github]\nscheme = \"github\"\nsecrets = []\n",
                "`sources.github.secrets`",
                "no secret",
            ),
            (
                "[sources.stripe]\nscheme = \"github\"\nsecrets = \"x\"\n",
                "`sources.stripe`",
                "taken",
            ),
            (
                "[sources.standard]\nscheme = \"slack\"\nsecrets = \"x\"\n",
                "`sources.standard`",
                "taken",
            ),
            (
                "[sources.GitHub]\nscheme = \"github\"\nsecrets = \"x\"\n",
                "`sources.GitHub`",
                "a-z, 0-9",
            ),
            (
                "[sources.\"a/b\"]\nscheme = \"github\"\nsecrets = \"x\"\n",
                "`sources.a/b`",
                "a-z, 0-9",
            ),
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance = \"0s\"\n",
                "`sources.slack.tolerance`",
                "greater than zero",
            ),
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance = \"1h 1s\"\n",
                "`sources.slack.tolerance`",
                "more than 1h",
            ),
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance = \"1500ms\"\n",
                "`sources.slack.tolerance`",
                "whole seconds",
            ),
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance = 30\n",
                "`sources.slack.tolerance`",
                "with its unit",
            ),
            (
                "[sources.github]\nscheme = \"github\"\nsecrets = \"x\"\ntolerance = \"1m\"\n",
                "`sources.github.tolerance`",
                "signs no timestamp",
            ),
            // The old integer key: read as seconds, and a refusal names it as written.
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance_secs = 3601\n",
                "`sources.slack.tolerance_secs`",
                "more than 1h",
            ),
            (
                "[sources.slack]\nscheme = \"slack\"\nsecrets = \"x\"\ntolerance_secs = 30\n\
                 tolerance = \"30s\"\n",
                "`sources.slack.tolerance_secs`",
                "keep only `sources.slack.tolerance`",
            ),
            (
                "[sources.square]\nscheme = \"square\"\nsecrets = \"x\"\n",
                "`sources.square.public_url`",
                "signs the URL",
            ),
            (
                "[sources.github]\nscheme = \"github\"\nsecrets = \"x\"\npublic_url = \"https://h/x\"\n",
                "`sources.github.public_url`",
                "signs no URL",
            ),
            (
                "[sources.square]\nscheme = \"square\"\nsecrets = \"x\"\npublic_url = \"/webhooks/square\"\n",
                "`sources.square.public_url`",
                "absolute http",
            ),
            (
                "[sources.square]\nscheme = \"square\"\nsecrets = \"x\"\npublic_url = \"ftp://h/x\"\n",
                "`sources.square.public_url`",
                "absolute http",
            ),
            (
                "[sources.github]\nscheme = \"gitlab\"\nsecrets = \"x\"\n",
                "`sources.github.scheme`",
                "unknown variant",
            ),
            (
                "[sources.adyen]\nscheme = \"adyen\"\nsecrets = \"not-hex\"\n",
                "`sources.adyen.secrets`",
                "not hex",
            ),
            (
                "[sources.twilio]\nscheme = \"twilio\"\nsecrets = \"x\"\n",
                "`sources.twilio.public_url`",
                "signs the URL",
            ),
            (
                "[sources.github]\nscheme = \"github\"\nsecrets = 12345\n",
                "`sources.github.secrets`",
                "must be quoted",
            ),
        ] {
            let text = refused(toml);
            assert!(text.contains(key) && text.contains(why), "{toml}: {text}");
        }
        let long = "a".repeat(65);
        let text = refused(&format!(
            "[sources.{long}]\nscheme = \"github\"\nsecrets = \"x\"\n"
        ));
        assert!(text.contains("a-z, 0-9"), "{text}");
        assert!(load(&format!(
            "[sources.{}]\nscheme = \"github\"\nsecrets = \"x\"\n",
            "a".repeat(64)
        ))
        .is_ok());
    }

    #[test]
    fn a_name_standard_webhooks_files_its_events_under_is_taken() {
        let text = refused(
            "[standard_webhooks]\nsource = \"github\"\n\
             [sources.github]\nscheme = \"github\"\nsecrets = \"x\"\n",
        );
        assert!(text.contains("`sources.github`"), "{text}");
    }

    #[test]
    fn secrets_are_needed_only_where_the_ingress_verifies() {
        load("[roles]\ningress = false\n[sources.github]\nscheme = \"github\"\n")
            .expect("a consume-only process needs no secret");
        load("[roles]\ningress = false\n[sources.square]\nscheme = \"square\"\n")
            .expect("nor a public_url");
    }
}
