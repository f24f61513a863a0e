//! A queue of the test's own on every transport, and the turns tests take on the SQS emulator.

use std::time::Duration;

use dedup_worker_core::store::Store;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::amqp_url;

/// How hard a test works the SQS emulator, for [`sqs_turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqsLoad {
    /// A backlog of a hundred messages or more, or traffic for tens of seconds: the emulator
    /// (moto_server, one Python process) scans the whole queue several times per
    /// `ReceiveMessage`, so two such tests at once slow each other past the bounds they check.
    Heavy,
    /// A few messages, or an idle queue: any number of these at once, but none beside a heavy
    /// one (several check SQS timings: leases of a second or two, long polls).
    Light,
}

/// The emulator's turns: heavy tests one at a time and alone, light ones together.
static SQS_EMULATOR: RwLock<()> = RwLock::const_new(());

/// A test's turn on the SQS emulator, which ends when this is dropped.
pub struct SqsTurn {
    /// A heavy test's turn: the emulator to itself.
    _alone: Option<RwLockWriteGuard<'static, ()>>,
    /// A light test's turn, shared with the other light ones.
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

/// Waits for this test's turn on the SQS emulator. All the suite's tests run in one process
/// (tests of every module at once), so each test that uses the emulator takes its turn here
/// first and holds it to its end.
pub async fn sqs_turn(load: SqsLoad) -> SqsTurn {
    match load {
        SqsLoad::Heavy => SqsTurn {
            _alone: Some(SQS_EMULATOR.write().await),
            _shared: None,
        },
        SqsLoad::Light => SqsTurn {
            _alone: None,
            _shared: Some(SQS_EMULATOR.read().await),
        },
    }
}

/// Which transport a binary test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Database,
    Rabbitmq,
    Sqs,
}

/// A queue of the test's own: a unique name, and for RabbitMQ its queues deleted afterwards.
pub struct TestQueue {
    pub transport: Transport,
    /// Queue name, or for SQS the queue URL (what `DEDUP_QUEUE` takes).
    pub name: String,
    sqs: Option<aws_sdk_sqs::Client>,
    /// RabbitMQ: the `x-delivery-limit` the binary declares the queue with (the test's own
    /// declarations must match it).
    delivery_limit: u32,
}

impl TestQueue {
    pub async fn new(transport: Transport) -> Self {
        let name = format!("dw_test_{}", uuid::Uuid::new_v4().simple());
        if transport != Transport::Sqs {
            return TestQueue {
                transport,
                name,
                sqs: None,
                delivery_limit: 20,
            };
        }
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let client = aws_sdk_sqs::Client::new(&config);
        let url = client
            .create_queue()
            .queue_name(&name)
            .send()
            .await
            .expect("create SQS queue (is moto_server running? use scripts/test.sh)")
            .queue_url()
            .expect("queue url")
            .to_owned();
        TestQueue {
            transport,
            name: url,
            sqs: Some(client),
            delivery_limit: 20,
        }
    }

    pub fn delivery_limit(&self) -> u32 {
        self.delivery_limit
    }

    /// RabbitMQ: the queue as the binary declares it with `DEDUP_TRANSPORT__DELIVERY_LIMIT`.
    pub fn with_delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// The SQS client that created the queue (SQS only).
    pub fn sqs_client(&self) -> Option<&aws_sdk_sqs::Client> {
        self.sqs.as_ref()
    }

    /// `DEDUP_TRANSPORT` value.
    pub fn kind(&self) -> &'static str {
        match self.transport {
            Transport::Database => "database",
            Transport::Rabbitmq => "rabbitmq",
            Transport::Sqs => "sqs",
        }
    }

    /// A RabbitMQ transport on this queue, declaring it (if new) with this queue's delivery
    /// limit; the caller closes it.
    pub fn rabbit(&self) -> dedup_worker_core::queue::RabbitMqQueue {
        dedup_worker_core::queue::RabbitMqQueue::new(
            amqp_url(),
            self.name.clone(),
            dedup_worker_core::queue::rabbitmq::RabbitOptions {
                prefetch: 1,
                delivery_limit: self.delivery_limit,
                retry_max: Duration::from_secs(600),
            },
        )
    }

    /// Nothing left to do: the queue is empty and no outbox row is pending. (For RabbitMQ the
    /// broker's count, read with a passive declare.)
    pub async fn drained(&self, store: &Store) -> bool {
        let outbox_pending = store
            .outbox()
            .counts()
            .await
            .map(|c| c.pending)
            .unwrap_or(i64::MAX);
        let queue_empty = match self.transport {
            Transport::Database => store
                .queue()
                .depth(&self.name)
                .await
                .map(|n| n == 0)
                .unwrap_or(false),
            Transport::Rabbitmq => {
                let rabbit = self.rabbit();
                let depth = rabbit.depth().await;
                rabbit.close().await;
                depth.map(|n| n == 0).unwrap_or(false)
            }
            Transport::Sqs => {
                use aws_sdk_sqs::types::QueueAttributeName as A;
                let Some(client) = &self.sqs else {
                    return false;
                };
                match client
                    .get_queue_attributes()
                    .queue_url(&self.name)
                    .attribute_names(A::ApproximateNumberOfMessages)
                    .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                    .send()
                    .await
                {
                    Ok(out) => out
                        .attributes()
                        .map(|a| a.values().all(|v| v == "0"))
                        .unwrap_or(false),
                    Err(_) => false,
                }
            }
        };
        queue_empty && outbox_pending == 0
    }

    pub async fn cleanup(&self) {
        if let Some(client) = &self.sqs {
            let _ = client.delete_queue().queue_url(&self.name).send().await;
        }
        if self.transport == Transport::Rabbitmq {
            let rabbit = self.rabbit();
            let _ = rabbit.delete_queues().await;
            rabbit.close().await;
        }
    }
}
