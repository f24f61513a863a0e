//! [`HandlerError`]: what a handler's failure means for its event, decided by its type.
//!
//! * **Retryable**: the event is redelivered with backoff (`consumer.retry_base` doubling up
//!   to `consumer.retry_max`), up to `consumer.max_attempts`, then dead-lettered. For what
//!   may pass: a lost connection, a deadlock, a lock timeout, a dependency down, a row that has
//!   not arrived yet (Stripe delivers out of order).
//! * **Retry after**: as retryable, but redelivered after the delay the handler names (a
//!   provider's `Retry-After`, a rate limit's reset), at most `consumer.retry_max` (the
//!   operator's bound, which every transport can hold); it still counts towards
//!   `consumer.max_attempts`.
//! * **Fatal**: dead-lettered at once, after this one attempt: the same event fails the same
//!   way every time (a malformed payload, a constraint it violates, a table that does not
//!   exist), and retrying it only delays the alert by minutes.
//!
//! Database errors are classified for you when converted with `?` (see
//! [`crate::retry::no_retry_can_cure`] for the table); any other error is classified by the
//! handler, with [`HandlerResultExt::retryable`] or [`HandlerResultExt::fatal`] on a result, or
//! [`HandlerError::retryable`] / [`HandlerError::fatal`]. A payload that does not parse
//! (`serde_json::Error`) is fatal. The error keeps its cause as its `source`, so the dead
//! letter's `error` and the log line say what happened underneath.

use std::time::Duration;

use crate::error::Cause;
use crate::store::StoreError;

/// Why a handler failed. The consumer decides what happens next from the variant.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth trying again later (a lock timeout, a dependency down): redelivered with backoff
    /// until `consumer.max_attempts`, then dead-lettered.
    #[error("retryable: {0}")]
    Retryable(#[source] Cause),
    /// Will never succeed (malformed payload, unknown account): dead-lettered at once.
    #[error("fatal: {0}")]
    Fatal(#[source] Cause),
    /// Worth trying again after `after` (capped at `consumer.retry_max`) rather than after
    /// the backoff's own delay; counts towards `consumer.max_attempts` like a retryable one.
    #[error("retry after {after:?}: {cause}")]
    RetryAfter {
        after: Duration,
        #[source]
        cause: Cause,
    },
}

impl HandlerError {
    /// A failure worth retrying, caused by `error`.
    pub fn retryable(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        HandlerError::Retryable(Cause::new(error.to_string(), error))
    }

    /// A failure no retry can cure, caused by `error`.
    pub fn fatal(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        HandlerError::Fatal(Cause::new(error.to_string(), error))
    }

    /// A failure worth retrying after `after`, caused by `error`.
    pub fn retry_after(
        after: Duration,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        HandlerError::RetryAfter {
            after,
            cause: Cause::new(error.to_string(), error),
        }
    }

    /// Whether the event is dead-lettered at once.
    pub fn is_fatal(&self) -> bool {
        matches!(self, HandlerError::Fatal(_))
    }
}

/// Classifies any error as a handler's: `client.charge(..).await.retryable()?`,
/// `serde_json::from_value(v).fatal()?`.
pub trait HandlerResultExt<T> {
    /// The error, if any, as [`HandlerError::Retryable`].
    fn retryable(self) -> Result<T, HandlerError>;
    /// The error, if any, as [`HandlerError::Fatal`].
    fn fatal(self) -> Result<T, HandlerError>;
    /// The error, if any, as [`HandlerError::RetryAfter`].
    fn retry_after(self, after: Duration) -> Result<T, HandlerError>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> HandlerResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::retryable)
    }

    fn fatal(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::fatal)
    }

    fn retry_after(self, after: Duration) -> Result<T, HandlerError> {
        self.map_err(|e| HandlerError::retry_after(after, e))
    }
}

/// Classified by [`crate::retry::no_retry_can_cure`]: a constraint violated, a table or column
/// that does not exist, bad syntax, a value the column refuses, a row that does not decode are
/// fatal; a lost connection, a deadlock, a serialization failure, a timeout, a missing row are
/// retryable.
impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        if crate::retry::no_retry_can_cure(&e) {
            HandlerError::fatal(e)
        } else {
            HandlerError::retryable(e)
        }
    }
}

/// A store call the handler made: its database error classified as above; a timeout or a
/// connection that failed is retryable.
impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        let fatal = matches!(&e, StoreError::Database(db) if crate::retry::no_retry_can_cure(db));
        if fatal {
            HandlerError::fatal(e)
        } else {
            HandlerError::retryable(e)
        }
    }
}

/// A payload that does not parse as the handler expects parses no better next time.
impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        HandlerError::fatal(e)
    }
}
