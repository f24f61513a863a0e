//! `[outbox]`: the relay's settings, its sinks (`[outbox.sinks.NAME]`, each delivered in a lane of
//! its own), the circuit breaker's defaults (`[outbox.breaker]`) and the routes
//! (`[[outbox.routes]]`) that send forwarded events to sinks by rule. Checked in
//! `outbox_checks.rs`; the relay turns them into lanes (`outbox/relay/`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::durations;
use super::secrets::{self, Secret};
use super::SinkSpec;
use crate::signature::secrets::SigningSecret;

/// The lane of `outbox.sink`: rows no handler or route sent elsewhere.
pub const DEFAULT_LANE: &str = "default";

/// A lane as logs, metrics and the console name it: its name when it is a sink's name
/// (`default`, `[outbox.sinks.NAME]`: `a-z0-9_-`), else (an ad-hoc destination's spec, which may
/// carry a token in its path or query) `~` and 8 hex digits of the spec's SHA-256.
pub fn lane_label(lane: &str) -> String {
    let is_name = (1..=64).contains(&lane.len())
        && lane
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if is_name {
        return lane.to_owned();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(lane.as_bytes());
    format!("~{}", hex::encode(&digest[..4]))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxSettings {
    /// `log`, `file:PATH`, an http(s) URL, `amqp://…?exchange=NAME` or an SQS queue URL; parsed
    /// while loading. The `default` lane's sink.
    pub sink: SinkSpec,
    /// Standard Webhooks secrets, decoded while loading, each signing every HTTP sink delivery:
    /// `whsec_` secrets with a `v1` item, `whsk_` ed25519 keys with a `v1a` item; empty:
    /// deliveries are not signed. A named sink may have its own.
    #[serde(deserialize_with = "secrets::comma_separated_signing")]
    pub signing_secret: Vec<SigningSecret>,
    pub batch_size: usize,
    pub concurrency: usize,
    #[serde(deserialize_with = "durations::read")]
    pub poll_interval: Duration,
    /// How long a claimed row stays leased; the relay extends it every third of it while it
    /// delivers the row.
    #[serde(deserialize_with = "durations::read")]
    pub lease: Duration,
    pub max_attempts: u32,
    #[serde(deserialize_with = "durations::read")]
    pub retry_base: Duration,
    #[serde(deserialize_with = "durations::read")]
    pub retry_max: Duration,
    #[serde(deserialize_with = "durations::read")]
    pub http_timeout: Duration,
    pub retention_hours: u64,
    /// The longest a receiver's `Retry-After` holds its lane; a longer one is cut to this (and
    /// logged), so a receiver cannot stop its deliveries for days by asking.
    #[serde(deserialize_with = "durations::read")]
    pub max_retry_after: Duration,
    /// How many bytes of an HTTP receiver's answer body are kept with each delivery attempt
    /// (`outbox_attempts`), for every answer, 2xx included; 0: none. At most 65,536 (the most the
    /// HTTP sink reads of an answer anyway, to reuse its connection).
    pub response_excerpt_bytes: usize,
    /// Deliveries a second every relay process together sends in the `default` lane at most
    /// (fractional allowed); absent: as fast as `concurrency` allows. A named sink has its own.
    #[serde(default)]
    pub rate_per_sec: Option<f64>,
    /// Deliveries that may go at once after a quiet spell; default: the rate rounded up.
    #[serde(default)]
    pub burst: Option<u32>,
    /// When every lane's circuit opens, unless its sink says otherwise.
    pub breaker: BreakerSettings,
    /// Named sinks, each delivered in a lane of its own; a handler names one with
    /// `OutboxMessage::to("NAME")`, a route with `sinks = ["NAME"]`.
    #[serde(default)]
    pub sinks: BTreeMap<String, SinkSettings>,
    /// Where forwarded events go by rule; none: all to the `default` lane.
    #[serde(default)]
    pub routes: Vec<RouteSettings>,
    /// What happens to a forwarded event no route matches (only when there are routes).
    pub unrouted: Unrouted,
}

/// `[outbox.breaker]`: a lane's circuit opens after a run of `failures` consecutive failed
/// deliveries, or when at least `min_requests` of its last `window` deliveries were seen and
/// `failure_ratio` of them failed. While open nothing is sent and rows wait without spending
/// attempts; a single probe goes after `probe_after`, then at doubling intervals up to
/// `probe_max`; the first delivered probe closes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// 0: this trigger is off.
    pub failures: u32,
    pub failure_ratio: f64,
    /// 0: the ratio trigger is off.
    pub window: u32,
    pub min_requests: u32,
    #[serde(deserialize_with = "durations::read")]
    pub probe_after: Duration,
    #[serde(deserialize_with = "durations::read")]
    pub probe_max: Duration,
}

/// `[outbox.sinks.NAME.breaker]`: each key given replaces `[outbox.breaker]`'s.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerOverrides {
    pub failures: Option<u32>,
    pub failure_ratio: Option<f64>,
    pub window: Option<u32>,
    pub min_requests: Option<u32>,
    #[serde(default, deserialize_with = "durations::read_optional")]
    pub probe_after: Option<Duration>,
    #[serde(default, deserialize_with = "durations::read_optional")]
    pub probe_max: Option<Duration>,
}

impl BreakerSettings {
    /// These settings with `overrides` applied.
    pub fn with(&self, overrides: &BreakerOverrides) -> BreakerSettings {
        BreakerSettings {
            failures: overrides.failures.unwrap_or(self.failures),
            failure_ratio: overrides.failure_ratio.unwrap_or(self.failure_ratio),
            window: overrides.window.unwrap_or(self.window),
            min_requests: overrides.min_requests.unwrap_or(self.min_requests),
            probe_after: overrides.probe_after.unwrap_or(self.probe_after),
            probe_max: overrides.probe_max.unwrap_or(self.probe_max),
        }
    }
}

/// `[outbox.sinks.NAME]`: one named sink. Absent keys take `[outbox]`'s value.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSettings {
    /// Where it delivers, in `outbox.sink`'s syntax.
    pub url: SinkSpec,
    /// Deliveries in flight at once in this lane (HTTP, SQS).
    pub concurrency: Option<usize>,
    /// Rows claimed per batch in this lane.
    pub batch_size: Option<usize>,
    pub max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "durations::read_optional")]
    pub http_timeout: Option<Duration>,
    /// Deliveries a second every relay process together sends to the sink at most (fractional
    /// allowed; the bucket is kept in the store, `relay/rate.rs`);
    /// absent: as fast as `concurrency` allows.
    pub rate_per_sec: Option<f64>,
    /// Deliveries that may go at once after a quiet spell; default: the rate rounded up.
    pub burst: Option<u32>,
    /// This sink's own Standard Webhooks secrets (see `outbox.signing_secret`).
    #[serde(default, deserialize_with = "optional_signing")]
    pub signing_secret: Option<Vec<SigningSecret>>,
    #[serde(default)]
    pub breaker: BreakerOverrides,
    /// Rows of one ordering key reach the sink in the order they were committed: a later row
    /// waits while an earlier one is pending, retrying or failed and not skipped (see
    /// docs/src/sinks/lanes.md, "Ordering by key").
    #[serde(default)]
    pub ordered: bool,
    /// Where in a row's payload its ordering key is (a JSON pointer; a string or number there is
    /// the key, anything else leaves the row unordered); only with `ordered`. Default
    /// [`DEFAULT_ORDERING_KEY`], the object a Stripe event is about.
    pub ordering_key: Option<String>,
    /// Mutual TLS and the receiver's own CA (HTTP sinks only).
    pub tls: Option<SinkTlsSettings>,
    /// An OAuth 2.0 bearer token on every delivery (HTTP sinks only).
    pub oauth: Option<SinkOAuthSettings>,
}

/// `[outbox.sinks.NAME.tls]`: PEM files, read and parsed at start-up (an unreadable or
/// unparsable one refuses the start, naming its key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkTlsSettings {
    /// The certificate (chain, leaf first) this relay presents to the receiver.
    pub client_cert: Option<PathBuf>,
    /// The private key of `client_cert` (PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
    /// The CA certificates the receiver's certificate must chain to; they replace the built-in
    /// roots for this sink alone (a private CA). Absent: the built-in roots.
    pub ca: Option<PathBuf>,
}

/// `[outbox.sinks.NAME.oauth]`: the OAuth 2.0 client credentials grant (RFC 6749 §4.4). The
/// token is fetched before the first delivery, kept until 80 % of its life, and fetched again
/// when the receiver answers 401 to it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkOAuthSettings {
    /// The authorization server's token endpoint (http or https). Optional only so that its
    /// absence is refused naming the key (see `outbox_checks.rs`), like the two below.
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    /// Never logged; `Debug` shows `***`.
    pub client_secret: Option<Secret>,
    /// Sent as `scope` when given (space-separated scopes).
    pub scope: Option<String>,
    /// Sent as `audience` when given (Auth0's and others' extension naming the receiver's API).
    pub audience: Option<String>,
    /// How the client authenticates to the token endpoint.
    #[serde(default)]
    pub auth_method: OAuthAuthMethod,
}

/// `outbox.sinks.NAME.oauth.auth_method` (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OAuthAuthMethod {
    /// `client_secret_basic`: HTTP Basic with the form-encoded id and secret (the default every
    /// server must support).
    #[default]
    Basic,
    /// `client_secret_post`: `client_id` and `client_secret` in the form body.
    Post,
}

/// A lane's pace from its `rate_per_sec` and `burst`: (deliveries a second, burst), the burst
/// defaulting to the rate rounded up; `None` without a rate.
pub fn lane_rate(rate_per_sec: Option<f64>, burst: Option<u32>) -> Option<(f64, u32)> {
    let rate = rate_per_sec?;
    Some((rate, burst.unwrap_or(rate.ceil().max(1.0) as u32)))
}

/// The ordering key of an ordered sink that names none: the id of the object a Stripe-shaped
/// event is about, so one customer's or invoice's events keep their order.
pub const DEFAULT_ORDERING_KEY: &str = "/data/object/id";

impl SinkSettings {
    /// The JSON pointer to the ordering key, if this sink is ordered.
    pub fn ordering_pointer(&self) -> Option<&str> {
        self.ordered
            .then(|| self.ordering_key.as_deref().unwrap_or(DEFAULT_ORDERING_KEY))
    }
}

/// `[[outbox.routes]]`: forwarded events matching every condition given go to `sinks`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    /// Shown in logs.
    pub name: Option<String>,
    /// The sources (`stripe`, `standard`, a `[sources.NAME]`) it applies to; empty: any.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Exact event types, or prefixes ending in `*` (`invoice.*`); empty: any.
    #[serde(default)]
    pub types: Vec<String>,
    /// JSON pointer → the value the event's payload must hold there (JSON equality).
    #[serde(default, rename = "where")]
    pub matches: BTreeMap<String, serde_json::Value>,
    /// The sink names it sends to: `default` or a `[outbox.sinks.NAME]`.
    pub sinks: Vec<String>,
}

/// `outbox.unrouted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unrouted {
    /// To the `default` lane, as with no routes.
    Default,
    /// Not delivered (counted in `dedup_outbox_unrouted_total`).
    Drop,
}

fn optional_signing<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<SigningSecret>>, D::Error> {
    secrets::comma_separated_signing(d).map(Some)
}
