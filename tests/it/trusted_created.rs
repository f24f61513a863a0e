//! No creation time chooses where an id is looked up (issue 26, item 2; issue 36, item 2),
//! through the real binary on every transport (the database queue on both stores; RabbitMQ and
//! SQS on PostgreSQL).
//!
//! Releases before issue 36 skipped a sealed generation for an event Stripe's signature said was
//! created more than a day after the seal. A signature proves who signed, not when the change
//! happened, so now every generation is looked up for every event:
//! * an event handled, its generation sealed, then 25 hours later the same id from a foreign
//!   producer (no source, so `stripe` by `consumer.source`'s default; no signature) with a
//!   `created` after the seal: handled once; just after a seal, a foreign message whose
//!   `created` is a day ahead: handled once;
//! * an event handled, its generation sealed two days ago (the seal moved back: time travel on
//!   the database's side), then a copy re-signed by a holder of the secret with `t` and
//!   `created` now, posted to the ingress: a duplicate (before issue 36 it skipped the sealed
//!   generation and was handled again); so is a copy whose signature is an hour old, published
//!   onto the queue with the signature carried.

use std::time::Duration;

use bytes::Bytes;
use dedup_worker_core::queue::{OutgoingMessage, SqsQueue, Transport as _};
use dedup_worker_core::signature::stripe::signature_header;
use dedup_worker_core::store::{NewQueueMessage, Store};
use serde_json::json;

use crate::helpers::{
    ledger_counts, now, post_signed_until_not_503, Backend, RunningBinary, TestDb, TestQueue,
    Transport,
};

const SECRET: &str = "whsec_trusted_created";
const WINDOW: Duration = Duration::from_secs(30 * 86_400);
const DAY: i64 = 86_400;

macro_rules! on_every_transport {
    ($($name:ident),* $(,)?) => {
        mod database_sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   super::$name(super::Backend::Sqlite, super::Transport::Database).await
               } )*
        }
        mod database_postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   super::$name(super::Backend::Postgres, super::Transport::Database).await
               } )*
        }
        mod rabbitmq {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   super::$name(super::Backend::Postgres, super::Transport::Rabbitmq).await
               } )*
        }
        mod sqs {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   let _emulator = crate::helpers::sqs_turn(crate::helpers::SqsLoad::Light).await;
                   super::$name(super::Backend::Postgres, super::Transport::Sqs).await
               } )*
        }
    };
}

on_every_transport!(
    a_created_nobody_verified_never_skips_the_generation_holding_the_id,
    a_resigned_copy_after_a_seal_is_a_duplicate,
);

/// The binary, its database and queue (dropped in this order).
struct Setup {
    bin: RunningBinary,
    store: Store,
    queue: TestQueue,
    _db: TestDb,
    _work: tempfile::TempDir,
}

async fn start(backend: Backend, transport: Transport) -> Setup {
    let db = TestDb::new(backend).await;
    let queue = TestQueue::new(transport).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
        ],
        work.path(),
    );
    let store = db.store().await;
    Setup {
        bin,
        store,
        queue,
        _db: db,
        _work: work,
    }
}

/// A snapshot event, created at `created` (Unix seconds).
fn event(id: &str, created: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "created": created,
        "type": "invoice.paid",
        "data": {"object": {"id": format!("in_{id}"), "object": "invoice"}}
    }))
    .unwrap()
}

/// A message as a producer other than the ingress publishes it: no source (the consumer's
/// default, `stripe`), the key at `/id` unless `message_id` says, and `stripe_signature` as
/// given (the ingress's form: `t=…,v1=…`).
fn foreign(
    message_id: Option<&str>,
    payload: Vec<u8>,
    signature: Option<String>,
) -> OutgoingMessage {
    OutgoingMessage {
        source: None,
        message_id: message_id.map(str::to_owned),
        message_type: None,
        payload: Bytes::from(payload),
        traceparent: None,
        stripe_signature: signature,
        sender_headers: dedup_worker_core::event::SenderHeaders::default(),
    }
}

impl Setup {
    /// Posts `body`, signed now, to the ingress until it is accepted: 200 (a 503 is the right
    /// answer when the broker's confirm is late on a loaded machine, and Stripe retries it).
    async fn post(&self, body: Vec<u8>) {
        let url = self.bin.url("/webhooks/stripe");
        let response = post_signed_until_not_503(&reqwest::Client::new(), &url, SECRET, body).await;
        assert_eq!(response.status(), 200);
    }

    /// Publishes `message` onto the binary's queue, as another producer would.
    async fn publish(&self, message: OutgoingMessage) {
        match self.queue.transport {
            Transport::Database => {
                let row = NewQueueMessage {
                    source: message.source,
                    message_id: message.message_id,
                    message_type: message.message_type,
                    payload: message.payload.to_vec(),
                    traceparent: None,
                    stripe_signature: message.stripe_signature,
                    sender_headers: None,
                };
                self.store
                    .queue()
                    .enqueue(&self.queue.name, &[row])
                    .await
                    .unwrap();
            }
            Transport::Rabbitmq => {
                let producer = self.queue.rabbit();
                producer.publish(message).await.expect("publish");
                producer.close().await;
            }
            Transport::Sqs => {
                let client = self.queue.sqs_client().expect("an SQS queue").clone();
                let producer =
                    SqsQueue::with_client(client, self.queue.name.clone(), Duration::from_secs(30));
                producer.publish(message).await.expect("publish");
            }
        }
    }

    /// Waits until `deliveries` deliveries of `id` were settled, each handled (a ledger row) or
    /// recognised as a duplicate; then how many times it was handled.
    async fn handled(&self, id: &str, deliveries: i64) -> i64 {
        self.bin
            .wait_for(
                &format!("{deliveries} deliveries of {id} settled"),
                Duration::from_secs(30),
                || async {
                    // Duplicates first: one is recorded only after the delivery it repeats was
                    // committed, so the ledger read next includes that one.
                    let duplicates = self
                        .store
                        .dedup()
                        .duplicates_of("stripe", id, 100)
                        .await
                        .ok()?;
                    let handled = *ledger_counts(&self.store).await.get(id).unwrap_or(&0);
                    (handled + duplicates.count >= deliveries).then_some(handled)
                },
            )
            .await
    }

    /// Seals the current generation (slot 0: the first seal); the seal's time (Unix seconds).
    /// Tried again while the binary's own retention pass holds the ring's maintenance lock.
    async fn seal(&self) -> f64 {
        crate::helpers::wait_for("a seal", Duration::from_secs(10), || async {
            let done = self.store.dedup().seal(WINDOW).await.unwrap();
            done.sealed.then_some(())
        })
        .await;
        self.move_seal_back(0).await
    }

    /// Moves slot 0's seal `secs` seconds into the past, as if it had happened then; the seal's
    /// time (Unix seconds) after the move.
    async fn move_seal_back(&self, secs: i64) -> f64 {
        let (moved, sealed_at) = match self.store.postgres_pool() {
            Some(_) => (
                format!(
                    "UPDATE dedup_generations
                        SET sealed_at = sealed_at - make_interval(secs => {secs}) WHERE slot = 0"
                ),
                "SELECT extract(epoch FROM sealed_at)::float8 FROM dedup_generations WHERE slot = 0",
            ),
            None => (
                format!(
                    "UPDATE dedup_generations SET sealed_at = sealed_at - {secs} * 1000 WHERE slot = 0"
                ),
                "SELECT sealed_at / 1000.0 FROM dedup_generations WHERE slot = 0",
            ),
        };
        crate::helpers::db::execute(&self.store, &moved).await;
        match (self.store.postgres_pool(), self.store.sqlite_pool()) {
            (Some(pool), _) => sqlx::query_scalar(sealed_at).fetch_one(pool).await,
            (_, Some(pool)) => sqlx::query_scalar(sealed_at).fetch_one(pool).await,
            (None, None) => unreachable!(),
        }
        .unwrap()
    }

    async fn cleanup(self) {
        drop(self.bin);
        self.queue.cleanup().await;
    }
}

async fn a_created_nobody_verified_never_skips_the_generation_holding_the_id(
    backend: Backend,
    transport: Transport,
) {
    let setup = start(backend, transport).await;
    for id in ["evt_ahead", "evt_later"] {
        setup.post(event(id, now())).await;
        assert_eq!(setup.handled(id, 1).await, 1);
    }
    let sealed_at = setup.seal().await;

    // Just after the seal, a foreign copy of evt_ahead created a day after the seal: a day
    // ahead of every clock here. (Published once this clock has passed the seal's second, as
    // a copy created "a day ahead" of it.)
    let created = sealed_at.ceil() as i64 + DAY;
    crate::helpers::wait_for(
        "the clock past the seal",
        Duration::from_secs(5),
        || async { (now() as f64 >= sealed_at.ceil()).then_some(()) },
    )
    .await;
    let ahead =
        json!({"id": "evt_ahead", "object": "event", "type": "invoice.paid", "created": created});
    setup
        .publish(foreign(None, serde_json::to_vec(&ahead).unwrap(), None))
        .await;
    assert_eq!(
        setup.handled("evt_ahead", 2).await,
        1,
        "a created a day ahead, unsigned, is looked up in the sealed generation"
    );

    // 25 hours later (the seal moved back), a foreign producer's copy of evt_later stamped
    // with the time it republished it.
    setup.move_seal_back(25 * 3_600).await;
    let later =
        json!({"id": "evt_later", "object": "event", "type": "invoice.paid", "created": now()});
    setup
        .publish(foreign(None, serde_json::to_vec(&later).unwrap(), None))
        .await;
    assert_eq!(
        setup.handled("evt_later", 2).await,
        1,
        "a created after the seal, unsigned, is looked up in the sealed generation"
    );
    setup.cleanup().await;
}

async fn a_resigned_copy_after_a_seal_is_a_duplicate(backend: Backend, transport: Transport) {
    let setup = start(backend, transport).await;
    for id in ["evt_resigned", "evt_waited"] {
        setup.post(event(id, now() - 60)).await;
        assert_eq!(setup.handled(id, 1).await, 1);
    }
    setup.seal().await;
    setup.move_seal_back(2 * DAY).await;

    // A holder of the secret re-signs evt_resigned with `t` and `created` now: the ingress
    // accepts it (its signature is fresh and genuine), and the consumer finds the id in the
    // generation sealed two days ago.
    setup.post(event("evt_resigned", now())).await;
    assert_eq!(
        setup.handled("evt_resigned", 2).await,
        1,
        "a copy re-signed with a later created is looked up in the sealed generation"
    );
    // A copy signed an hour ago, created just before, waiting in the queue since.
    let hour_ago = now() - 3_600;
    let body = event("evt_waited", hour_ago - 5);
    let carried = signature_header(SECRET, hour_ago, &body);
    let mut waited = foreign(None, body, Some(carried));
    waited.source = Some("stripe".into());
    setup.publish(waited).await;
    assert_eq!(
        setup.handled("evt_waited", 2).await,
        1,
        "a copy whose signature is genuine is looked up in the sealed generation too"
    );
    setup.cleanup().await;
}
