//! [`Sent`]: one row's delivery as its lane saw it (the sink's result, when the request left and
//! how long the answer took), and the [`AttemptMark`] its mark records in `outbox_attempts`.
//! Row-wise sinks (HTTP, SQS) time each row; the others time the batch, each row taking as
//! long as the batch did.

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::outbox::sink::{Answer, Receipt, SinkError};
use crate::store::{dedup_key, AttemptMark, OutboxRow};

/// One row's delivery.
pub(super) struct Sent {
    /// What the sink said.
    pub(super) result: Result<Receipt, SinkError>,
    /// The relay's clock when the request left.
    pub(super) started_at: DateTime<Utc>,
    /// How long the answer took.
    pub(super) took: Duration,
}

impl Sent {
    /// Runs `delivery`, timing it. (One `Sent` per row of a batch delivered at once: see
    /// [`Sent::each`].)
    pub(super) async fn timed<F>(delivery: F) -> Sent
    where
        F: Future<Output = Result<Receipt, SinkError>>,
    {
        let started_at = Utc::now();
        let started = Instant::now();
        let result = delivery.await;
        Sent {
            result,
            started_at,
            took: started.elapsed(),
        }
    }

    /// A batch's results, each row taking the batch's time.
    pub(super) async fn each<F>(delivery: F) -> Vec<Sent>
    where
        F: Future<Output = Vec<Result<Receipt, SinkError>>>,
    {
        let started_at = Utc::now();
        let started = Instant::now();
        let results = delivery.await;
        let took = started.elapsed();
        results
            .into_iter()
            .map(|result| Sent {
                result,
                started_at,
                took,
            })
            .collect()
    }

    /// A result that did not reach the sink (not sent, or the destination cannot be built).
    pub(super) fn unsent(result: Result<Receipt, SinkError>) -> Sent {
        Sent {
            result,
            started_at: Utc::now(),
            took: Duration::ZERO,
        }
    }

    /// The attempt `row`'s mark records: the receiver's status, headers and body excerpt when
    /// it answered, the sink's error when it failed.
    pub(super) fn attempt(&self, row: &OutboxRow) -> AttemptMark {
        let answer: Option<&Answer> = match &self.result {
            Ok(receipt) => receipt.answer.as_ref(),
            Err(error) => error.answer(),
        };
        AttemptMark {
            claim: row.claim(),
            event_key: dedup_key(&row.source, &row.event_id),
            attempt: row.attempts,
            started_at: self.started_at,
            duration_ms: i32::try_from(self.took.as_millis()).unwrap_or(i32::MAX),
            status: answer.and_then(|a| i16::try_from(a.status).ok()),
            error: self.result.as_ref().err().map(ToString::to_string),
            headers: answer.map(Answer::headers_json),
            body: answer
                .filter(|a| !a.body.is_empty())
                .map(|a| a.body.clone()),
            truncated: answer.is_some_and(|a| a.truncated),
        }
    }
}
