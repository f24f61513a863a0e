//! The SQS transport (aws-sdk-sqs). Credentials, region and endpoint come from the AWS SDK's
//! own environment (`AWS_REGION`, `AWS_ENDPOINT_URL`, …), so emulators work unchanged.
//!
//! * `publish` returns once `SendMessage` succeeded (SQS stores it redundantly before
//!   answering). The event id, type and source travel as message attributes; on a FIFO queue
//!   (`….fifo`) the event's object is the message group and `source:id` the deduplication id
//!   (`sqs/fifo.rs`).
//! * `receive` long-polls for a first page of ten, then gathers the rest of the batch with
//!   short polls side by side, until a time budget of a quarter of the lease is spent, and keeps
//!   what it holds leased while it does (`sqs/fill.rs`). Each message stays invisible for the
//!   lease (`consumer.lease`, extended by the consumer's heartbeat) and comes back if not
//!   deleted.
//! * Long polling: every `ReceiveMessage` is billed and counts against throttling, and an empty
//!   short poll answers at once, so a consumer looping on `receive` with its short
//!   `consumer.poll_interval` would send a stream of empty calls while idle. So a receive
//!   waits at least the transport's own long poll (`transport.sqs_wait_time`, 20 s by
//!   default: SQS's maximum), longer than its caller's `wait` if need be. SQS answers as soon as
//!   a message arrives, so this costs no latency; an idle consumer makes one call per worker per
//!   long poll. Shutdown does not wait for it: the consumer drops a pending receive when its
//!   token is cancelled (messages SQS handed to a dropped call come back after their lease).
//!   [`SqsQueue::with_client`] has no long poll of its own (each receive waits what its caller
//!   asks, in whole seconds), for tests and tools that poll with short deadlines.
//! * Every call is bounded: the SDK sets no read, attempt or operation timeout by default, so a
//!   hung endpoint (a partition, a dead pooled connection) would hold a consumer's delete or
//!   visibility change, a heartbeat or a publish forever. [`SqsQueue::from_env`] gives each
//!   attempt its `call_timeout` (`transport.publish_timeout`; an SQS sink's
//!   `outbox.http_timeout`) and each call, retries included, [`ATTEMPTS_PER_CALL`] times
//!   that: one hung attempt may be retried once. `ReceiveMessage` overrides both with its wait
//!   plus [`RECEIVE_TIMEOUT_MARGIN`] per attempt: bounded if SQS never answers, yet never
//!   cutting a long poll.
//! * `ack` is `DeleteMessageBatch` in tens, sent side by side (`sqs/batch.rs`), with duplicate
//!   receipt handles removed first (SQS rejects a batch whose entry ids repeat). A handle that
//!   a later receive replaced (the lease ran out first) is not an error: the message's work is
//!   committed and its new holder deletes it as a duplicate.
//! * `retry_later` changes the message's visibility to the backoff delay (at most 12 h).
//! * `extend_leases` (the consumer's heartbeat) sets the batch's visibility to the lease again
//!   with `ChangeMessageVisibilityBatch` (in tens side by side, as `release` does), so the
//!   visibility timeout can be short and a dead consumer's messages come back within seconds.

use std::collections::HashSet;
use std::time::Duration;

use crate::telemetry::traces;
use async_trait::async_trait;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use aws_sdk_sqs::Client;
use base64::Engine;

use super::{Backlog, Cause, Delivery, DeliveryTag, OutgoingMessage, Transport, TransportError};

pub(super) const ID_ATTRIBUTE: &str = "dedup-message-id";
pub(super) const TYPE_ATTRIBUTE: &str = "dedup-type";
pub(super) const SOURCE_ATTRIBUTE: &str = "dedup-source";
/// Set to `base64` when the payload was not UTF-8 (SQS bodies are text).
pub(super) const ENCODING_ATTRIBUTE: &str = "dedup-encoding";
/// The W3C `traceparent` of the span that published the message.
pub(super) const TRACE_ATTRIBUTE: &str = traces::TRACEPARENT;
/// The compact `Stripe-Signature` the ingress verified (`t=…,v1=…`).
pub(super) const STRIPE_SIGNATURE_ATTRIBUTE: &str = "dedup-stripe-signature";
/// Attribute carrying the sender's delivery headers (`X-GitHub-Delivery`, …), in
/// [`crate::event::SenderHeaders::to_wire`]'s form: one attribute for all of them, as SQS takes
/// at most ten per message and this transport sets up to six of its own.
pub(super) const SENDER_HEADERS_ATTRIBUTE: &str = "dedup-sender-headers";
/// The batch error code of a delete with a receipt handle that a newer receive replaced.
const RECEIPT_HANDLE_IS_INVALID: &str = "ReceiptHandleIsInvalid";
/// SQS's limit on a visibility timeout.
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);
/// SQS's limit on `WaitTimeSeconds`; also the long poll of [`SqsQueue::from_env`].
pub const MAX_WAIT: Duration = Duration::from_secs(20);
/// A `ReceiveMessage` attempt may take its wait plus this (the network, a slow answer) before
/// the SDK abandons it and retries: a long poll ends at its wait, so only a hung call is cut.
pub const RECEIVE_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);
/// A call's operation timeout, in attempt timeouts: an attempt stuck on a connection that died
/// silently is cut and retried once on a fresh one, and no call outlasts two attempts.
pub const ATTEMPTS_PER_CALL: u32 = 2;

/// An SQS call failed: unavailable, with the SDK's error as the cause (its whole context in
/// the text: the SDK's own `Display` names only the error's kind).
fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> TransportError {
    let context = format!("sqs: {}", DisplayErrorContext(&e));
    TransportError::Unavailable(Cause::new(context, e))
}

fn invalid(what: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(Cause::from(format!("sqs: {what}")))
}

pub struct SqsQueue {
    client: Client,
    /// The queue URL (`DEDUP_QUEUE`).
    url: String,
    /// How long a received message stays invisible.
    lease: Duration,
    /// The least a receive waits for a first message (`WaitTimeSeconds`), whatever its caller
    /// asked: see the module docs.
    long_poll: Duration,
    /// On a FIFO queue, the JSON pointer to the value that names a message's group (its
    /// object): see `sqs/fifo.rs`.
    message_group_pointer: String,
}

/// The default of [`SqsQueue::with_message_group_pointer`]: a Stripe event's object.
pub const DEFAULT_MESSAGE_GROUP_POINTER: &str = "/data/object/id";

fn string_attribute(value: &str) -> Result<MessageAttributeValue, TransportError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(invalid)
}

impl SqsQueue {
    /// Builds a client from the SDK's environment, each call attempt bounded by `call_timeout`
    /// (see the module docs); receives long-poll for [`MAX_WAIT`] (set another with
    /// [`SqsQueue::with_long_poll`]).
    pub async fn from_env(url: String, lease: Duration, call_timeout: Duration) -> Self {
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let client = Client::from_conf(client_config(&sdk, call_timeout));
        SqsQueue::with_client(client, url, lease).with_long_poll(MAX_WAIT)
    }

    /// For tests and tools that already have a client. No long poll of its own: each receive
    /// waits what its caller asks.
    pub fn with_client(client: Client, url: String, lease: Duration) -> Self {
        SqsQueue {
            client,
            url,
            lease,
            long_poll: Duration::ZERO,
            message_group_pointer: DEFAULT_MESSAGE_GROUP_POINTER.to_owned(),
        }
    }

    /// On a FIFO queue, the message group is the value at `pointer` in the payload.
    pub fn with_message_group_pointer(mut self, pointer: String) -> Self {
        self.message_group_pointer = pointer;
        self
    }

    /// The least each receive waits for a first message, in whole seconds up to [`MAX_WAIT`].
    pub fn with_long_poll(mut self, wait: Duration) -> Self {
        self.long_poll = wait.min(MAX_WAIT);
        self
    }

    fn secs(d: Duration) -> i32 {
        i32::try_from(d.min(MAX_VISIBILITY).as_secs()).unwrap_or(i32::MAX)
    }

    /// One `ReceiveMessage` call: each delivery with SQS's own message id.
    async fn receive_once(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(String, Delivery)>, TransportError> {
        let wait = Duration::from_secs(wait.min(MAX_WAIT).as_secs());
        // The client's timeouts are sized for calls SQS answers at once: they would cut every
        // idle long poll. Both are replaced (a timeout the override leaves unset is the
        // client's).
        let attempt = wait + RECEIVE_TIMEOUT_MARGIN;
        let timeout = TimeoutConfig::builder()
            .operation_attempt_timeout(attempt)
            .operation_timeout(attempt * ATTEMPTS_PER_CALL)
            .build();
        let output = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .wait_time_seconds(wait.as_secs() as i32)
            .visibility_timeout(Self::secs(self.lease))
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .customize()
            .config_override(aws_sdk_sqs::Config::builder().timeout_config(timeout))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output
            .messages()
            .iter()
            .filter_map(|m| Some((m.message_id()?.to_owned(), incoming::delivery_of(m)?)))
            .collect())
    }
}

/// The SQS client's configuration: `sdk`'s, with every call bounded (see the module docs).
fn client_config(sdk: &aws_config::SdkConfig, call_timeout: Duration) -> aws_sdk_sqs::Config {
    // From the SDK's own timeouts, so its connect timeout stays.
    let timeouts = sdk
        .timeout_config()
        .map(TimeoutConfig::to_builder)
        .unwrap_or_default()
        .operation_attempt_timeout(call_timeout)
        .operation_timeout(call_timeout * ATTEMPTS_PER_CALL)
        .build();
    aws_sdk_sqs::config::Builder::from(sdk)
        .timeout_config(timeouts)
        .build()
}

/// The SQS receipt handles among `tags`, each once.
fn receipt_handles(tags: &[DeliveryTag]) -> Vec<&str> {
    let mut seen = HashSet::new();
    tags.iter()
        .filter_map(|tag| match tag {
            DeliveryTag::Sqs { receipt_handle } => Some(receipt_handle.as_str()),
            _ => None,
        })
        .filter(|handle| seen.insert(*handle))
        .collect()
}

impl SqsQueue {
    /// `SendMessage` to the queue at `url`.
    async fn send(&self, url: &str, message: OutgoingMessage) -> Result<(), TransportError> {
        let (body, encoded) = match std::str::from_utf8(&message.payload) {
            Ok(text) => (text.to_owned(), false),
            Err(_) => (
                base64::engine::general_purpose::STANDARD.encode(&message.payload),
                true,
            ),
        };
        let mut request = self.client.send_message().queue_url(url).message_body(body);
        if let Some(id) = &message.message_id {
            request = request.message_attributes(ID_ATTRIBUTE, string_attribute(id)?);
            if url.ends_with(".fifo") {
                request = request
                    .message_deduplication_id(fifo::message_deduplication_id(
                        message.source.as_deref(),
                        id,
                    ))
                    .message_group_id(fifo::message_group_id(
                        &message,
                        &self.message_group_pointer,
                    ));
            }
        }
        if let Some(kind) = &message.message_type {
            request = request.message_attributes(TYPE_ATTRIBUTE, string_attribute(kind)?);
        }
        if let Some(source) = &message.source {
            request = request.message_attributes(SOURCE_ATTRIBUTE, string_attribute(source)?);
        }
        if encoded {
            request = request.message_attributes(ENCODING_ATTRIBUTE, string_attribute("base64")?);
        }
        if let Some(traceparent) = &message.traceparent {
            request = request.message_attributes(TRACE_ATTRIBUTE, string_attribute(traceparent)?);
        }
        if let Some(signature) = &message.stripe_signature {
            request = request
                .message_attributes(STRIPE_SIGNATURE_ATTRIBUTE, string_attribute(signature)?);
        }
        if let Some(sender_headers) = message.sender_headers.to_wire() {
            request = request
                .message_attributes(SENDER_HEADERS_ATTRIBUTE, string_attribute(&sender_headers)?);
        }
        request.send().await.map_err(unavailable)?;
        Ok(())
    }
}

#[async_trait]
impl Transport for SqsQueue {
    async fn publish(&self, message: OutgoingMessage) -> Result<(), TransportError> {
        self.send(&self.url, message).await
    }

    async fn publish_to_queue(
        &self,
        queue: &str,
        message: OutgoingMessage,
    ) -> Result<(), TransportError> {
        self.send(queue, message).await
    }

    /// A queue URL; a plain name would be refused by SQS anyway, but only after the attempt.
    fn can_address(&self, queue: &str) -> bool {
        queue.starts_with("https://") || queue.starts_with("http://")
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        self.fill(max, wait.max(self.long_poll)).await
    }

    async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        let handles = receipt_handles(tags);
        let refused = self.delete(&handles).await?;
        // A message received again after its lease ran out has a new receipt handle; the old
        // one cannot delete it. Its work is committed, so whoever holds the new handle sees a
        // duplicate and deletes it: nothing to do here. Any other refusal leaves the message to
        // come back after its visibility timeout, recognised as a duplicate then.
        let failures: Vec<_> = refused
            .iter()
            .filter(|entry| {
                let superseded = entry.code == RECEIPT_HANDLE_IS_INVALID;
                if superseded {
                    tracing::debug!(
                        "sqs delete of a message received again since; its new holder acks it"
                    );
                }
                !superseded
            })
            .collect();
        match failures.first() {
            None => Ok(()),
            Some(first) => Err(invalid(format!(
                "{} of {} deletes failed, e.g. {}: {}",
                failures.len(),
                handles.len(),
                first.code,
                first.message
            ))),
        }
    }

    async fn release(&self, tags: &[DeliveryTag]) -> Result<(), TransportError> {
        // Visibility 0: receivable again at once. An entry that fails alone (a message deleted
        // already, a handle superseded by a newer receive) has nothing left to give back.
        self.change_visibility(&receipt_handles(tags), Duration::ZERO)
            .await
            .map(drop)
    }

    async fn extend_leases(
        &self,
        tags: &[DeliveryTag],
        lease: Duration,
    ) -> Result<Vec<DeliveryTag>, TransportError> {
        // An entry that fails names a message deleted already or received again since (its
        // handle superseded): either way this consumer's lease on it is over.
        let lost = self
            .change_visibility(&receipt_handles(tags), lease)
            .await?;
        Ok(lost
            .into_iter()
            .map(|receipt_handle| DeliveryTag::Sqs { receipt_handle })
            .collect())
    }

    async fn retry_later(
        &self,
        delivery: &Delivery,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let DeliveryTag::Sqs { receipt_handle } = &delivery.tag else {
            return Err(invalid("not an SQS delivery"));
        };
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(Self::secs(delay))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn ready(&self) -> Result<(), TransportError> {
        self.approximate_backlog().await.map(drop)
    }

    async fn backlog(&self) -> Result<Backlog, TransportError> {
        self.approximate_backlog().await
    }

    fn queue_name(&self) -> &str {
        &self.url
    }
}

mod backlog;
mod batch;
mod fifo;
mod fill;
pub use fill::{CALLS_AT_ONCE, FILL_BUDGET_PER_LEASE};
mod incoming;
#[cfg(test)]
mod tests;
