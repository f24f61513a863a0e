//! `POST /webhooks/{name}`: the named senders of `[sources.NAME]`, each verified by its scheme.
//!
//! A scheme is one file here (github.rs, linear.rs, paddle.rs, shopify.rs,
//! slack.rs, square.rs, zoom.rs) implementing `Scheme`: check
//! the raw body and headers against the source's secrets in constant time, then say what the
//! delivery is (its dedup id and type, or a handshake to answer). Everything else is the same
//! for every sender and lives here or in `super::deliver`: the source's name is the source half
//! of the dedup key and the `source` label of the metrics, a forgery is a 400 problem with
//! nothing enqueued, and a 2xx is answered only once the event is durable.
//!
//! Adding a scheme: a variant of [`SchemeKind`], its file here, and its arm in `scheme`. A
//! sender whose rules fit the declarative scheme (`hmac.rs`) needs only a preset, which is data
//! (`crate::config`'s `hmac_presets.toml`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::hmac::{Hmac, Mac};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use sha2::Sha256;
use tracing::Instrument;

use crate::config::{resolve_hmac, ConfigError, SchemeKind, SourceSettings};
use crate::event::EventField;
use crate::http::problem::Problem;
use crate::queue::{OutgoingMessage, Transport};
use crate::webhook::deliver::{
    answer, checked, header_text, invalid_signature, publish, read_body, receive_span,
    record_event, Accepted, Clock,
};

mod github;
mod hmac;
mod linear;
mod paddle;
mod shopify;
mod slack;
mod square;
mod zoom;

/// The route's path template: the `route` label of the request histogram for every source.
const ROUTE: &str = "/webhooks/{name}";

/// One configured sender, ready to verify its deliveries.
pub struct Source {
    /// The configured name: the route's `{name}`, the dedup key's source half, the metrics label.
    pub name: String,
    /// Which sender's rules apply.
    pub kind: SchemeKind,
    /// The rules, ready to check a delivery.
    scheme: Box<dyn Scheme>,
    /// The signing keys, each tried (rotation): the secrets' bytes, or what the `hmac` rules
    /// decode them to. Never logged: `Source` has no `Debug`.
    secrets: Vec<Vec<u8>>,
    /// Accepted clock difference, both ways, for schemes that sign a timestamp.
    tolerance_secs: u64,
    /// The URL the sender posts to, for schemes that sign it (Square).
    public_url: Option<String>,
}

/// Every configured source by name; shared by the route's clones.
pub type Sources = Arc<BTreeMap<String, Source>>;

/// The sources of `settings` (`Settings::sources`, validated), ready to serve. A source whose
/// rules do not resolve (validation refuses it at start, so only a caller that skipped it) is
/// left out, logged: its route answers 404, and the sender retries.
pub fn from_settings(settings: &BTreeMap<String, SourceSettings>) -> Sources {
    Arc::new(
        settings
            .iter()
            .filter_map(|(name, source)| match ready(name, source) {
                Ok(ready) => Some((name.clone(), ready)),
                Err(error) => {
                    tracing::error!(source = %name, %error, "source left out");
                    None
                }
            })
            .collect(),
    )
}

/// One source, its rules built and its secrets turned into keys.
fn ready(name: &str, source: &SourceSettings) -> Result<Source, ConfigError> {
    let (scheme, secrets): (Box<dyn Scheme>, Vec<Vec<u8>>) = match source.scheme {
        SchemeKind::Hmac => {
            let rules = resolve_hmac(name, source)?;
            let keys = source
                .secrets
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    rules.key_of(s.expose()).map_err(|why| {
                        ConfigError::invalid_at(
                            format!("sources.{name}.secrets"),
                            format!("secret number {} {why}", i + 1),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            (Box::new(hmac::Declarative::new(rules)), keys)
        }
        kind => (
            named(kind),
            source
                .secrets
                .iter()
                .map(|s| s.expose().as_bytes().to_vec())
                .collect(),
        ),
    };
    Ok(Source {
        name: name.to_owned(),
        kind: source.scheme,
        scheme,
        secrets,
        tolerance_secs: source.tolerance_secs(),
        public_url: source.public_url.clone(),
    })
}

/// A delivery as received: what every scheme reads.
pub(super) struct Delivery<'a> {
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The raw body, byte for byte as signed.
    pub body: &'a [u8],
}

/// The source's keys and clock, for [`Scheme::verify`].
pub(super) struct Keys<'a> {
    /// Each tried in turn; one that verifies is enough.
    pub secrets: &'a [Vec<u8>],
    /// Accepted clock difference, both ways (schemes that sign a timestamp).
    pub tolerance_secs: u64,
    /// Now, in Unix seconds (the ingress's injectable clock).
    pub now: i64,
    /// The URL the sender was given, as configured (`public_url`), for schemes that sign it.
    pub public_url: Option<&'a str>,
}

/// What a verified delivery is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Identified {
    /// An event, to be deduplicated on `id`.
    Event {
        /// The sender's id for the event, the same on every retry: the dedup key's id half.
        id: String,
        /// The sender's name for what happened, if it says.
        event_type: Option<String>,
    },
    /// A handshake the sender expects answered with this JSON body; nothing is enqueued.
    Challenge(serde_json::Value),
}

/// One sender's rules.
pub(super) trait Scheme: Send + Sync {
    /// Whether one of `keys.secrets` signed this delivery (compared in constant time), and, for
    /// a scheme that signs a timestamp, whether it is within the tolerance. A 400 problem
    /// naming the failed check otherwise.
    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem>;

    /// What the delivery is; called only once it verified, so a forger learns nothing of the
    /// rules on ids.
    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem>;

    /// [`Scheme::identify`] given the keys, for a scheme whose handshake answer is keyed (Zoom's
    /// `encryptedToken`); called only once the delivery verified under `keys`.
    fn identify_keyed(
        &self,
        delivery: &Delivery<'_>,
        _keys: &Keys<'_>,
    ) -> Result<Identified, Problem> {
        self.identify(delivery)
    }
}

/// The rules of a named scheme (`hmac`'s are the source's: see `ready`).
fn named(kind: SchemeKind) -> Box<dyn Scheme> {
    match kind {
        SchemeKind::Github => Box::new(github::Github),
        SchemeKind::Linear => Box::new(linear::Linear),
        SchemeKind::Paddle => Box::new(paddle::Paddle),
        SchemeKind::Shopify => Box::new(shopify::Shopify),
        SchemeKind::Slack => Box::new(slack::Slack),
        SchemeKind::Square => Box::new(square::Square),
        SchemeKind::Zoom => Box::new(zoom::Zoom),
        // Built from the source's settings in `ready`; never reached.
        SchemeKind::Hmac => Box::new(Unresolved),
    }
}

/// An `hmac` source without its rules: refuses every delivery (never reached: `ready` builds
/// the rules of an `hmac` source).
struct Unresolved;

impl Scheme for Unresolved {
    fn verify(&self, _: &Delivery<'_>, _: &Keys<'_>) -> Result<(), Problem> {
        Err(mismatch("signature"))
    }

    fn identify(&self, _: &Delivery<'_>) -> Result<Identified, Problem> {
        Err(missing_id("rules"))
    }
}

/// What the `/webhooks/{name}` route needs.
#[derive(Clone)]
pub struct SourcesState {
    /// Where verified events are published.
    pub transport: Arc<dyn Transport>,
    /// The configured sources.
    pub sources: Sources,
    /// The longest a publish may wait on the transport before the sender is told to retry.
    pub publish_timeout: Duration,
    /// Now, for the schemes that sign a timestamp.
    pub clock: Clock,
}

/// `POST /webhooks/{name}`, or no route at all when no source is configured.
pub fn router(state: SourcesState, body_limit: usize) -> Router {
    if state.sources.is_empty() {
        return Router::new();
    }
    Router::new()
        .route(
            ROUTE,
            post(receive).layer(DefaultBodyLimit::max(body_limit)),
        )
        .with_state(state)
}

async fn receive(
    State(state): State<SourcesState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // An unknown name is not counted: the metrics' `source` label takes configured names only.
    let Some(source) = state.sources.get(&name) else {
        return Problem::new(
            StatusCode::NOT_FOUND,
            "urn:dedup-worker:problem:not-configured",
            "Not configured",
            "no source of this name is configured",
        )
        .into_response();
    };
    let span = receive_span(&source.name, &headers);
    let started = Instant::now();
    let outcome = receive_from(&state, source, &headers, body)
        .instrument(span)
        .await;
    answer(&source.name, ROUTE, started, outcome)
}

/// Verify, identify, publish durably: the event's id once it is, or the challenge.
async fn receive_from(
    state: &SourcesState,
    source: &Source,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Accepted, Problem> {
    let body = read_body(body)?;
    let delivery = Delivery {
        headers,
        body: &body,
    };
    let scheme = source.scheme.as_ref();
    let keys = Keys {
        secrets: &source.secrets,
        tolerance_secs: source.tolerance_secs,
        now: (state.clock)(),
        public_url: source.public_url.as_deref(),
    };
    scheme.verify(&delivery, &keys)?;
    let (id, event_type) = match scheme.identify_keyed(&delivery, &keys)? {
        Identified::Challenge(challenge) => return Ok(Accepted::Challenge(challenge)),
        Identified::Event { id, event_type } => (id, event_type),
    };
    checked(EventField::Id, &id, "event_id")?;
    if let Some(event_type) = &event_type {
        checked(EventField::Type, event_type, "event_type")?;
    }
    record_event(&id, event_type.as_deref());
    let message = OutgoingMessage {
        source: Some(source.name.clone()),
        message_id: Some(id.clone()),
        message_type: event_type,
        payload: body,
        traceparent: None,
        stripe_signature: None,
    };
    publish(state.transport.as_ref(), state.publish_timeout, message).await?;
    Ok(Accepted::Received(id))
}

/// A header every delivery of the scheme carries; its absence is the `missing_header` check.
pub(super) fn required<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, Problem> {
    header_text(headers, name)?
        .ok_or_else(|| invalid_signature(format!("the {name} header is missing"), "missing_header"))
}

/// Whether one of `secrets` gives `signature` as the HMAC-SHA256 of `parts` (concatenated),
/// compared in constant time (`verify_slice`); every secret is tried, each with one pass over
/// the body.
pub(super) fn hmac_sha256_matches(secrets: &[Vec<u8>], parts: &[&[u8]], signature: &[u8]) -> bool {
    hmac_sha256_matches_any(secrets, parts, &[signature])
}

/// Whether one of `secrets` gives one of `signatures` (a header carrying several, as Paddle's
/// during a rotation) as the HMAC-SHA256 of `parts`: one pass over the body per secret, each
/// signature compared in constant time.
pub(super) fn hmac_sha256_matches_any(
    secrets: &[Vec<u8>],
    parts: &[&[u8]],
    signatures: &[&[u8]],
) -> bool {
    secrets.iter().any(|secret| {
        // HMAC takes keys of any length; new_from_slice cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
            return false;
        };
        for part in parts {
            mac.update(part);
        }
        signatures
            .iter()
            .any(|signature| mac.clone().verify_slice(signature).is_ok())
    })
}

/// Whether `at` (Unix seconds, as signed) is within `keys.tolerance_secs` of now, either way;
/// the `timestamp_tolerance` 400 otherwise.
pub(super) fn within_tolerance(at: i64, keys: &Keys<'_>) -> Result<(), Problem> {
    let skew = keys.now.saturating_sub(at);
    if skew.unsigned_abs() > keys.tolerance_secs {
        return Err(invalid_signature(
            format!(
                "timestamp outside the tolerance zone: {} s in the {} (tolerance {} s)",
                skew.unsigned_abs(),
                if skew >= 0 { "past" } else { "future" },
                keys.tolerance_secs
            ),
            "timestamp_tolerance",
        ));
    }
    Ok(())
}

/// The 400 for a signature no secret made.
pub(super) fn mismatch(header: &str) -> Problem {
    invalid_signature(
        format!(
            "the {header} header matches no signature of the payload under the source's secrets"
        ),
        "signature_mismatch",
    )
}

/// The 400 for a signature header that is not in the scheme's form.
pub(super) fn malformed(header: &str, form: &str) -> Problem {
    invalid_signature(
        format!("the {header} header is not of the form {form}"),
        "malformed_header",
    )
}

/// The 400 for a verified delivery without the id it is deduplicated on.
pub(super) fn missing_id(where_: &str) -> Problem {
    crate::webhook::deliver::invalid_payload(
        format!("the delivery has no {where_}, which its events are deduplicated on"),
        "missing_id",
    )
}
