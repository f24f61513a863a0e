//! Configuration: one typed [`Settings`] struct, loaded in layers and validated before anything
//! binds or connects.
//!
//! Layers, later wins (`layers.rs`): the embedded `config/default.toml` (which documents every
//! key), the file given with `--config`, then the environment. The environment has the fixed
//! names of the design (`DATABASE_URL`, `DEDUP_LISTEN`, …) plus `DEDUP_<SECTION>__<KEY>` for any
//! other key. Durations are written with their unit (`"500ms"`, `"10s"`, `durations.rs`). Every
//! error names the key it is about, as the user wrote it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use figment::Figment;
use serde::Deserialize;

use crate::signature::ed25519::StandardPublicKey;
use crate::signature::secrets::StandardSecret;
use crate::telemetry::LogFormat;

mod admin;
mod bounds;
mod durations;
mod hmac;
mod hmac_presets;
mod hmac_settings;
mod hmac_template;
mod layers;
mod outbox;
mod outbox_checks;
mod paypal;
mod retention;
mod secrets;
mod sink;
mod sink_tls;
mod source_checks;
mod sources;
mod validate;

pub use admin::{AdminSettings, MIN_ADMIN_TOKEN_CHARS};
pub use bounds::{whole_days, whole_hours};
pub use hmac::{
    resolve as resolve_hmac, Algorithm as HmacAlgorithm, Encoding as HmacEncoding, HmacRules,
    HmacSettings, Locator, Piece, TimestampAt, TimestampFormat, MAX_SIGNATURES_PER_HEADER,
};
pub use hmac_presets::{presets as hmac_presets, Preset as HmacPreset};
pub use layers::defaults;
pub use outbox::{
    lane_label, lane_rate, BreakerOverrides, BreakerSettings, OAuthAuthMethod, OutboxSettings,
    RouteSettings, SinkOAuthSettings, SinkSettings, SinkTlsSettings, Unrouted, DEFAULT_LANE,
    DEFAULT_ORDERING_KEY,
};
pub use outbox_checks::{check_pointer, check_type_pattern, MAX_SINK_NAME_CHARS};
pub use paypal::{
    certificate_url_prefix, is_paypal_signing_certificate, PAYPAL_CERTIFICATE_URL_PREFIXES,
};
pub use retention::{RetentionSettings, SearchSettings, MAX_RETENTION_DAYS};
pub use secrets::{
    redact_url, stripe_key_material, token_like, ConnectionUrl, Secret, STRIPE_SECRET_WARN_CHARS,
};
pub use sink::{shown_destination, shown_url, InvalidSinkSpec, SinkSpec};
pub use sink_tls::{read_sink_tls, SinkTls};
pub use sources::{
    SchemeKind, SourceSettings, Sources, DEFAULT_TOLERANCE_SECS, MAX_SOURCE_NAME_CHARS,
    RESERVED_SOURCE_NAMES,
};

/// The defaults, compiled in so the binary runs from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../../../config/default.toml");

/// Shortest dedup window accepted without `consumer.allow_short_dedup_retention`: Stripe retries
/// a webhook for up to 3 days, plus a day of margin (a retry scheduled just inside the window,
/// then delayed by an outage or a backlog). A retry arriving after its processed id was purged is
/// handled a second time: a second charge.
pub const MIN_DEDUP_RETENTION_DAYS: u64 = 4;

/// Shortest accepted `consumer.lease` and `outbox.lease`, in seconds: heartbeats extend a lease
/// every third of it, so this leaves them about 0.7 s each.
pub const MIN_LEASE_SECS: u64 = 2;

/// Why the configuration was refused. The message always names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Values could not be read or have the wrong type.
    #[error("{}", describe_load_error(.0))]
    Load(Box<figment::Error>),
    /// A value was read but is not acceptable.
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// As `Invalid`, for a key whose path is only known at run time (`sources.NAME.secrets`).
    #[error("configuration key `{key}`: {reason}")]
    InvalidAt { key: String, reason: String },
}

impl ConfigError {
    /// An [`ConfigError::InvalidAt`]: a refused value under a key built from the configuration.
    pub fn invalid_at(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::InvalidAt {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The dotted key a refused value is about; `None` for a load error (its text names them).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Load(_) => None,
            ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::InvalidAt { key, .. } => Some(key),
        }
    }
}

/// One line per problem: the dotted key as written in the TOML file, what is wrong, and where
/// the value came from. (figment's own text upper-cases keys read from the environment.)
fn describe_load_error(error: &figment::Error) -> String {
    error
        .clone()
        .into_iter()
        .map(|e| {
            let key = if e.path.is_empty() {
                "(root)".to_owned()
            } else {
                e.path.join(".")
            };
            let from = e
                .metadata
                .as_ref()
                .map(|m| format!(" (from {})", m.name))
                .unwrap_or_default();
            format!("configuration key `{key}`: {}{from}", e.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<Box<figment::Error>> for ConfigError {
    fn from(e: Box<figment::Error>) -> Self {
        ConfigError::Load(e)
    }
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Everything the process needs to know, validated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `postgres://…` or `sqlite://PATH`: the store of processed ids, outbox, dead letters and
    /// the database queue.
    pub database_url: ConnectionUrl,
    pub database: DatabaseSettings,
    pub roles: RoleSettings,
    pub http: HttpSettings,
    pub stripe: StripeSettings,
    pub standard_webhooks: StandardWebhookSettings,
    pub transport: TransportSettings,
    pub consumer: ConsumerSettings,
    pub outbox: OutboxSettings,
    pub shutdown: ShutdownSettings,
    pub log: LogSettings,
    /// The operator console (off unless `admin.listen` is set).
    pub admin: AdminSettings,
    /// How long bodies and the history are kept (`retention.rs`).
    pub retention: RetentionSettings,
    /// Where the searched fields are in a body (`retention.rs`).
    pub search: SearchSettings,
    /// Named senders (`[sources.NAME]`), each served at `POST /webhooks/NAME`; none by default.
    #[serde(default)]
    pub sources: Sources,
}

/// `[log]`: how the process logs (read before the rest, by [`Settings::log_settings`]).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// Text, JSON lines, or by whether stderr is a terminal.
    pub format: LogFormat,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Pool size; bounds the connections this process holds.
    pub max_connections: u32,
    /// Wait for a pooled connection before failing (ingress then answers 503).
    #[serde(deserialize_with = "durations::read")]
    pub acquire_timeout: Duration,
    /// PostgreSQL's `statement_timeout` on the service's connections, and the longest the
    /// database queue, the relay and retention wait for any one store call: a database that
    /// stops answering (a partition, a hung host) holds none of them longer.
    #[serde(deserialize_with = "durations::read")]
    pub statement_timeout: Duration,
    /// Whether starting a role applies pending migrations first.
    pub migrate_on_start: bool,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSettings {
    /// Run the HTTP ingress (the health and metrics endpoints always run with it).
    pub ingress: bool,
    /// Run the deduplicating consumer.
    pub consumer: bool,
    /// Run the outbox relay.
    pub relay: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Listen address; port 0 picks a free one (the chosen address is printed on start).
    pub listen: SocketAddr,
    /// Largest accepted body; larger ones get 413 before any verification work.
    pub body_limit_bytes: usize,
    /// The request line and headers must arrive within this (a kept-alive connection's next
    /// request too), or the connection is closed.
    #[serde(deserialize_with = "durations::read")]
    pub header_read_timeout: Duration,
    /// Largest request line plus headers; larger ones get 431.
    pub max_header_bytes: usize,
    /// The longest pause while a body arrives (between two reads, as nginx's
    /// `client_body_timeout`); then 408.
    #[serde(deserialize_with = "durations::read")]
    pub body_read_timeout: Duration,
    /// The whole request, body included, is answered within this; 503 with `Retry-After`
    /// beyond.
    #[serde(deserialize_with = "durations::read")]
    pub request_timeout: Duration,
    /// Requests handled at once; more are answered 503 with `Retry-After` at once.
    pub max_concurrent_requests: usize,
    /// Connections open at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripeSettings {
    /// Signing secrets, each tried (rotation). Kept out of `Debug` output by [`Secret`].
    #[serde(deserialize_with = "secrets::comma_separated_stripe")]
    pub secrets: Vec<Secret>,
    /// Accepted clock difference in both directions.
    #[serde(deserialize_with = "durations::read")]
    pub tolerance: Duration,
    /// Stripe's API (`STRIPE_API_BASE`), listed by `dedup-worker backfill`.
    pub api_base: String,
    /// A key that may read events (`STRIPE_API_KEY`): `backfill` lists them, and the consumer
    /// fetches thin events' full events with it when `fetch_thin_events` is on.
    pub api_key: Secret,
    /// `Stripe-Version` sent with every API call (the v2 API requires one).
    pub api_version: String,
    /// Bounds one API request of the consumer's thin-event fetch (connect, send, read).
    #[serde(deserialize_with = "durations::read")]
    pub api_timeout: Duration,
    /// Whether the consumer replaces a thin event by its full event
    /// (`GET /v2/core/events/{id}`) before the handler runs, so handlers see one shape.
    pub fetch_thin_events: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandardWebhookSettings {
    /// `whsec_<base64>` secrets (`v1` HMAC signatures), decoded while loading, each tried.
    #[serde(deserialize_with = "secrets::comma_separated_standard")]
    pub secrets: Vec<StandardSecret>,
    /// `whpk_<base64>` ed25519 public keys (`v1a` signatures), checked while loading, each
    /// tried; at most [`MAX_PUBLIC_KEYS`](crate::signature::ed25519::MAX_PUBLIC_KEYS). With
    /// neither these nor `secrets`, `/webhooks/standard` is not served.
    #[serde(deserialize_with = "secrets::comma_separated_public_keys")]
    pub public_keys: Vec<StandardPublicKey>,
    /// Accepted clock difference in both directions.
    #[serde(deserialize_with = "durations::read")]
    pub tolerance: Duration,
    /// Source half of the dedup key for these events (the id is `webhook-id`).
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// A queue table in the store (the embedded default).
    Database,
    /// RabbitMQ through lapin.
    Rabbitmq,
    /// Amazon SQS (or an emulator through `AWS_ENDPOINT_URL`).
    Sqs,
}

impl TransportKind {
    /// The name `transport.kind` takes, also the `transport` label of the queue gauges.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Database => "database",
            TransportKind::Rabbitmq => "rabbitmq",
            TransportKind::Sqs => "sqs",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSettings {
    pub kind: TransportKind,
    /// Queue name (database, RabbitMQ) or URL (SQS).
    pub queue: String,
    pub amqp_url: ConnectionUrl,
    /// Most events written by one group commit.
    pub publish_batch_max: usize,
    /// Writer tasks doing group commits in parallel.
    pub publish_writers: usize,
    /// Ingress requests that may wait for a writer before back-pressure.
    pub publish_channel_capacity: usize,
    /// How long ingress waits for the transport to say an event is durable (a group commit, a
    /// publisher confirm, `SendMessage`) before answering 503; also bounds each readiness
    /// check, each database queue commit and each attempt of every SQS call (a call with the
    /// SDK's retries: twice this). A dependency that stops answering holds no request longer
    /// than this, and the sender retries (a commit that landed after all is recognised by its
    /// id).
    #[serde(deserialize_with = "durations::read")]
    pub publish_timeout: Duration,
    /// RabbitMQ: deliveries of one message that may end unsettled before the consumer
    /// dead-letters it (from `x-delivery-count`, whatever the queue was declared with); also the
    /// `x-delivery-limit` backstop of a queue the service creates.
    pub delivery_limit: u32,
    /// SQS long polling: each `ReceiveMessage` waits up to this for a first message (1–20 s,
    /// SQS's range). Each call is billed and throttled, and a short poll (0) of an empty queue
    /// answers at once, so an idle consumer would send a stream of them; SQS still answers a
    /// long poll as soon as a message arrives.
    #[serde(deserialize_with = "durations::read")]
    pub sqs_wait_time: Duration,
    /// SQS FIFO queues: the JSON pointer to the value that is a message's group (SQS keeps a
    /// group in order and holds its later messages while earlier ones are in flight). The
    /// event's object by default, so one object's events stay in order and other objects'
    /// events do not wait behind them.
    pub sqs_message_group_pointer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    /// Forward each new event to the sink through the outbox.
    Forward,
    /// The documented example: record in `event_ledger`, then forward.
    Ledger,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    pub handler: HandlerKind,
    /// Source half of the dedup key.
    pub source: String,
    /// JSON pointer to the event id for messages without a message id.
    pub dedup_key_pointer: String,
    pub batch_size: usize,
    pub workers: usize,
    /// How long a received message stays leased (database queue row, SQS visibility); the
    /// consumer extends it every third of it while it works on the batch.
    #[serde(deserialize_with = "durations::read")]
    pub lease: Duration,
    /// The longest one batch may take, from its transaction's start to its acks: past it the
    /// batch is abandoned (rolled back) and given back to the transport. Also PostgreSQL's
    /// `idle_in_transaction_session_timeout`, so the server ends an abandoned transaction and
    /// frees its locks even when the client cannot reach it.
    #[serde(deserialize_with = "durations::read")]
    pub step_timeout: Duration,
    #[serde(deserialize_with = "durations::read")]
    pub poll_interval: Duration,
    pub max_attempts: u32,
    #[serde(deserialize_with = "durations::read")]
    pub retry_base: Duration,
    #[serde(deserialize_with = "durations::read")]
    pub retry_max: Duration,
    /// Processed ids are kept this long; a duplicate arriving later is handled again. At least
    /// [`MIN_DEDUP_RETENTION_DAYS`] unless `allow_short_dedup_retention`.
    pub dedup_retention_days: u64,
    /// Accepts a dedup window below [`MIN_DEDUP_RETENTION_DAYS`], for sources known
    /// never to redeliver that late. Off by default: the floor protects Stripe events.
    pub allow_short_dedup_retention: bool,
    /// The dedup window; when set it replaces `dedup_retention_days` (see
    /// [`ConsumerSettings::dedup_window`]). Below the same minimum only with
    /// `allow_short_dedup_retention`.
    #[serde(default, deserialize_with = "durations::read_optional")]
    pub dedup_window: Option<Duration>,
    #[serde(deserialize_with = "durations::read")]
    pub retention_interval: Duration,
    pub retention_batch: i64,
    /// Larger messages are dead-lettered without being parsed.
    pub max_message_bytes: usize,
    /// What wraps the events in the queue's messages: nothing, or EventBridge envelopes.
    pub envelope: EnvelopeKind,
    pub stale_guard: StaleGuardSettings,
}

/// `consumer.envelope`: what the queue's messages wrap their event in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvelopeKind {
    /// The message is the event (our ingress, most producers).
    None,
    /// Amazon EventBridge → SQS: the body is an EventBridge envelope whose `detail` is a Stripe
    /// event; the consumer unwraps it and keys it as a Stripe event (source `stripe`).
    Eventbridge,
}

/// `[consumer.stale_guard]`: hold back events older than what was handled for their object.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleGuardSettings {
    /// Off by default: an existing deployment's events do not change silently.
    pub enabled: bool,
    /// Event type patterns it applies to (`*` for any run of characters).
    pub types: Vec<String>,
    /// JSON pointer to the object's id.
    pub object_pointer: String,
    /// JSON pointer to the version, an integer (Stripe: the event's `created`).
    pub version_pointer: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    /// Time given to in-flight work after a stop signal.
    #[serde(deserialize_with = "durations::read")]
    pub grace: Duration,
}

impl Settings {
    /// Loads defaults, then `file`, then the process environment, and validates.
    pub fn load(file: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        Self::from_figment(Self::figment(file))
    }

    /// Extracts and validates; warns once of each deprecated key read.
    pub fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let (figment, old_keys) = durations::adopt_old_keys(figment)?;
        old_keys.warn();
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings
            .validate()
            .map_err(|error| old_keys.as_written(error))?;
        settings.warn_about_weak_values();
        Ok(settings)
    }

    pub fn is_sqlite(&self) -> bool {
        self.database_url.starts_with("sqlite:")
    }

    /// The SQLite file path of a `sqlite://PATH` URL, to create its directory.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        let rest = self.database_url.strip_prefix("sqlite:")?;
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or(rest);
        (!path.is_empty() && path != ":memory:").then(|| PathBuf::from(path))
    }

    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown.grace
    }
}

#[cfg(test)]
mod tests;
