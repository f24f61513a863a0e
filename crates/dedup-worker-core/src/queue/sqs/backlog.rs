//! The SQS queue's backlog for the `dedup_queue_depth` gauge, and `/readyz`'s check: one
//! `GetQueueAttributes` call (bounded like every call of the client).
//!
//! Only `ApproximateNumberOfMessages` (the visible messages) is read. The age of the oldest
//! message, `ApproximateAgeOfOldestMessage`, is a CloudWatch metric, not a queue attribute: it
//! would take another service, its credentials and its minute-long resolution, so no age is
//! exported for SQS (alert on CloudWatch's own metric for that).

use aws_sdk_sqs::types::QueueAttributeName;

use super::{unavailable, SqsQueue};
use crate::queue::{Backlog, TransportError};

impl SqsQueue {
    pub(super) async fn approximate_backlog(&self) -> Result<Backlog, TransportError> {
        let attribute = QueueAttributeName::ApproximateNumberOfMessages;
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(attribute.clone())
            .send()
            .await
            .map_err(unavailable)?;
        // An answer without the attribute, or not a number, is an unknown depth, not 0.
        let depth = answer
            .attributes()
            .and_then(|attributes| attributes.get(&attribute))
            .and_then(|value| value.parse::<u64>().ok());
        Ok(Backlog {
            depth,
            oldest_age: None,
        })
    }
}
