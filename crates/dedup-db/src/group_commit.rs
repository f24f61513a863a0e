//! What every group-commit writer does around its statement: bound it in time, and stop trying
//! while the database cannot be reached.
//!
//! A group-commit writer (the database queue's ingress writers, the idempotency store's
//! partition writers) takes whatever requests are waiting and writes them as one statement, so
//! one statement's fate is many requests'. Two things then matter more than for a lone
//! statement, and both writers get them from here:
//! - no statement waits forever: past the statement timeout its group fails (the callers answer
//!   503 and their clients retry) instead of every request queued behind it waiting as well.
//!   Whether a timed-out statement took effect is unknown, so it is never reported as a success;
//! - an unreachable database costs each waiting request at most one timeout: when a group could
//!   not reach it (connecting failed, the connection broke, the statement timed out), the
//!   breaker opens and the groups that queue up meanwhile fail at once with that error, without
//!   a statement or a connection attempt each. It stays open for a backoff that grows with each
//!   failed attempt (0.5 s up to 4 s, with jitter), then the next group tries again; the first
//!   statement that goes through closes it. A statement that failed with the server answering
//!   (a value it cannot hold, a deadlock) does not open it: the server is there, and only the
//!   writer knows whether splitting the group helps.
//!
//! Writers that share one channel (and so one database path) share one [`Committer`], so that
//! the first success after an outage closes the breaker for all of them; writers with a
//! connection each keep one each. Statements that were already in flight when the breaker opened
//! and fail after it are the same outage, not further attempts: they do not lengthen the
//! backoff.
//!
//! Below every pipeline stage: it knows `sqlx`'s error kinds and [`crate::backoff`]'s backoff,
//! nothing of queues or keys.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::backoff_delay;

/// How long the breaker stays open after the first failure to reach the database; doubled
/// (with jitter) for each further failed attempt.
const BREAKER_FIRST_OPEN: Duration = Duration::from_millis(500);
/// The longest it stays open (before jitter): how long, at most, requests keep being refused
/// after the database is back.
const BREAKER_MAX_OPEN: Duration = Duration::from_secs(4);

/// Why a group's statement did not go through, as the writer tells it.
#[derive(Debug)]
pub enum WriteFailure<E> {
    /// The database could not be reached: connecting failed or the connection broke. Opens the
    /// breaker.
    Unreachable(E),
    /// The statement failed with the server answering (see [`server_answered`]).
    Statement(E),
}

/// What became of one group.
#[derive(Debug)]
pub enum Committed<T, E> {
    /// The statement went through.
    Written(T),
    /// Not tried: the breaker is open. Fail the group with the error that opened it.
    Refused(Arc<E>),
    /// The database could not be reached, or the statement outlived its timeout; the breaker
    /// is now open. Fail the group.
    Unreachable(Arc<E>),
    /// The server answered with an error: fail the group, or split it if a request's own
    /// values may be at fault.
    Failed(E),
}

/// Whether the server itself answered with this error (a constraint, a value it cannot hold, a
/// deadlock, a cancelled statement), as opposed to not being reached at all (I/O, TLS, protocol,
/// no pool connection in time).
pub fn server_answered(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(_))
}

/// The names a writer's logs and metrics use.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// What cannot be reached, in log lines: "idempotency store", "database queue".
    pub subject: &'static str,
    /// Histogram of the requests in each group tried.
    pub group_size: &'static str,
    /// Counter of the groups refused while the breaker was open.
    pub refused: &'static str,
}

/// Runs a writer's grouped statements under a timeout and a breaker. Cheap to clone: clones
/// share the breaker.
#[derive(Debug)]
pub struct Committer<E> {
    shared: Arc<Shared<E>>,
}

impl<E> Clone for Committer<E> {
    fn clone(&self) -> Self {
        Committer {
            shared: self.shared.clone(),
        }
    }
}

#[derive(Debug)]
struct Shared<E> {
    names: Names,
    statement_timeout: Duration,
    /// The error a group that outlived `statement_timeout` fails with.
    timed_out: fn(Duration) -> E,
    breaker: Mutex<Breaker<E>>,
}

/// The breaker's state. Locked only to read or update it, never across a statement.
#[derive(Debug)]
struct Breaker<E> {
    /// Attempts in a row that could not reach the database: sets how long it stays open.
    failures: u32,
    /// Since the last failure to reach the database, until the next success.
    open: Option<Open<E>>,
}

/// An open breaker.
#[derive(Debug)]
struct Open<E> {
    /// When it opened: attempts started before then belong to the failure that opened it.
    since: Instant,
    /// Until when groups are refused.
    until: Instant,
    /// The error that opened it: what each refused group is told.
    error: Arc<E>,
}

impl<E: Display> Committer<E> {
    /// A closed breaker; each statement bounded by `statement_timeout`, past which its group
    /// fails with `timed_out(statement_timeout)`.
    pub fn new(names: Names, statement_timeout: Duration, timed_out: fn(Duration) -> E) -> Self {
        Committer {
            shared: Arc::new(Shared {
                names,
                statement_timeout,
                timed_out,
                breaker: Mutex::new(Breaker {
                    failures: 0,
                    open: None,
                }),
            }),
        }
    }

    /// Writes a group of `size` requests with `write`, unless the breaker is open.
    pub async fn commit<T>(
        &self,
        size: usize,
        write: impl Future<Output = Result<T, WriteFailure<E>>>,
    ) -> Committed<T, E> {
        let shared = &*self.shared;
        if let Some(error) = self.refusal() {
            metrics::counter!(shared.names.refused).increment(1);
            return Committed::Refused(error);
        }
        metrics::histogram!(shared.names.group_size).record(size as f64);
        let started = Instant::now();
        let written = tokio::time::timeout(shared.statement_timeout, write)
            .await
            .unwrap_or_else(|_| {
                Err(WriteFailure::Unreachable((shared.timed_out)(
                    shared.statement_timeout,
                )))
            });
        match written {
            Ok(value) => {
                self.reached();
                Committed::Written(value)
            }
            Err(WriteFailure::Statement(error)) => {
                self.reached();
                Committed::Failed(error)
            }
            Err(WriteFailure::Unreachable(error)) => {
                let error = Arc::new(error);
                self.unreachable(error.clone(), started);
                Committed::Unreachable(error)
            }
        }
    }

    /// The breaker's state. Any state a panicking writer could leave it in is a valid one (at
    /// worst a failure counted without the breaker opened), so a poisoned lock is used as it is.
    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker<E>> {
        self.shared
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The error to fail a group with instead of trying, while open.
    fn refusal(&self) -> Option<Arc<E>> {
        match &self.breaker().open {
            Some(open) if Instant::now() < open.until => Some(open.error.clone()),
            _ => None,
        }
    }

    /// A statement went through, or failed with the server answering: the database is
    /// reachable.
    fn reached(&self) {
        let mut breaker = self.breaker();
        if breaker.failures > 0 {
            tracing::info!(
                failed_attempts = breaker.failures,
                "{} reachable again",
                self.shared.names.subject
            );
        }
        breaker.failures = 0;
        breaker.open = None;
    }

    /// An attempt that started at `started` could not reach the database: open for the next
    /// backoff, unless it was already in flight when the breaker last opened.
    fn unreachable(&self, error: Arc<E>, started: Instant) {
        let mut breaker = self.breaker();
        if matches!(&breaker.open, Some(open) if started < open.since) {
            return;
        }
        breaker.failures = breaker.failures.saturating_add(1);
        let wait = backoff_delay(BREAKER_FIRST_OPEN, BREAKER_MAX_OPEN, breaker.failures);
        tracing::warn!(
            %error,
            failed_attempts = breaker.failures,
            open_for_ms = wait.as_millis() as u64,
            "{} unreachable; failing grouped requests at once until the next attempt",
            self.shared.names.subject
        );
        let now = Instant::now();
        breaker.open = Some(Open {
            since: now,
            until: now + wait,
            error,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Down(&'static str);

    impl Display for Down {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    fn committer(timeout: Duration) -> Committer<Down> {
        let names = Names {
            subject: "test store",
            group_size: "test_group_size",
            refused: "test_group_refused_total",
        };
        Committer::new(names, timeout, |_| Down("timed out"))
    }

    #[tokio::test]
    async fn an_unreachable_database_opens_the_breaker_and_a_success_closes_it() {
        let commit = committer(Duration::from_secs(1));
        let failed = commit
            .commit(3, async {
                Err::<(), _>(WriteFailure::Unreachable(Down("refused")))
            })
            .await;
        assert!(matches!(failed, Committed::Unreachable(e) if *e == Down("refused")));
        // Shared by clones: another writer of the same channel is refused too, untried.
        let other = commit.clone();
        let refused = other
            .commit(1, async {
                Err::<(), _>(WriteFailure::Statement(Down("tried")))
            })
            .await;
        assert!(matches!(refused, Committed::Refused(e) if *e == Down("refused")));
        // The first failure opens it for the base backoff, at most doubled by jitter.
        tokio::time::sleep(BREAKER_FIRST_OPEN * 2 + Duration::from_millis(50)).await;
        let written = other
            .commit(1, async { Ok::<_, WriteFailure<Down>>(7) })
            .await;
        assert!(matches!(written, Committed::Written(7)));
        assert!(commit.refusal().is_none());
    }

    #[tokio::test]
    async fn a_statement_past_its_timeout_fails_as_unreachable() {
        let commit = committer(Duration::from_millis(20));
        let stuck = commit
            .commit(1, std::future::pending::<Result<(), WriteFailure<Down>>>())
            .await;
        assert!(matches!(stuck, Committed::Unreachable(e) if *e == Down("timed out")));
        assert!(commit.refusal().is_some());
    }

    #[tokio::test]
    async fn statements_in_flight_when_it_opened_do_not_lengthen_the_backoff() {
        let commit = committer(Duration::from_millis(50));
        let stuck = || commit.commit(1, std::future::pending::<Result<(), WriteFailure<Down>>>());
        let (a, b, c) = tokio::join!(stuck(), stuck(), stuck());
        for failed in [a, b, c] {
            assert!(matches!(failed, Committed::Unreachable(_)));
        }
        assert_eq!(commit.breaker().failures, 1);
    }

    #[tokio::test]
    async fn a_statement_the_server_refused_leaves_the_breaker_closed() {
        let commit = committer(Duration::from_secs(1));
        let failed = commit
            .commit(2, async {
                Err::<(), _>(WriteFailure::Statement(Down("22P05")))
            })
            .await;
        assert!(matches!(failed, Committed::Failed(Down("22P05"))));
        assert!(commit.refusal().is_none());
    }
}
