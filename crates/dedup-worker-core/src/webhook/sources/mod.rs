//! `POST /webhooks/{name}`: the named senders of `[sources.NAME]`, each verified by its scheme.
//!
//! A scheme is one file here (adyen.rs, github.rs, linear.rs, paddle.rs, paypal.rs, shopify.rs,
//! slack.rs, square.rs, twilio.rs, zoom.rs) implementing `Scheme`: check
//! the raw body and headers against the source's secrets in constant time, then say what the
//! delivery is (its dedup id and type, the several events of a batch, or a handshake to
//! answer). A scheme whose key is a certificate the delivery names (PayPal) says which, and the
//! route resolves it (`paypal_certificates.rs`: configured, cached or fetched, async) before the
//! sync checks. The sender's own delivery headers a handler may want (`Scheme::kept_headers`)
//! travel with each message (`kept.rs`). Everything else is the same
//! for every sender and lives here or in `super::deliver`: the source's name is the source half
//! of the dedup key and the `source` label of the metrics, a forgery is a 400 problem with
//! nothing enqueued, and a 2xx is answered only once the event (every event of a batch) is
//! durable.
//!
//! Adding a scheme: a variant of [`SchemeKind`], its file here, and its arm in `scheme`. A
//! sender whose rules fit the declarative scheme (`hmac.rs`) needs only a preset, which is data
//! (`crate::config`'s `hmac_presets.toml`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use tracing::Instrument;

use crate::config::{resolve_hmac, ConfigError, SchemeKind, SourceSettings};
use crate::event::{EventField, SenderHeaders};
use crate::http::problem::Problem;
use crate::queue::{OutgoingMessage, Transport};
use crate::signature::certificate::RsaCertificate;
use crate::webhook::deliver::{
    answer, checked, invalid_payload, publish, read_body, receive_span, record_event, Accepted,
    Clock,
};

mod adyen;
mod checks;
mod github;
mod hmac;
mod id_field;
mod json_items;
mod kept;
mod linear;
mod paddle;
mod paypal;
mod paypal_certificates;
mod shopify;
mod slack;
mod square;
mod twilio;
mod zoom;

use checks::{
    hmac_sha256_matches, hmac_sha256_matches_any, malformed, mismatch, missing_id, required,
    within_tolerance,
};

#[cfg(test)]
mod tests;

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
    /// The signing keys, each tried (rotation): the secrets as the scheme keys its HMAC with them
    /// ([`SchemeKind::key_of`]), or what the `hmac` rules decode them to. Never logged: `Source`
    /// has no `Debug`.
    secrets: Vec<Vec<u8>>,
    /// Accepted clock difference, both ways, for schemes that sign a timestamp.
    tolerance_secs: u64,
    /// The URL the sender posts to, for schemes that sign it (Square, Twilio).
    public_url: Option<String>,
    /// The receiver's id the sender signs into each delivery (PayPal's webhook id).
    webhook_id: Option<String>,
    /// Where the certificate a delivery is verified with comes from (PayPal).
    certificates: Option<paypal_certificates::Certificates>,
    /// Where the dedup id is read instead of where the scheme reads it (`id_field`).
    id_field: Option<String>,
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
    let (scheme, secrets): (Box<dyn Scheme>, Vec<Vec<u8>>) = match named(source.scheme) {
        // Validated at load (`check_source`); a secret that could still not be a key is left
        // out rather than turned into one that verifies nothing it should.
        Some(scheme) => (
            scheme,
            source
                .secrets
                .iter()
                .filter_map(|s| source.scheme.key_of(s.expose()).ok())
                .collect(),
        ),
        None => {
            let rules = resolve_hmac(name, source.preset.as_deref(), source.hmac.as_ref())?;
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
    };
    Ok(Source {
        name: name.to_owned(),
        kind: source.scheme,
        scheme,
        secrets,
        tolerance_secs: source.tolerance_secs(),
        public_url: source.public_url.clone(),
        webhook_id: source.webhook_id.clone(),
        certificates: (source.scheme == SchemeKind::Paypal)
            .then(|| paypal_certificates::Certificates::from_settings(source)),
        id_field: source.id_field.clone(),
    })
}

/// A delivery as received: what every scheme reads.
pub(super) struct Delivery<'a> {
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The raw body, byte for byte as signed.
    pub body: &'a [u8],
    /// The request's query string as sent (without the `?`), for schemes that sign it
    /// (Twilio): `None` when the request had none.
    pub query: Option<&'a str>,
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
    /// The receiver's id as the sender signs it (PayPal's `webhook_id`).
    pub webhook_id: Option<&'a str>,
    /// The certificate the delivery named, resolved before [`Scheme::verify`], for schemes
    /// that sign with one ([`Scheme::certificate_url`]).
    pub certificate: Option<&'a RsaCertificate>,
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
    /// Several events in one delivery (Adyen's notification items, the declarative scheme's
    /// `items_pointer`), each published as its own message; answered once every one is durable.
    Batch {
        /// The events, in the delivery's order; none is refused (`empty_batch`).
        events: Vec<BatchEvent>,
        /// The plain text the sender expects (Adyen's `[accepted]`); `None`: the JSON receipt
        /// of a single event, `{"received": true, "id": …}` with the last event's id.
        answer: Option<&'static str>,
    },
    /// A handshake the sender expects answered with this JSON body; nothing is enqueued.
    Challenge(serde_json::Value),
}

/// One event of a [`Identified::Batch`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BatchEvent {
    /// The event's dedup id, the same on every redelivery of the batch.
    pub id: String,
    /// The sender's name for what happened.
    pub event_type: Option<String>,
    /// The part of the body that is this event: the handler's payload.
    pub payload: Bytes,
}

/// One sender's rules.
pub(super) trait Scheme: Send + Sync {
    /// Whether one of `keys.secrets` signed this delivery (compared in constant time), or, for a
    /// scheme that signs with a certificate, `keys.certificate`; and, for a scheme that signs a
    /// timestamp, whether it is within the tolerance. A 400 problem naming the failed check
    /// otherwise.
    fn verify(&self, delivery: &Delivery<'_>, keys: &Keys<'_>) -> Result<(), Problem>;

    /// What the delivery is; called only once it verified, so a forger learns nothing of the
    /// rules on ids.
    fn identify(&self, delivery: &Delivery<'_>) -> Result<Identified, Problem>;

    /// For a scheme that signs with a certificate the delivery names (PayPal): its URL, once
    /// every check that needs no key passed (headers, timestamp), so a forgery that fails them
    /// costs no fetch; the route then resolves it into [`Keys::certificate`]. `None` for the
    /// schemes keyed by their secrets.
    fn certificate_url<'d>(
        &self,
        _delivery: &Delivery<'d>,
        _keys: &Keys<'_>,
    ) -> Result<Option<&'d str>, Problem> {
        Ok(None)
    }

    /// [`Scheme::identify`] given the keys, for a scheme whose handshake answer is keyed (Zoom's
    /// `encryptedToken`); called only once the delivery verified under `keys`.
    fn identify_keyed(
        &self,
        delivery: &Delivery<'_>,
        _keys: &Keys<'_>,
    ) -> Result<Identified, Problem> {
        self.identify(delivery)
    }

    /// The sender's own headers a handler may want (its delivery id, topic, retry count, …),
    /// lower case, carried with the event to `Event::header`; none by default. Kept only from
    /// a delivery that verified (see `kept.rs`).
    fn kept_headers(&self) -> &'static [&'static str] {
        &[]
    }
}

/// The rules of a named scheme; `None` for `hmac`, whose rules are the source's (see `ready`).
fn named(kind: SchemeKind) -> Option<Box<dyn Scheme>> {
    match kind {
        SchemeKind::Github => Some(Box::new(github::Github)),
        SchemeKind::Linear => Some(Box::new(linear::Linear)),
        SchemeKind::Paddle => Some(Box::new(paddle::Paddle)),
        SchemeKind::Paypal => Some(Box::new(paypal::Paypal)),
        SchemeKind::Shopify => Some(Box::new(shopify::Shopify)),
        SchemeKind::Slack => Some(Box::new(slack::Slack)),
        SchemeKind::Square => Some(Box::new(square::Square)),
        SchemeKind::Twilio => Some(Box::new(twilio::Twilio)),
        SchemeKind::Adyen => Some(Box::new(adyen::Adyen)),
        SchemeKind::Zoom => Some(Box::new(zoom::Zoom)),
        // The declarative scheme's rules are the source's own: built in `ready`.
        SchemeKind::Hmac => None,
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
    uri: Uri,
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
    let outcome = receive_from(&state, source, uri.query(), &headers, body)
        .instrument(span)
        .await;
    answer(&source.name, ROUTE, started, outcome)
}

/// Verify, identify, publish durably: the event's id once it is (every event's, for a batch),
/// or the challenge.
async fn receive_from(
    state: &SourcesState,
    source: &Source,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Accepted, Problem> {
    let body = read_body(body)?;
    let delivery = Delivery {
        headers,
        body: &body,
        query,
    };
    let scheme = source.scheme.as_ref();
    let mut keys = Keys {
        secrets: &source.secrets,
        tolerance_secs: source.tolerance_secs,
        now: (state.clock)(),
        public_url: source.public_url.as_deref(),
        webhook_id: source.webhook_id.as_deref(),
        certificate: None,
    };
    let certificate = match (
        scheme.certificate_url(&delivery, &keys)?,
        &source.certificates,
    ) {
        (Some(url), Some(certificates)) => Some(certificates.for_url(url, keys.now).await?),
        _ => None,
    };
    keys.certificate = certificate.as_deref();
    scheme.verify(&delivery, &keys)?;
    let (events, answer) = match scheme.identify_keyed(&delivery, &keys)? {
        Identified::Challenge(challenge) => return Ok(Accepted::Challenge(challenge)),
        Identified::Event { id, event_type } => {
            let event = BatchEvent {
                id: match &source.id_field {
                    Some(field) => id_field::read(&body, field)?,
                    None => id,
                },
                event_type,
                payload: body.clone(),
            };
            (vec![event], None)
        }
        Identified::Batch { events, answer } => (events, answer),
    };
    // A 2xx says every event is durable: a batch of none would say it of nothing.
    if events.is_empty() {
        return Err(invalid_payload(
            "the delivery is a batch of no events",
            "empty_batch",
        ));
    }
    // Every event is checked before any is published: a batch with one event the store cannot
    // hold is refused whole, with nothing enqueued.
    for event in &events {
        checked(EventField::Id, &event.id, "event_id")?;
        if let Some(event_type) = &event.event_type {
            checked(EventField::Type, event_type, "event_type")?;
        }
    }
    if let [event] = events.as_slice() {
        record_event(&event.id, event.event_type.as_deref());
    }
    // One after the other, each awaited until durable: the first that cannot be stored answers
    // 503 and the sender redelivers the whole delivery; the events already published are then
    // duplicates the consumer recognises by their ids.
    let sender_headers = kept::kept_headers(scheme, headers);
    let mut last_id = String::new();
    for event in events {
        last_id.clone_from(&event.id);
        publish(
            state.transport.as_ref(),
            state.publish_timeout,
            outgoing(&source.name, event, sender_headers.clone()),
        )
        .await?;
    }
    Ok(match answer {
        Some(text) => Accepted::Text(text),
        None => Accepted::Received(last_id),
    })
}

/// The one place a verified event becomes a message: under the source's name, with the
/// sender's id as the message id, its type as the message type and the delivery's kept headers
/// (every event of a batch arrived with the same ones).
fn outgoing(source: &str, event: BatchEvent, sender_headers: SenderHeaders) -> OutgoingMessage {
    OutgoingMessage {
        source: Some(source.to_owned()),
        message_id: Some(event.id),
        message_type: event.event_type,
        payload: event.payload,
        traceparent: None,
        stripe_signature: None,
        sender_headers,
    }
}
