//! The consumer's loop: the step repeated until shutdown, and what happens when a step fails.
//!
//! A failed step (the store unreachable or failing the transaction, a deadlock, an ack that did
//! not go through) has received deliveries it did not settle. Left alone they would stay with
//! this consumer until their lease ran out, or on RabbitMQ until the channel closed, which on a
//! live channel is never: after a few failures the prefetch window is full and nothing more is
//! consumed. So the loop
//! 1. gives the batch back at once: another worker or process may take it now. Deliveries the
//!    step handed to the handler are released ([`Transport::release`]) and count towards the
//!    delivery limit, which bounds a message that keeps failing its step; the others, which
//!    no handler saw (the store failed first), are given back without counting
//!    ([`Transport::give_back_unhandled`]);
//! 2. backs off (exponential with jitter, 100 ms up to 10 s), so a failing store is not
//!    hammered;
//! 3. before receiving again, waits until the store answers a ping, backing off the same way.
//!    While the store is down the loop receives nothing rather than cycle the queue's events
//!    through failed steps; what the transport holds for it is handed back meanwhile, also
//!    without counting.
//!
//! Shutdown strands nothing either (see [`Consumer::run`]): what this consumer received and did
//! not finish is given back, so after a restart it is processed at once, not after a lease.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::handling::Handed;
use super::{pipeline, Consumer, ConsumerError};
use crate::queue::{Delivery, DeliveryTag, Transport, TransportError};
use crate::retry::backoff_delay;
use crate::store::Store;

/// The longest a give-back or a store ping may take before the loop moves on (what is not
/// given back returns after its lease).
const OUTSIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// On shutdown, how long a receive in progress may still take: a database queue's claim, or
/// what SQS answers a long poll with, is then given back. An idle long poll is dropped after it.
pub const RECEIVE_DRAIN: Duration = Duration::from_secs(1);

/// [`Consumer::run`]'s loop: receive, [`pipeline::process`], and on a
/// failure give back, back off and wait for the store (see the module docs), until `shutdown`.
pub(super) async fn run(
    consumer: &Consumer,
    shutdown: CancellationToken,
    abandon: CancellationToken,
) {
    let Consumer {
        store,
        transport,
        options,
        handed,
        ..
    } = consumer;
    let transport = transport.as_ref();
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        if failures > 0 && !wait_for_store(store, transport, &shutdown, &mut failures).await {
            break;
        }
        let receive = transport.receive(options.batch_size, options.poll_interval);
        tokio::pin!(receive);
        let received = tokio::select! {
            received = &mut receive => received,
            _ = shutdown.cancelled() => {
                give_back_pending_receive(transport, handed, receive).await;
                break;
            }
        };
        let (result, deliveries) = match received {
            Ok(deliveries) => {
                let processed = tokio::select! {
                    result = pipeline::process(consumer, &deliveries) => Some(result),
                    _ = abandon.cancelled() => None,
                };
                let Some(result) = processed else {
                    let given_back = give_back(transport, handed, &deliveries).await;
                    tracing::warn!(given_back, "shutdown grace period over mid-batch; its transaction was rolled back and its deliveries given back");
                    break;
                };
                (result, deliveries)
            }
            Err(error) => (Err(ConsumerError::Transport(error)), Vec::new()),
        };
        let Err(error) = result else {
            failures = 0;
            continue;
        };
        failures = failures.saturating_add(1);
        let given_back = give_back(transport, handed, &deliveries).await;
        let delay = failure_delay(failures);
        tracing::warn!(%error, given_back, ?delay, "consumer step failed; its deliveries were given back to the transport");
        metrics::counter!("dedup_consumer_step_failures_total").increment(1);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    tracing::debug!("consumer stopped");
}

/// On shutdown: lets a receive in progress finish for up to [`RECEIVE_DRAIN`] and gives
/// back what it took. A claim cut off mid-statement would leave its messages leased
/// until the lease ran out, delaying them by that much after a restart.
async fn give_back_pending_receive(
    transport: &dyn Transport,
    handed: &Handed,
    receive: impl std::future::Future<Output = Result<Vec<Delivery>, TransportError>>,
) {
    if let Ok(Ok(deliveries)) = tokio::time::timeout(RECEIVE_DRAIN, receive).await {
        let given_back = give_back(transport, handed, &deliveries).await;
        if given_back > 0 {
            tracing::info!(given_back, "stopping: gave back what the last receive took");
        }
    }
}

fn failure_delay(failures: u32) -> Duration {
    backoff_delay(
        Duration::from_millis(100),
        Duration::from_secs(10),
        failures,
    )
}

/// Hands a failed step's deliveries back to the transport: those handed to the handler as a
/// failed delivery, the others as never handled (see the module docs); returns how many
/// were offered.
async fn give_back(transport: &dyn Transport, handed: &Handed, deliveries: &[Delivery]) -> usize {
    if deliveries.is_empty() {
        return 0;
    }
    let handed = handed.take();
    let (seen, unseen): (Vec<&Delivery>, Vec<&Delivery>) =
        deliveries.iter().partition(|d| handed.contains(&d.tag));
    let tags: Vec<DeliveryTag> = seen.iter().map(|d| d.tag.clone()).collect();
    let give_back = async {
        let released = match tags.is_empty() {
            true => Ok(()),
            false => transport.release(&tags).await,
        };
        let returned = match unseen.is_empty() {
            true => Ok(()),
            false => transport.give_back_unhandled(&unseen).await,
        };
        released.and(returned)
    };
    let failed = match tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, give_back).await {
        Ok(Ok(())) => false,
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not give deliveries back; they return after their lease");
            true
        }
        Err(_) => {
            tracing::warn!("giving deliveries back timed out; they return after their lease");
            true
        }
    };
    if failed {
        // A lease runs out by itself; a RabbitMQ delivery on a live channel has none, and
        // would hold a place in the prefetch window for good (see `give_back_failed`).
        let tags: Vec<DeliveryTag> = deliveries.iter().map(|d| d.tag.clone()).collect();
        let _ = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, transport.give_back_failed(&tags)).await;
    }
    deliveries.len()
}

/// After a failure, waits until the store answers; `false` if shutdown came first. While
/// it does not, the transport is told to hand back what it holds for this consumer
/// ([`Transport::pause_receiving`](crate::queue::Transport::pause_receiving)): other
/// processes, whose store may well answer, take it meanwhile.
async fn wait_for_store(
    store: &Store,
    transport: &dyn Transport,
    shutdown: &CancellationToken,
    failures: &mut u32,
) -> bool {
    let mut paused = false;
    loop {
        let answered = tokio::select! {
            _ = shutdown.cancelled() => return false,
            ping = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, store.ping()) => matches!(ping, Ok(Ok(()))),
        };
        if answered {
            return true;
        }
        if !paused {
            paused = true;
            tracing::warn!("the store does not answer; handing back what the transport holds for this consumer until it does");
            let _ = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, transport.pause_receiving()).await;
        }
        *failures = failures.saturating_add(1);
        let delay = failure_delay(*failures);
        tracing::debug!(?delay, "the store does not answer yet; not receiving");
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
