//! The direct producer: puts the plan's direct messages ([`crate::workload::Direct`]) on the
//! queues itself at their times, as other producers would: with the broker's and the queue's
//! own clients (a `basic_publish` with a confirm to the default exchange, a `SendMessage`, a row
//! in the queue table), straight to the servers, not through the fault proxies (another
//! producer's network is not ours), so only the nemesis's crashes of PostgreSQL reach it. A
//! publish that fails may have landed; it is tried again with backoff until it is confirmed
//! or the drain gives up, as the sender does, and every attempt is in the history.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_worker_core::store::{NewQueueMessage, Store};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use rand::Rng;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::Lane;
use crate::history::{History, Outcome, Record};
use crate::infra::{CALL_TIMEOUT, DATABASE_QUEUE};
use crate::plan::{Plan, Post, Shape};
use crate::sender::event_body;
use crate::workload::{eventbridge_envelope, foreign_body, Direct, DirectKind};

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub struct Producer {
    pub plan: Arc<Plan>,
    pub history: History,
    pub store: Store,
    pub amqp_url: String,
    pub rabbit_queue: String,
    pub sqs: aws_sdk_sqs::Client,
    pub sqs_queue_url: String,
    pub run_start_unix: i64,
    /// Keys confirmed so far, with the sender's (the drain waits for these at the sink).
    pub accepted: Arc<Mutex<HashSet<String>>>,
    /// The open channel to RabbitMQ, with confirms on (opened again when it closed).
    pub rabbit: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl Producer {
    /// Publishes the plan's direct messages until `stop_new`, then retries the started ones
    /// until each is confirmed or `give_up`; how many were given up.
    pub async fn run(
        self: Arc<Self>,
        stop_new: CancellationToken,
        give_up: CancellationToken,
    ) -> usize {
        let started_at = Instant::now();
        let mut tasks = JoinSet::new();
        for index in 0..self.plan.direct.len() {
            let due = started_at + Duration::from_millis(self.plan.direct[index].at_ms);
            tokio::select! {
                _ = stop_new.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            let (this, give_up) = (self.clone(), give_up.clone());
            tasks.spawn(async move { this.deliver(index, &give_up).await });
        }
        let mut abandoned = 0;
        while let Some(done) = tasks.join_next().await {
            abandoned += usize::from(!done.unwrap_or(false));
        }
        if let Some((connection, _)) = self.rabbit.lock().await.take() {
            let _ = connection.close(200, "done".into()).await;
        }
        abandoned
    }

    async fn deliver(&self, index: usize, give_up: &CancellationToken) -> bool {
        let message = &self.plan.direct[index];
        let (body, keyed_as) = self.body(message);
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1.. {
            let published = tokio::select! {
                _ = give_up.cancelled() => return false,
                published = tokio::time::timeout(CALL_TIMEOUT, self.publish(message, &body, keyed_as.as_deref())) => published,
            };
            let error = match published {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error),
                Err(_) => Some(format!("no confirm within {CALL_TIMEOUT:?}")),
            };
            self.history.record(Record::Publish {
                t: self.history.now(),
                key: message.key.clone(),
                kind: message.kind.name().to_owned(),
                lane: message.lane,
                copy: message.copy,
                attempt,
                outcome: if error.is_none() {
                    Outcome::Ok
                } else {
                    Outcome::Info
                },
                keyed_as: keyed_as.clone(),
                error: error.clone(),
            });
            if error.is_none() {
                if message.kind != DirectKind::ForeignNoId {
                    let mut accepted = self.accepted.lock().expect("accepted lock");
                    accepted.insert(message.key.clone());
                }
                return true;
            }
            let jittered = backoff.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
            tokio::select! {
                _ = give_up.cancelled() => return false,
                _ = tokio::time::sleep(jittered) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        unreachable!("the attempts never run out")
    }

    /// The bytes of a direct message, and the id the transport carries (if any).
    fn body(&self, message: &Direct) -> (Vec<u8>, Option<String>) {
        let snapshot = || {
            let event = message.event.expect("a twin names its change");
            let post = Post {
                at_ms: 0,
                event,
                shape: Shape::Snapshot,
                ingress: 0,
                copy: 0,
                at_once: true,
            };
            event_body(&self.plan, self.run_start_unix, &post)
        };
        match message.kind {
            DirectKind::EventBridge => (eventbridge_envelope(&message.key, &snapshot()), None),
            DirectKind::ThinOwnId => {
                let thin = dedup_worker_core::stripe::thin_event_beside(&snapshot())
                    .expect("a snapshot event has a thin event");
                (thin, Some(format!("{}_thin", message.key)))
            }
            DirectKind::ForeignId => (foreign_body(message), Some(message.key.clone())),
            DirectKind::ForeignBodyId | DirectKind::ForeignNoId => (foreign_body(message), None),
        }
    }

    async fn publish(&self, message: &Direct, body: &[u8], id: Option<&str>) -> Result<(), String> {
        match message.lane {
            Lane::Database => {
                let row = NewQueueMessage {
                    source: None,
                    message_id: id.map(str::to_owned),
                    message_type: None,
                    payload: body.to_vec(),
                    traceparent: None,
                    stripe_signature: None,
                    sender_headers: None,
                };
                self.store
                    .queue()
                    .enqueue(DATABASE_QUEUE, &[row])
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Lane::Rabbitmq => self.publish_rabbit(body, id).await,
            Lane::Sqs => {
                let mut request = self
                    .sqs
                    .send_message()
                    .queue_url(&self.sqs_queue_url)
                    .message_body(String::from_utf8_lossy(body));
                if let Some(id) = id {
                    let attribute = aws_sdk_sqs::types::MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(id)
                        .build()
                        .map_err(|e| e.to_string())?;
                    request = request.message_attributes("dedup-message-id", attribute);
                }
                request.send().await.map(drop).map_err(|e| format!("{e:?}"))
            }
        }
    }

    async fn publish_rabbit(&self, body: &[u8], id: Option<&str>) -> Result<(), String> {
        let mut slot = self.rabbit.lock().await;
        if !slot.as_ref().is_some_and(|(_, c)| c.status().connected()) {
            let connection = Connection::connect(&self.amqp_url, ConnectionProperties::default())
                .await
                .map_err(|e| e.to_string())?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| e.to_string())?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            *slot = Some((connection, channel));
        }
        let (_, channel) = slot.as_ref().expect("connected above");
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        let confirm = channel
            .basic_publish(
                "".into(),
                self.rabbit_queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        let acked = confirm.is_ack();
        let returned = confirm.take_message().is_some();
        if acked && !returned {
            Ok(())
        } else {
            // A nack, or returned as unroutable (the queue not declared yet): not on the queue.
            *slot = None;
            Err(format!("not confirmed (ack {acked}, returned {returned})"))
        }
    }
}
