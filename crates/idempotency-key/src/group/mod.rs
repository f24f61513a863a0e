//! Group commit for the idempotency store: concurrent first claims and completions are written
//! together, so N requests cost one statement and one commit instead of 2N.
//!
//! On a small machine the ceiling of the layer is PostgreSQL's per-statement CPU (bind, execute,
//! commit, one backend wake-up per round trip), not the rows. Each request still makes at most
//! two round trips of its own (it waits for the statement holding its claim, then for the one
//! holding its completion); what is shared is the statement.
//!
//! Keys are split over `writers` partitions by a hash of `(account, key)`. A partition has one
//! writer task with at most one statement in flight; whatever arrived while it ran (claims and
//! completions alike, up to `max_batch`) goes into the next one.
//!
//! This file holds the requests' side (options, what is asked, the partitions); the writer's
//! loop is in `writer.rs`, the statement and its session settings in `statement.rs`; the
//! statement timeout and the breaker are the crate's group-commit helper's
//! (`dedup_db::group_commit`), shared with the pipeline's database queue.
//!
//! Guarantees:
//! - a grouped claim is `INSERT … ON CONFLICT DO NOTHING`: it only ever creates a key that did
//!   not exist. The same statement reads the keys it did not create, as committed when it
//!   started: a stored result that has not expired is replayed and a claim whose lease runs is
//!   answered 409, exactly as the single-row claim would. Anything else (a lease to take over,
//!   an expired key, a key another statement was writing) is left to the caller's single-row
//!   claim, which decides those cases one at a time;
//! - two requests for the same key in one statement: the primary key admits one, the other
//!   does not find the row in the statement's snapshot and goes to the single-row claim (which
//!   answers 409 or replays);
//! - a grouped completion updates only rows still holding the caller's claim token;
//! - no deadlock: claims are inserted in `(account, key)` order; a completion only locks a row
//!   still holding its own token, which nothing else locks but that request's single-row
//!   statements (extend, release) and a takeover after its lease; single-row statements never
//!   wait while holding another key; the sweeper skips locked rows. `INSERT … DO NOTHING` does
//!   wait for another transaction's uncommitted change to the same key, which delays but
//!   cannot close a cycle. One key always goes to the same partition of a store, so within a
//!   process grouped statements do not even wait on each other;
//! - no statement waits forever: after [`GroupOptions::statement_timeout`] its group fails
//!   (503, retried) and the writer reconnects, instead of every key of the partition waiting
//!   behind it;
//! - an unreachable PostgreSQL costs each waiting request at most one timeout: when a group could
//!   not reach it (connecting failed, the connection broke, the statement timed out), the
//!   writer's breaker opens and the groups that queued up meanwhile fail at once, without a
//!   statement or a connection attempt each. It stays open for a backoff that grows with each
//!   failed attempt (0.5 s up to 4 s, with jitter), then the next group tries again; the first
//!   statement that goes through closes it. A statement that failed on a live connection (the
//!   server answered) does not open it;
//! - the grouped statement has one good plan whatever the table's size or statistics: each
//!   completion found by a primary-key index probe (a nested loop over the unnested arrays).
//!   Each writer keeps a connection of its own, opened with the store's pool's connect options
//!   and set up with hash and merge joins and sequential scans disabled and the plan cached
//!   once (`plan_cache_mode = force_generic_plan`). Left to
//!   the planner, a plan made while the table was small (a sequential scan feeding a hash join)
//!   stays cached after the table has grown, and every completion then reads the whole table;
//!   planning each statement anew instead costs more PostgreSQL time than executing it;
//! - no shared fate: a statement the server refuses (a value it cannot hold, a deadlock) is
//!   not the group's answer. Each of its requests is then decided by its own single-row
//!   statement, so only a request at fault fails. A statement that could not reach the server
//!   fails every request of its group; none is ever told it succeeded.

mod statement;
mod writer;

use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::fingerprint::Fingerprint;
use super::records::{Claim, StoreError, StoredResponse};
use dedup_db::group_commit::{Committer, Names};
use statement::{group_sql, writer_settings};
use writer::{Link, Writer};

/// How statements are grouped.
#[derive(Debug, Clone, Copy)]
pub struct GroupOptions {
    /// Most claims plus completions written by one statement.
    pub max_batch: usize,
    /// Partitions of the key space, each with one writer and its own connection: how many
    /// grouped statements are in flight at once.
    pub writers: usize,
    /// Longest a grouped statement may take, connecting and waiting for another statement's
    /// uncommitted row included. It normally takes milliseconds; past this its group fails
    /// (503, retried by the client), the writer's breaker opens, and the requests queued behind
    /// it fail at once instead of each waiting as long. PostgreSQL's own `statement_timeout` on
    /// the writer's connection is set to the same value, so the server gives up a statement the
    /// writer has stopped waiting for.
    pub statement_timeout: Duration,
}

impl Default for GroupOptions {
    /// 128 rows, 2 writers: measured in BENCHMARKS.md ("Idempotency-Key layer"). Fewer,
    /// fuller statements cost PostgreSQL less than more, emptier ones; two in flight keep one
    /// being executed while the other's answers travel. A 10 s statement timeout: far above a
    /// healthy statement, well below a client's patience.
    fn default() -> Self {
        GroupOptions {
            max_batch: 128,
            writers: 2,
            statement_timeout: Duration::from_secs(10),
        }
    }
}

/// The group writers' log subject and metrics.
const COMMIT_NAMES: Names = Names {
    subject: "idempotency store",
    group_size: "idempotency_group_size",
    refused: "idempotency_group_refused_total",
};

/// A first claim for a key, to be written with others.
pub(crate) struct NewClaim {
    pub account: String,
    pub key: String,
    pub fingerprint: Fingerprint,
    pub token: Uuid,
    pub lease_ms: i64,
    pub ttl_ms: i64,
}

/// A completion, to be written with others.
pub(crate) struct NewCompletion {
    pub account: String,
    pub key: String,
    pub token: Uuid,
    pub response: StoredResponse,
}

/// `Some`: decided (created, or the stored result or running claim found); `None`: decide it
/// one at a time.
type ClaimReply = oneshot::Sender<Result<Option<Claim>, StoreError>>;
/// What a grouped completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completed {
    /// Stored; the key has `ttl_ms` left.
    Stored { ttl_ms: i64 },
    /// The claim was no longer ours: nothing written.
    Lost,
    /// Not decided: the group's statement was refused, write it on its own.
    Alone,
}

type CompletionReply = oneshot::Sender<Result<Completed, StoreError>>;

/// A claim of a group and where its answer goes.
type ClaimEntry = (NewClaim, ClaimReply);
/// A completion of a group and where its answer goes.
type CompletionEntry = (NewCompletion, CompletionReply);

/// One request to a partition's writer and where its answer goes.
enum Write {
    Claim(NewClaim, ClaimReply),
    Complete(NewCompletion, CompletionReply),
}

/// The channels to the partition writers. The writers end when this is dropped (the channels
/// close).
#[derive(Debug)]
pub(crate) struct Groups {
    /// One sender per partition, indexed by the key's hash.
    partitions: Vec<mpsc::Sender<Write>>,
}

impl Groups {
    /// Starts one writer per partition on the current runtime. Each writer connects (lazily)
    /// with `pool`'s connect options.
    pub(crate) fn start(
        pool: &PgPool,
        options: GroupOptions,
        on_statement: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let max_batch = options.max_batch.max(1);
        let connect = Arc::new(pool.connect_options().as_ref().clone());
        let sql: Arc<str> = group_sql().into();
        let settings: Arc<str> = writer_settings(options.statement_timeout).into();
        let partitions = (0..options.writers.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(max_batch);
                let writer = Writer {
                    link: Link {
                        connect: connect.clone(),
                        connection: None,
                        settings: settings.clone(),
                        sql: sql.clone(),
                        on_statement: on_statement.clone(),
                    },
                    committer: Committer::new(
                        COMMIT_NAMES,
                        options.statement_timeout,
                        StoreError::GroupTimedOut,
                    ),
                };
                tokio::spawn(writer.run(rx, max_batch));
                tx
            })
            .collect();
        Groups { partitions }
    }

    /// The same key always reaches the same partition (a fixed-seed hash).
    fn partition(&self, account: &str, key: &str) -> &mpsc::Sender<Write> {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one((account, key));
        &self.partitions[(hash % self.partitions.len() as u64) as usize]
    }

    /// Creates the key if it does not exist, or answers from the row found; `None` means
    /// "decide it one at a time".
    pub(crate) async fn claim(&self, claim: NewClaim) -> Result<Option<Claim>, StoreError> {
        let writer = self.partition(&claim.account, &claim.key);
        ask(writer, |reply| Write::Claim(claim, reply)).await
    }

    /// Stores a result, or says the claim was no longer ours, or that it must be written alone.
    pub(crate) async fn complete(
        &self,
        completion: NewCompletion,
    ) -> Result<Completed, StoreError> {
        let writer = self.partition(&completion.account, &completion.key);
        ask(writer, |reply| Write::Complete(completion, reply)).await
    }
}

/// Hands `write` (made with the reply channel) to `writer` and waits for the answer. A writer
/// that went away before answering is an error, never a success.
async fn ask<T>(
    writer: &mpsc::Sender<Write>,
    write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Write,
) -> Result<T, StoreError> {
    let (reply, answer) = oneshot::channel();
    writer
        .send(write(reply))
        .await
        .map_err(|_| StoreError::GroupClosed)?;
    answer.await.map_err(|_| StoreError::GroupClosed)?
}
