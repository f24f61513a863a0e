//! The deduplicating consumer: [`Consumer::try_step`] receives one batch from the transport and
//! runs it through the pipeline, and [`Consumer::run`] repeats the step until shutdown.
//!
//! What a batch does, in order, and what is acked when (a duplicate, a retry, a dead letter):
//! `pipeline.rs`, the stages as one list, each stage's details in a file of its own. The loop
//! around it (backoff, giving a failed step's batch back, shutdown): `run.rs`. What a handler
//! implements: [`Handler`] (`handler.rs`), and its failures, [`HandlerError`] (`error.rs`).

// The batch's stages, each a file: pipeline.rs lists them in order.
mod claim;
mod dead_letter;
mod decisions;
pub mod decode;
mod full_event;
mod handling;
mod pipeline;
mod settle;

// The loop around the step; the handler's side.
mod run;

mod error;
pub mod handler;
mod stale;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Re-exported beside [`Handler`], which returns it; it lives with the outbox it fills.
pub use crate::outbox::OutboxMessage;
pub use decode::{decode_delivery, DecodeError};
pub use full_event::FullEventFetch;
pub use handler::{ForwardHandler, Handler, HandlerError, HandlerResultExt, LedgerHandler};
pub use stale::StaleGuard;

use crate::config::EnvelopeKind;
use crate::event::search_keys::SearchPointers;
use crate::queue::{Transport, TransportError};
use crate::store::{Shard, Store, StoreError, Wakeups};
use handling::Handed;

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
    /// Which lanes the handlers' messages go to (`[[outbox.routes]]`).
    pub outbox_plan: std::sync::Arc<crate::outbox::OutboxPlan>,
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

/// The consumer: what its batches run with. Its step and its loop are below; the batch itself
/// is `pipeline.rs`'s.
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
    /// Keeps each handled event's body, its search keys at these pointers (`retention.
    /// payload_days > 0`); off: `None`, the default.
    kept_bodies: Option<SearchPointers>,
    /// The deliveries of the current step handed to the handler (`handling.rs`): if the step
    /// fails, only these may count towards the transport's delivery limit (`run.rs`).
    handed: Handed,
    /// Which counter rows of `activity_minutes` this worker's batches add to: taken at random
    /// here, so workers rarely wait for each other's counts (`store/activity.rs`).
    shard: Shard,
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
            kept_bodies: None,
            handed: Handed::default(),
            shard: Shard::random(),
        }
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

    /// Keeps the body of each event handled or held back as stale, with its search keys at
    /// `pointers`, in the batch's transaction (`None`: off, the default).
    pub fn with_kept_bodies(mut self, pointers: Option<SearchPointers>) -> Self {
        self.kept_bodies = pointers;
        self
    }

    /// Receives one batch and processes it: the stages of `pipeline.rs`, whose module docs
    /// state the guarantees.
    pub async fn try_step(&self) -> Result<StepOutcome, ConsumerError> {
        let deliveries = self
            .transport
            .receive(self.options.batch_size, self.options.poll_interval)
            .await?;
        pipeline::process(self, &deliveries).await
    }

    /// Repeats receive-and-process until `shutdown` (`run.rs`: what a failed step leaves is
    /// given back, then the loop backs off), then stops without stranding anything:
    /// * a batch being processed is finished, committed and acked, unless `abandon` comes first
    ///   (the grace period is nearly over): then its transaction is dropped, rolling back, and
    ///   its deliveries are given back;
    /// * a receive in progress (it may have claimed messages already) gets
    ///   `RECEIVE_DRAIN` to return, and what it returns is given back; past that it is
    ///   dropped (an SQS long poll that took nothing), and anything it had taken comes back
    ///   after its lease.
    pub async fn run(self, shutdown: CancellationToken, abandon: CancellationToken) {
        run::run(&self, shutdown, abandon).await
    }
}
