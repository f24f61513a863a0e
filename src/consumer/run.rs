//! The consumer's loop: the step repeated until shutdown, and what happens when a step fails.
//!
//! A failed step (the store unreachable or failing the transaction, a deadlock, an ack that did
//! not go through) has received deliveries it did not settle. Left alone they would stay with
//! this consumer until their lease ran out, or on RabbitMQ until the channel closed, which on a
//! live channel is never: after a few failures the prefetch window is full and nothing more is
//! consumed. So the loop
//! 1. gives the batch back at once ([`Transport::release`]): another worker or process may take
//!    it now;
//! 2. backs off (exponential with jitter, 100 ms up to 10 s), so a failing store is not
//!    hammered;
//! 3. before receiving again, waits until the store answers a ping, backing off the same way.
//!    Each delivery that cycles through a failed step counts towards its redelivery limit
//!    (RabbitMQ's `x-delivery-limit`), so while the store is down the loop receives nothing
//!    rather than cycling valid events towards the broker's dead letters.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Consumer, ConsumerError};
use crate::queue::{Delivery, DeliveryTag};
use crate::retry::backoff_delay;

/// The longest a give-back or a store ping may take before the loop moves on (what is not
/// given back returns after its lease).
const OUTSIDE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Consumer {
    /// Repeats receive-and-process until `shutdown`. Waiting for messages is interrupted by
    /// shutdown; a batch already received is finished, committed and acked before returning.
    /// (A claim interrupted mid-statement leaves its messages leased: they come back after
    /// `consumer.lease_secs`.)
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failures = 0u32;
        loop {
            if failures > 0 && !self.wait_for_store(&shutdown, &mut failures).await {
                break;
            }
            let received = tokio::select! {
                _ = shutdown.cancelled() => break,
                received = self.transport.receive(self.options.batch_size, self.options.poll_interval) => received,
            };
            let (result, deliveries) = match received {
                Ok(deliveries) => (self.process(&deliveries).await, deliveries),
                Err(error) => (Err(ConsumerError::Transport(error)), Vec::new()),
            };
            let Err(error) = result else {
                failures = 0;
                continue;
            };
            failures = failures.saturating_add(1);
            let given_back = self.give_back(&deliveries).await;
            let delay = Self::failure_delay(failures);
            tracing::warn!(%error, given_back, ?delay, "consumer step failed; its deliveries were given back to the transport");
            metrics::counter!("dedup_consumer_step_failures_total").increment(1);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        tracing::debug!("consumer stopped");
    }

    fn failure_delay(failures: u32) -> Duration {
        backoff_delay(
            Duration::from_millis(100),
            Duration::from_secs(10),
            failures,
        )
    }

    /// Hands a failed step's deliveries back to the transport; returns how many were offered.
    async fn give_back(&self, deliveries: &[Delivery]) -> usize {
        if deliveries.is_empty() {
            return 0;
        }
        let tags: Vec<DeliveryTag> = deliveries.iter().map(|d| d.tag.clone()).collect();
        match tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, self.transport.release(&tags)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not give deliveries back; they return after their lease")
            }
            Err(_) => {
                tracing::warn!("giving deliveries back timed out; they return after their lease")
            }
        }
        tags.len()
    }

    /// After a failure, waits until the store answers; `false` if shutdown came first.
    async fn wait_for_store(&self, shutdown: &CancellationToken, failures: &mut u32) -> bool {
        loop {
            let answered = tokio::select! {
                _ = shutdown.cancelled() => return false,
                ping = tokio::time::timeout(OUTSIDE_CALL_TIMEOUT, self.store.ping()) => matches!(ping, Ok(Ok(()))),
            };
            if answered {
                return true;
            }
            *failures = failures.saturating_add(1);
            let delay = Self::failure_delay(*failures);
            tracing::debug!(?delay, "the store does not answer yet; not receiving");
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
