//! Thin events replaced by their full events before the handler runs
//! (`stripe.fetch_thin_events`), so that handlers see one shape whichever way Stripe delivered
//! a change.
//!
//! A thin event (an event notification, `"object": "v2.core.event"`) carries only a reference:
//! its full event is `GET /v2/core/events/{id}` (under `Stripe-Context` when the event has a
//! `context`). The fetch runs after decoding and before the batch transaction opens, so no
//! transaction or row lock is held while Stripe answers, and only for events that are not
//! processed yet (one read of the dedup record, outside the transaction: the common duplicate, a
//! thin event whose snapshot event was handled, costs no API call). The transaction's own dedup
//! insert still decides: an event another worker commits in between is a duplicate there, and
//! its fetched body is dropped.
//!
//! A fetch that fails (Stripe's 5xx or 429, a timeout, a refused connection, an answer that is
//! not the event asked for) is the event's failure, never the batch's: the event is not recorded
//! as processed, and its delivery comes back after the consumer's backoff, then is dead-lettered
//! after `consumer.max_attempts` like a handler that keeps failing (`dlq redrive` replays it).
//! What can never succeed (an id that is not a Stripe id, a context that cannot be a header, an
//! answer over the size limit) is
//! dead-lettered at once. The event's other fields (source, dedup key, type) stay as decoded.
//!
//! Bounded: each request within `stripe.api_timeout`, [`FETCH_TRIES`] tries within one step,
//! at most [`FETCH_CONCURRENCY`] requests at a time, and the whole fetch within half of
//! `consumer.step_timeout`, so a slow API fails its fetches (retried later), not the batch.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;

use super::HandlerError;
use crate::event::Event;
use crate::queue::Delivery;
use crate::store::{Store, StoreError};
use crate::stripe::{ApiError, RetryPolicy, StripeApi, StripeEventHead};

/// Requests to Stripe's API in flight at once for one batch (Stripe allows 25 reads a second in
/// test mode, 100 in live mode, per account).
pub const FETCH_CONCURRENCY: usize = 8;

/// Tries of one fetch within a step; a fetch that fails them all is retried with its
/// delivery's backoff.
pub const FETCH_TRIES: RetryPolicy = RetryPolicy {
    attempts: 2,
    base: Duration::from_millis(100),
    max_wait: Duration::from_secs(1),
};

/// Fetches thin events' full events (`stripe.fetch_thin_events`); cheap to clone (one HTTP
/// client, shared by the workers).
#[derive(Clone)]
pub struct FullEventFetch {
    /// Stripe's API under `stripe.api_key`, each request bounded by `stripe.api_timeout`.
    api: StripeApi,
    /// The largest full event accepted (`consumer.max_message_bytes`, as for a message).
    max_bytes: usize,
}

/// A new event whose full event could not be fetched, with why: it fails as a handler would.
pub(super) type Unfetched<'d> = (Event, &'d Delivery, HandlerError);

/// The batch's events after stage 2: those to claim, and those whose fetch failed.
pub(super) struct Fetched<'d> {
    /// Every event whose fetch succeeded or was not needed, in the batch's order.
    pub(super) events: Vec<(Event, &'d Delivery)>,
    pub(super) unfetched: Vec<Unfetched<'d>>,
}

impl FullEventFetch {
    pub fn new(api: StripeApi, max_bytes: usize) -> Self {
        FullEventFetch { api, max_bytes }
    }

    /// `event`'s payload replaced by the full event of the thin event it is; an error says why
    /// it could not be.
    async fn replace(
        &self,
        event: &mut Event,
        own_id: &str,
        context: Option<&str>,
    ) -> Result<(), HandlerError> {
        let full = self
            .api
            .fetch_v2_event(own_id, context, self.max_bytes, FETCH_TRIES)
            .await
            .map_err(|error| {
                let fatal = matches!(
                    error,
                    ApiError::InvalidId | ApiError::InvalidContext | ApiError::TooLarge { .. }
                );
                let cause = crate::error::Cause::new(
                    format!("fetching the full event of thin event {own_id}: {error}"),
                    error,
                );
                if fatal {
                    HandlerError::Fatal(cause)
                } else {
                    HandlerError::Retryable(cause)
                }
            })?;
        // The answer must be the event asked for: a proxy's page or another event forwarded as
        // this one would be handled under this event's key, once and for good.
        let answered = StripeEventHead::read(&full)
            .ok()
            .map(|head| head.own_id() == own_id);
        if answered != Some(true) {
            return Err(HandlerError::Retryable(
                format!(
                    "fetching the full event of thin event {own_id}: the answer is not that event"
                )
                .into(),
            ));
        }
        event.payload = full;
        Ok(())
    }
}

/// The thin event `event` is, if it is one: its own id and its context.
fn thin_event(event: &Event) -> Option<(String, Option<String>)> {
    if event.source != crate::stripe::SOURCE {
        return None;
    }
    let head = StripeEventHead::read(&event.payload).ok()?;
    head.is_thin().then(|| {
        (
            head.own_id().to_owned(),
            head.context.map(|c| c.into_owned()),
        )
    })
}

/// Stage 2 of the pipeline: the batch's new thin events replaced by their full events (see the
/// module docs), split from those whose fetch failed. Without fetching configured (`fetch` is
/// `None`), every event as it is.
pub(super) async fn fetch_full_events<'d>(
    fetch: Option<&FullEventFetch>,
    store: &Store,
    step_timeout: Duration,
    events: Vec<(Event, &'d Delivery)>,
) -> Result<Fetched<'d>, StoreError> {
    let mut unfetched = Vec::new();
    let events = fetch_each(fetch, store, step_timeout, events)
        .await?
        .into_iter()
        .filter_map(|(event, delivery, fetched)| match fetched {
            Ok(()) => Some((event, delivery)),
            Err(error) => {
                unfetched.push((event, delivery, error));
                None
            }
        })
        .collect();
    Ok(Fetched { events, unfetched })
}

/// Each event with its fetch's outcome, `Ok` for those that needed none.
async fn fetch_each<'d>(
    fetch: Option<&FullEventFetch>,
    store: &Store,
    step_timeout: Duration,
    events: Vec<(Event, &'d Delivery)>,
) -> Result<Vec<(Event, &'d Delivery, Result<(), HandlerError>)>, StoreError> {
    let Some(fetch) = fetch else {
        return Ok(events.into_iter().map(|(e, d)| (e, d, Ok(()))).collect());
    };
    let thin: Vec<Option<(String, Option<String>)>> =
        events.iter().map(|(event, _)| thin_event(event)).collect();
    let keys: Vec<String> = events
        .iter()
        .zip(&thin)
        .filter(|(_, thin)| thin.is_some())
        .map(|((event, _), _)| event.id.clone())
        .collect();
    if keys.is_empty() {
        return Ok(events.into_iter().map(|(e, d)| (e, d, Ok(()))).collect());
    }
    let processed: HashSet<String> = store
        .dedup()
        .processed_among(crate::stripe::SOURCE, &keys)
        .await?
        .into_iter()
        .collect();
    let limit = step_timeout / 2;
    let deadline = tokio::time::Instant::now() + limit;
    // The futures made first, then polled a few at a time: a stream's `map` closure over
    // borrowed state would make the step's future not `Send`.
    let processed = &processed;
    let jobs: Vec<_> = events
        .into_iter()
        .zip(thin)
        .map(|((mut event, delivery), thin)| async move {
            let outcome = match thin {
                Some((own_id, context)) if !processed.contains(&event.id) => {
                    let replaced = fetch.replace(&mut event, &own_id, context.as_deref());
                    tokio::time::timeout_at(deadline, replaced).await.unwrap_or_else(|_| {
                        Err(HandlerError::Retryable(
                            format!("fetching the full event of thin event {own_id} did not finish within {limit:?}").into(),
                        ))
                    })
                }
                _ => Ok(()),
            };
            (event, delivery, outcome)
        })
        .collect();
    let fetched = futures::stream::iter(jobs)
        .buffered(FETCH_CONCURRENCY)
        .collect()
        .await;
    Ok(fetched)
}
