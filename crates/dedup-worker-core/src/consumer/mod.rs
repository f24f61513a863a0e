//! The deduplicating consumer.
//!
//! One step ([`Consumer::try_step`]) takes a batch from the transport and, in ONE database
//! transaction, records the new `(source, event id)` pairs with `INSERT … ON CONFLICT DO
//! NOTHING`, runs the [`Handler`] for the new ones only, and writes the outbox rows they
//! produced. Only after the commit are the deliveries acked. So:
//! * an event is marked processed only together with its handler's effects: a crash before
//!   commit leaves nothing, and the redelivery runs the handler;
//! * a duplicate (in the same batch, a later batch or another worker's) finds the row and is
//!   acked without running the handler;
//! * a failing event never blocks its batch: it is rolled back to its savepoint, its dedup row
//!   removed, and it is retried with backoff or dead-lettered;
//! * a delivery its transport gave up on ([`Delivery::give_up`]: over `transport.delivery_limit`,
//!   or parked by the broker) is dead-lettered without running its handler, once per event,
//!   unless its event was handled already;
//! * a message that cannot become an event (not JSON, no id, an id the store cannot hold: see
//!   [`decode`]) is dead-lettered with the reason and acked, never retried;
//! * with `stripe.fetch_thin_events`, a new thin event is replaced by its full event before the
//!   transaction opens (`full_event.rs`); a fetch that fails is that event's failure, retried
//!   with backoff like a handler's, never the batch's;
//! * no shared fate: if the database refuses the batch's transaction for one row's data (a
//!   handler's outbox message with a NUL, say), the batch is processed again one delivery at a
//!   time, and the delivery that is refused on its own is dead-lettered with the database's
//!   reason. Any other failure (connection lost, deadlock) leaves the whole batch unacked, to
//!   come back.
//!
//! The loop ([`Consumer::run`], in `run.rs`) repeats the step until shutdown, and heals what a
//! failed step leaves: it gives the batch back to the transport at once, backs off, and waits
//! for the store to answer before it receives again.

mod batch;
mod dead_letter;
pub mod decode;
mod error;
mod full_event;
pub mod handler;
mod handling;
mod record;
mod run;
mod settle;
mod stale;

use std::collections::HashSet;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;

/// Re-exported beside [`Handler`], which returns it; it lives with the outbox it fills.
pub use crate::outbox::OutboxMessage;
pub use decode::{decode_delivery, DecodeError};
pub use full_event::FullEventFetch;
pub use handler::{ForwardHandler, Handler, HandlerError, HandlerResultExt, LedgerHandler};
use settle::Settlement;
pub use stale::StaleGuard;

use crate::config::EnvelopeKind;
use crate::queue::{Delivery, DeliveryTag, Transport, TransportError};
use crate::store::{Store, StoreError, Wakeups};

/// Consumer options (see `[consumer]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// First half of the dedup key.
    pub source: String,
    /// Where the event id sits in a payload whose message carries no id.
    pub dedup_key_pointer: String,
    pub batch_size: usize,
    /// How long one receive waits for a first message (SQS waits its own longer long poll;
    /// [`Consumer::run`] stops without waiting for either).
    pub poll_interval: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Larger messages are dead-lettered without being parsed (bounds the work one foreign
    /// message can cause).
    pub max_message_bytes: usize,
    /// How long the transport leases a received message (`consumer.lease`); the consumer
    /// extends the lease every third of it while it works on the batch.
    pub lease: Duration,
    /// The longest one batch may take, from its transaction's start to its acks
    /// (`consumer.step_timeout`). Past it the step fails: its transaction is dropped
    /// (rolled back) and the loop gives its deliveries back. Without it, a database that stops
    /// answering mid-transaction would hold the batch, and on RabbitMQ its unacked deliveries,
    /// for as long as the connection stays open.
    pub step_timeout: Duration,
    /// What wraps the events in the queue's messages (`consumer.envelope`): nothing, or
    /// EventBridge envelopes, unwrapped by [`decode_delivery`].
    pub envelope: EnvelopeKind,
}

/// A step failed as a whole; nothing was acked, so the transport redelivers.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The batch did not finish within [`ConsumerOptions::step_timeout`].
    #[error(
        "the batch did not finish within {0:?} (consumer.step_timeout); abandoned and rolled back"
    )]
    TimedOut(Duration),
}

/// What one step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepOutcome {
    /// Deliveries received.
    pub received: usize,
    /// Events handled for the first time (committed).
    pub handled: usize,
    /// Deliveries acked as duplicates without running the handler.
    pub duplicates: usize,
    /// Deliveries that will come back after a backoff.
    pub retried: usize,
    /// Events dead-lettered in this step.
    pub dead_lettered: usize,
}

impl std::ops::AddAssign for StepOutcome {
    fn add_assign(&mut self, other: Self) {
        self.received += other.received;
        self.handled += other.handled;
        self.duplicates += other.duplicates;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
    }
}

/// Longest text kept in a dead letter's error (a handler's message may be anything).
const MAX_DEAD_LETTER_ERROR_CHARS: usize = 4096;

/// What happened to one new event in the transaction.
enum Verdict {
    Handled(Handled),
    Failed(HandlerError),
}

/// What a handler that succeeded produced: its messages, and the `traceparent` of the span it
/// ran in, which its outbox rows carry so the relay's delivery continues the event's trace.
struct Handled {
    messages: Vec<OutboxMessage>,
    traceparent: Option<String>,
}

pub struct Consumer {
    store: Store,
    transport: Arc<dyn Transport>,
    handler: Arc<dyn Handler>,
    wakeups: Arc<Wakeups>,
    options: ConsumerOptions,
    /// Holds back events older than what was handled for their object (`stale.rs`); off: `None`.
    stale_guard: Option<StaleGuard>,
    /// Replaces thin events by their full events before the handler (`full_event.rs`); off:
    /// `None`.
    full_events: Option<FullEventFetch>,
    /// The deliveries of the current step handed to the handler (`handling.rs`): if the step
    /// fails, only these may count towards the transport's delivery limit (`run.rs`).
    handed: std::sync::Mutex<HashSet<DeliveryTag>>,
}

impl Consumer {
    pub fn new(
        store: Store,
        transport: Arc<dyn Transport>,
        handler: Arc<dyn Handler>,
        wakeups: Arc<Wakeups>,
        options: ConsumerOptions,
    ) -> Self {
        Consumer {
            store,
            transport,
            handler,
            wakeups,
            options,
            stale_guard: None,
            full_events: None,
            handed: std::sync::Mutex::default(),
        }
    }

    /// The current step's deliveries handed to the handler, whatever a panicking holder left.
    fn handed(&self) -> MutexGuard<'_, HashSet<DeliveryTag>> {
        self.handed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns the stale-event guard on (`None`: off, the default).
    pub fn with_stale_guard(mut self, guard: Option<StaleGuard>) -> Self {
        self.stale_guard = guard;
        self
    }

    /// Turns fetching thin events' full events on (`None`: off, the default).
    pub fn with_full_event_fetch(mut self, fetch: Option<FullEventFetch>) -> Self {
        self.full_events = fetch;
        self
    }

    /// Receives one batch and processes it. See the module docs for the guarantees.
    pub async fn try_step(&self) -> Result<StepOutcome, ConsumerError> {
        let deliveries = self
            .transport
            .receive(self.options.batch_size, self.options.poll_interval)
            .await?;
        self.process(&deliveries).await
    }

    /// Processes one received batch: commits its outcome while a heartbeat keeps its leases,
    /// then acks and schedules its retries. The heartbeat stops before the acks and retries: an
    /// extension landing after a retry would overwrite the retry's backoff.
    async fn process(&self, deliveries: &[Delivery]) -> Result<StepOutcome, ConsumerError> {
        if deliveries.is_empty() {
            return Ok(StepOutcome::default());
        }
        self.handed().clear();
        let limit = self.options.step_timeout;
        let step = async {
            let settlement = self.commit_holding_leases(deliveries).await?;
            self.settle(settlement).await
        };
        tokio::time::timeout(limit, step)
            .await
            .unwrap_or(Err(ConsumerError::TimedOut(limit)))
    }

    /// Commits a batch's outcome; if the database refuses it for one row's data, commits it
    /// again one delivery at a time, dead-lettering the delivery that is refused alone.
    async fn commit<'d>(
        &self,
        deliveries: &'d [Delivery],
    ) -> Result<Settlement<'d>, ConsumerError> {
        match self.commit_batch(deliveries).await {
            Err(ConsumerError::Store(error))
                if deliveries.len() > 1 && error.refused_for_its_data() =>
            {
                tracing::warn!(%error, count = deliveries.len(), "the database refused a batch for one row's data; processing it one delivery at a time");
                self.commit_one_by_one(deliveries).await
            }
            Err(ConsumerError::Store(error)) if error.refused_for_its_data() => {
                self.dead_letter_refused(deliveries, &error).await
            }
            result => result,
        }
    }

    /// The batch again, each delivery in a transaction of its own. Stops at the first failure
    /// that is not about a row's data: what committed before it is settled, the rest given back.
    async fn commit_one_by_one<'d>(
        &self,
        deliveries: &'d [Delivery],
    ) -> Result<Settlement<'d>, ConsumerError> {
        let mut settlement = Settlement::default();
        for delivery in deliveries {
            let alone = std::slice::from_ref(delivery);
            let committed = match self.commit_batch(alone).await {
                Err(ConsumerError::Store(error)) if error.refused_for_its_data() => {
                    self.dead_letter_refused(alone, &error).await
                }
                result => result,
            };
            match committed {
                Ok(committed) => settlement += committed,
                Err(error) if settlement.outcome.received == 0 => return Err(error),
                Err(error) => {
                    settlement.failure = Some(error);
                    break;
                }
            }
        }
        Ok(settlement)
    }
}
