//! A receive: one long poll for a first page, then the rest of the batch gathered by short
//! polls side by side, within a time budget, with what is held kept leased meanwhile.
//!
//! Every message a `ReceiveMessage` hands out is invisible for the lease from that moment, and
//! nothing acks it before its whole batch is committed. Gathered one call after another, a
//! batch of 256 took 26 round trips; at 400 ms a call (a latency spike, a far region,
//! throttling, or the emulator on a deep queue) that outlasted the 10-s lease: the first pages
//! came back before their batch committed, and workers kept receiving each other's messages
//! again (of a backlog of 500, with every call 400 ms late, two processes had 199 handled
//! after two minutes, and SQS had handed out messages again 817 times). So:
//! * **Side by side.** After a full first page, up to [`CALLS_AT_ONCE`] short polls are in
//!   flight at once, each asking for what the batch still lacks: a fill of 256 costs seven
//!   round trips, not 26. Only the first call waits (an idle consumer still makes one call per
//!   long poll); a page that comes back short means nothing more is waiting, and no further
//!   call is started.
//! * **A time budget.** No call is started once [`FILL_BUDGET_PER_LEASE`] of the lease has
//!   passed since the first page: the fill returns what it holds, so the lease comfortably covers
//!   the fill, the transaction (under the consumer's own heartbeat) and the acks, and a slow
//!   SQS makes batches smaller, not late.
//! * **Nothing held goes unprotected.** A call already in flight when the budget is spent is
//!   still awaited (what it took would otherwise be invisible for a whole lease, for nobody),
//!   and one call can take up to its timeout. So while the fill runs, the pages it holds are
//!   extended every third of the lease, like the consumer's heartbeat does for a batch being
//!   processed, whatever any call takes; the budget alone could not promise that.
//! * A call after the first that fails ends the fill with what it holds (already leased to
//!   this consumer: better processed now than stranded until the lease runs out); the next
//!   receive meets the failure again on its first call, and reports it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::SqsQueue;
use crate::lease::{heartbeat_period, report_failed, report_lost, with_lease_heartbeat};
use crate::queue::{Delivery, DeliveryTag, TransportError};

/// The most messages one `ReceiveMessage` (and one batch call) takes: SQS's limit.
pub(super) const PAGE: usize = 10;

/// How many calls of one receive, ack, give-back or heartbeat are in flight at once. Four: a
/// fill or an ack of the default batch (256, 26 calls) is seven round trips deep instead of 26
/// (2.8 s at 400 ms a call; the budget of a 10-s lease, 2.5 s, ends such a fill a page or two
/// short). More at once would save a few round trips, and hurts a service that answers one call
/// at a time: with sixteen, two processes' four workers kept 64 receives waiting on the
/// emulator, which then answered each after seconds, past the heartbeats' and receives' own
/// timeouts.
pub const CALLS_AT_ONCE: usize = 4;

/// The fill stops starting calls this fraction of the lease after its first page: a quarter,
/// so that its last calls (a round trip or two), the batch's transaction and its acks still
/// fit well inside the lease the first page was received with.
pub const FILL_BUDGET_PER_LEASE: u32 = 4;

/// What a fill holds: each message with SQS's id, in the order the pages arrived.
type Held = Mutex<Vec<(String, Delivery)>>;

impl SqsQueue {
    /// Up to `max` messages, waiting up to `wait` for the first (see the module docs).
    pub(super) async fn fill(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, TransportError> {
        let first = self.receive_once(max.min(PAGE), wait).await?;
        if first.len() < PAGE || max <= PAGE {
            return Ok(newest_receipts(first));
        }
        let budget = Instant::now() + self.lease / FILL_BUDGET_PER_LEASE;
        let held: Held = Mutex::new(first);
        let gather = self.gather(max, budget, &held);
        with_lease_heartbeat("queue", heartbeat_period(self.lease), gather, || {
            self.extend_held(&held)
        })
        .await;
        let held = held.into_inner().unwrap_or_else(PoisonError::into_inner);
        Ok(newest_receipts(held))
    }

    /// Short polls, [`CALLS_AT_ONCE`] at most in flight, until `held` has `max`, a page comes
    /// back short or a call fails, or `budget` is reached; calls in flight then are awaited.
    async fn gather(&self, max: usize, budget: Instant, held: &Held) {
        let mut in_flight = FuturesUnordered::new();
        // Messages asked for by the calls in flight.
        let mut asked = 0;
        let mut more_waiting = true;
        loop {
            let holding = lock(held).len();
            while more_waiting
                && in_flight.len() < CALLS_AT_ONCE
                && holding + asked < max
                && Instant::now() < budget
            {
                let ask = (max - holding - asked).min(PAGE);
                asked += ask;
                // Boxed, so the receive's future stays provably `Send` (as in `batch.rs`).
                let call: BoxFuture<'_, _> =
                    async move { (ask, self.receive_once(ask, Duration::ZERO).await) }.boxed();
                in_flight.push(call);
            }
            let Some((ask, page)) = in_flight.next().await else {
                return;
            };
            asked -= ask;
            match page {
                Ok(page) => {
                    more_waiting &= page.len() == ask;
                    lock(held).extend(page);
                }
                Err(error) => {
                    tracing::warn!(%error, holding, "sqs receive failed while filling a batch; processing what it holds");
                    more_waiting = false;
                }
            }
        }
    }

    /// The fill's heartbeat: the lease of every message held, from now. A message whose
    /// extension is refused was received again elsewhere after its lease lapsed (its handle
    /// superseded): it is dropped, its new holder processes it.
    async fn extend_held(&self, held: &Held) {
        let handles: Vec<String> = lock(held)
            .iter()
            .filter_map(|(_, delivery)| match &delivery.tag {
                DeliveryTag::Sqs { receipt_handle } => Some(receipt_handle.clone()),
                _ => None,
            })
            .collect();
        let handles: Vec<&str> = handles.iter().map(String::as_str).collect();
        match self.change_visibility(&handles, self.lease).await {
            Ok(lost) => {
                report_lost("queue", lost.len());
                lock(held).retain(|(_, delivery)| {
                    !matches!(&delivery.tag, DeliveryTag::Sqs { receipt_handle } if lost.contains(receipt_handle))
                });
            }
            Err(error) => report_failed("queue", &error),
        }
    }
}

/// Each message once, with its newest receipt handle: a message whose lease lapsed during a
/// fill may come back in a later page of it, and only the newest handle can delete it. Newest
/// is the higher receive count (SQS counts each receive), then the later page.
fn newest_receipts(held: Vec<(String, Delivery)>) -> Vec<Delivery> {
    let mut newest: HashMap<&str, (u32, usize)> = HashMap::with_capacity(held.len());
    for (position, (message_id, delivery)) in held.iter().enumerate() {
        let candidate = (delivery.attempts, position);
        let entry = newest.entry(message_id.as_str()).or_insert(candidate);
        *entry = (*entry).max(candidate);
    }
    let keep: Vec<bool> = held
        .iter()
        .enumerate()
        .map(|(position, (message_id, _))| newest[message_id.as_str()].1 == position)
        .collect();
    held.into_iter()
        .zip(keep)
        .filter_map(|((_, delivery), keep)| keep.then_some(delivery))
        .collect()
}

/// The held messages, whatever a panicking holder left (the list stays valid).
fn lock(held: &Held) -> MutexGuard<'_, Vec<(String, Delivery)>> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn delivery(handle: &str, attempts: u32) -> Delivery {
        Delivery {
            tag: DeliveryTag::Sqs {
                receipt_handle: handle.into(),
            },
            source: None,
            message_id: None,
            message_type: None,
            payload: Bytes::new(),
            attempts,
            enqueued_at: None,
            defect: None,
            give_up: None,
            traceparent: None,
            stripe_signature: None,
            sender_headers: crate::event::SenderHeaders::default(),
        }
    }

    fn handles(deliveries: &[Delivery]) -> Vec<String> {
        deliveries
            .iter()
            .map(|d| match &d.tag {
                DeliveryTag::Sqs { receipt_handle } => receipt_handle.clone(),
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn a_message_received_twice_in_one_fill_keeps_its_newest_receipt_handle() {
        let held = vec![
            ("m1".to_owned(), delivery("m1-first", 1)),
            ("m2".to_owned(), delivery("m2", 1)),
            // Pages arrive out of order when calls overlap: the receive count says which is newer.
            ("m1".to_owned(), delivery("m1-third", 3)),
            ("m1".to_owned(), delivery("m1-second", 2)),
            ("m3".to_owned(), delivery("m3-early", 1)),
            ("m3".to_owned(), delivery("m3-late", 1)),
        ];
        assert_eq!(
            handles(&newest_receipts(held)),
            ["m2", "m1-third", "m3-late"]
        );
    }
}
