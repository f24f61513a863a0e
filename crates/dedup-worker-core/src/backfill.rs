//! `dedup-worker backfill`: events Stripe no longer retries, fed back through dedup.
//!
//! Stripe retries a webhook for three days, then stops; an endpoint that was down, disabled or
//! misconfigured for longer has lost those events. Stripe's list-events API
//! (`GET /v1/events`, the last 30 days) still has them. A backfill pages through it for a time
//! range and publishes each event through the configured transport exactly as ingress would
//! (source `stripe`, id, type, the event's JSON), so the consumer deduplicates it against what
//! webhooks delivered: an event received before is not handled again, the rest are handled once.
//!
//! * **Resumable.** Before publishing a page, the backfill asks the store which of its events
//!   are processed already and skips them: a second run over the same range, once the consumer
//!   has caught up, publishes nothing. (An event published but not yet consumed is published
//!   again by a second run; the consumer's dedup absorbs that.)
//! * **Rate limits and blips.** A 429 is retried after its `Retry-After` (or a backoff), a 5xx
//!   or a failed request after a backoff, up to [`MAX_ATTEMPTS`] tries per page; every request
//!   is bounded by [`REQUEST_TIMEOUT`], every publish by the transport's publish timeout.
//! * **Bounded pages.** A page is read into memory up to [`page_limit`] bytes (a hundred
//!   events of at most `consumer.max_message_bytes` each); a larger one, or one that never
//!   ends, stops the backfill with an error naming the limit before any of that page is
//!   published; one that trickles, at [`REQUEST_TIMEOUT`]. What earlier pages published is
//!   what the progress lines reported.
//! * **Filters.** `--type` patterns (`invoice.*`, `*.updated`, exact names) are matched here,
//!   on each listed event; Stripe's own `type` filter takes one pattern only.

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::event::type_matches;
use crate::queue::{OutgoingMessage, Transport, TransportError};
use crate::store::{Store, StoreError};
use crate::stripe::{ApiError, RetryPolicy, StripeApi};

/// Events per page: Stripe's maximum.
const PAGE_SIZE: u32 = 100;
/// The longest one list request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries per page before the backfill gives up (and says how far it got).
pub const MAX_ATTEMPTS: u32 = 8;
/// The longest `Retry-After` honoured; a longer one is waited this long, then retried.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Room in a page for what is not an event (the list's own fields, commas, brackets).
const PAGE_OVERHEAD_BYTES: usize = 64 * 1024;

/// The largest page read: 100 events (a page's size) of at most `max_message_bytes` each (the
/// consumer dead-letters a larger event unread anyway), plus 64 KiB for the list around them.
pub fn page_limit(max_message_bytes: usize) -> usize {
    (PAGE_SIZE as usize)
        .saturating_mul(max_message_bytes)
        .saturating_add(PAGE_OVERHEAD_BYTES)
}

/// Which events to list.
#[derive(Debug, Clone)]
pub struct BackfillRange {
    /// Unix seconds: events created at or after this.
    pub since: i64,
    /// Unix seconds: events created at or before this (none: up to now).
    pub until: Option<i64>,
    /// Event type patterns (`*` matches any run of characters); empty: every type.
    pub types: Vec<String>,
}

/// What a backfill did; printed at the end, and after each page as progress.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Events listed by Stripe in the range and matching the type filter.
    pub listed: u64,
    /// Published through the transport.
    pub enqueued: u64,
    /// Skipped: processed already (received by webhook or by an earlier backfill).
    pub already_processed: u64,
    /// Pages read.
    pub pages: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error("listing events from Stripe failed: {0}")]
    List(#[source] ApiError),
    /// A page over [`page_limit`]: nothing of it was published.
    #[error(
        "a page of Stripe's events is larger than {limit} bytes ({PAGE_SIZE} events of at most \
         consumer.max_message_bytes each, and the list around them); stopped before publishing \
         any of that page"
    )]
    PageTooLarge { limit: usize },
    #[error("Stripe's answer is not a page of events")]
    Decode(#[source] serde_json::Error),
    #[error("asking the store which events are processed failed")]
    Store(#[source] StoreError),
    #[error("publishing {event_id} failed")]
    Publish {
        event_id: String,
        #[source]
        source: TransportError,
    },
}

/// One page of `GET /v1/events`.
#[derive(Deserialize)]
struct Page {
    data: Vec<Box<RawValue>>,
    has_more: bool,
}

/// What the backfill reads of each event; the event itself is published as listed.
#[derive(Deserialize)]
struct Listed<'a> {
    #[serde(borrow)]
    id: &'a str,
    #[serde(borrow, rename = "type")]
    event_type: &'a str,
}

/// How a page is tried: [`MAX_ATTEMPTS`] tries, a 429 waited out after its `Retry-After`.
const PAGE_RETRIES: RetryPolicy = RetryPolicy {
    attempts: MAX_ATTEMPTS,
    base: Duration::from_millis(500),
    max_wait: MAX_RETRY_AFTER,
};

/// One page of `GET /v1/events`, tried as [`PAGE_RETRIES`] says.
async fn page(
    api: &StripeApi,
    range: &BackfillRange,
    starting_after: Option<&str>,
    max_bytes: usize,
) -> Result<Page, BackfillError> {
    let mut query = vec![
        ("limit", PAGE_SIZE.to_string()),
        ("created[gte]", range.since.to_string()),
    ];
    if let Some(until) = range.until {
        query.push(("created[lte]", until.to_string()));
    }
    if let Some(after) = starting_after {
        query.push(("starting_after", after.to_owned()));
    }
    let body = api
        .get_limited("/v1/events", &query, &[], PAGE_RETRIES, max_bytes)
        .await
        .map_err(|error| match error {
            ApiError::TooLarge { limit } => BackfillError::PageTooLarge { limit },
            error => BackfillError::List(error),
        })?;
    serde_json::from_slice::<Page>(&body).map_err(BackfillError::Decode)
}

/// How the backfill talks to its transport and reads Stripe's pages.
#[derive(Debug, Clone, Copy)]
pub struct BackfillLimits {
    /// Each publish waits at most this (`transport.publish_timeout`).
    pub publish_timeout: Duration,
    /// The largest page read, in bytes ([`page_limit`]).
    pub max_page_bytes: usize,
}

/// Lists the range page by page and publishes what is not processed yet; `progress` is called
/// after each page.
pub async fn backfill(
    api: &StripeApi,
    range: &BackfillRange,
    store: &Store,
    transport: &dyn Transport,
    limits: BackfillLimits,
    mut progress: impl FnMut(&Summary),
) -> Result<Summary, BackfillError> {
    let BackfillLimits {
        publish_timeout,
        max_page_bytes,
    } = limits;
    let mut summary = Summary::default();
    let mut starting_after: Option<String> = None;
    loop {
        let page = page(api, range, starting_after.as_deref(), max_page_bytes).await?;
        summary.pages += 1;
        let mut events = Vec::with_capacity(page.data.len());
        for raw in &page.data {
            // An entry that is not an event with an id and a type is skipped, not fatal.
            if let Ok(listed) = serde_json::from_str::<Listed>(raw.get()) {
                events.push((listed, raw));
            }
        }
        starting_after = events.last().map(|(e, _)| e.id.to_owned());
        events.retain(|(e, _)| {
            range.types.is_empty() || range.types.iter().any(|p| type_matches(p, e.event_type))
        });
        summary.listed += events.len() as u64;
        let ids: Vec<String> = events.iter().map(|(e, _)| e.id.to_owned()).collect();
        let processed = store
            .dedup()
            .processed_among(crate::stripe::SOURCE, &ids)
            .await
            .map_err(BackfillError::Store)?;
        for (event, raw) in &events {
            if processed.iter().any(|id| id == event.id) {
                summary.already_processed += 1;
                continue;
            }
            let message = OutgoingMessage {
                source: Some(crate::stripe::SOURCE.to_owned()),
                message_id: Some(event.id.to_owned()),
                message_type: Some(event.event_type.to_owned()),
                payload: bytes::Bytes::copy_from_slice(raw.get().as_bytes()),
                traceparent: None,
                // Listed from Stripe's API, not a signed delivery: every generation is looked up.
                stripe_signature: None,
                sender_headers: crate::event::SenderHeaders::default(),
            };
            let published = tokio::time::timeout(publish_timeout, transport.publish(message))
                .await
                .unwrap_or_else(|_| {
                    Err(TransportError::Unavailable(
                        format!("no answer within {publish_timeout:?}").into(),
                    ))
                });
            published.map_err(|source| BackfillError::Publish {
                event_id: event.id.to_owned(),
                source,
            })?;
            summary.enqueued += 1;
        }
        progress(&summary);
        if !page.has_more || starting_after.is_none() {
            return Ok(summary);
        }
    }
}
