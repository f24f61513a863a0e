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

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::types::Json;
use sqlx::{Connection, Executor, PgConnection, PgPool, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use super::fingerprint::Fingerprint;
use super::records::{decode_existing, Claim, ClaimToken, StoreError, StoredResponse};
use crate::retry::backoff_delay;

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

// `$1..$6`: the claims, inserted in `(account, key)` order: whatever this statement waits on
// (another statement's uncommitted row for one of its keys), it waits for in a fixed order.
const CLAIMS_CTE: &str = r#"
claimed AS (
    INSERT INTO idempotency_keys AS k
        (account, key, fingerprint, status, claim_token, locked_until, created_at, expires_at)
    SELECT u.account, u.key, u.fingerprint, 'in_progress', u.token,
           now() + u.lease_ms * interval '1 millisecond', now(),
           now() + u.ttl_ms * interval '1 millisecond'
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], $5::int8[], $6::int8[])
         AS u(account, key, fingerprint, token, lease_ms, ttl_ms)
    ORDER BY u.account, u.key
    ON CONFLICT (account, key) DO NOTHING
    RETURNING k.claim_token
)"#;

// `$7..$12`: the completions.
const COMPLETIONS_CTE: &str = r#"
completed AS (
    UPDATE idempotency_keys AS k
       SET status = 'completed', claim_token = NULL, locked_until = NULL,
           response_status = u.status, response_headers = u.headers, response_body = u.body
      FROM unnest($7::text[], $8::text[], $9::uuid[], $10::int2[], $11::jsonb[], $12::bytea[])
           AS u(account, key, token, status, headers, body)
     WHERE k.account = u.account AND k.key = u.key AND k.claim_token = u.token
       AND k.status = 'in_progress'
    RETURNING u.token,
              GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint AS ttl_ms
)"#;

// `$1, $2, $4`: the claimed keys that existed when the statement started and can be answered
// without a takeover: a stored result that has not expired, a claim whose lease runs.
const FOUND_CTE: &str = r#"
found AS (
    SELECT u.token, k.fingerprint, k.status,
           GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::bigint AS lease_ms,
           GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint AS ttl_ms,
           k.response_status, k.response_headers, k.response_body
      FROM unnest($1::text[], $2::text[], $4::uuid[]) AS u(account, key, token)
      JOIN idempotency_keys AS k ON k.account = u.account AND k.key = u.key
     WHERE (k.status = 'completed' AND k.expires_at > now())
        OR (k.status = 'in_progress' AND k.locked_until > now())
)"#;

/// One statement for both kinds; either array set may be empty. Rows, by `kind`: `created`
/// (a claim's token), `completed` (a completion's token and `ttl_ms`), `found` (a claim's
/// token and the row it found).
fn group_sql() -> String {
    format!(
        "WITH {CLAIMS_CTE},{COMPLETIONS_CTE},{FOUND_CTE}\n\
         SELECT 'created' AS kind, claim_token AS token, NULL::bigint AS ttl_ms,\n\
                NULL::bytea AS fingerprint, NULL::text AS status, NULL::bigint AS lease_ms,\n\
                NULL::int2 AS response_status, NULL::jsonb AS response_headers,\n\
                NULL::bytea AS response_body\n\
           FROM claimed\n\
         UNION ALL SELECT 'completed', token, ttl_ms, NULL, NULL, NULL, NULL, NULL, NULL\n\
           FROM completed\n\
         UNION ALL SELECT 'found', token, ttl_ms, fingerprint, status, lease_ms,\n\
                response_status, response_headers, response_body\n\
           FROM found"
    )
}

/// Session settings of a writer's connection, set once after it connects (see the module's
/// guarantees): the only plan left is a nested loop of primary-key probes, made once and
/// reused; the statement runs at READ COMMITTED whatever the server's default (the `found`
/// read and `DO NOTHING` rely on it). [`writer_settings`] adds the statement timeout.
const WRITER_SETTINGS: &str = "SET plan_cache_mode = force_generic_plan; \
     SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; \
     SET default_transaction_isolation = 'read committed'";

/// [`WRITER_SETTINGS`], and PostgreSQL's own `statement_timeout` at the writer's: the server
/// gives up a statement the writer has stopped waiting for.
fn writer_settings(statement_timeout: Duration) -> String {
    format!(
        "{WRITER_SETTINGS}; SET statement_timeout = {}",
        statement_timeout.as_millis().max(1)
    )
}

/// How long a writer's breaker stays open after the first failure to reach PostgreSQL; doubled
/// (with jitter) for each further failed attempt.
const BREAKER_FIRST_OPEN: Duration = Duration::from_millis(500);
/// The longest it stays open (before jitter): how long, at most, requests keep being refused
/// after PostgreSQL is back.
const BREAKER_MAX_OPEN: Duration = Duration::from_secs(4);

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
                    connect: connect.clone(),
                    connection: None,
                    settings: settings.clone(),
                    sql: sql.clone(),
                    on_statement: on_statement.clone(),
                    statement_timeout: options.statement_timeout,
                    breaker: Breaker::default(),
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

/// One partition's writer.
struct Writer {
    /// How to connect (the store's pool's options).
    connect: Arc<PgConnectOptions>,
    /// A connection of its own, kept across statements: a pooled connection would add a ping
    /// on every release and acquire, two round trips in front of each statement. Dropped on
    /// any error and opened again for the next group.
    connection: Option<PgConnection>,
    /// [`writer_settings`], run on each new connection.
    settings: Arc<str>,
    /// The grouped statement.
    sql: Arc<str>,
    /// Counts statements (the store's `query_count`).
    on_statement: Arc<dyn Fn() + Send + Sync>,
    /// [`GroupOptions::statement_timeout`].
    statement_timeout: Duration,
    /// Fails groups at once while PostgreSQL could not be reached lately.
    breaker: Breaker,
}

/// Why a group's statement did not go through.
enum WriteFailure {
    /// PostgreSQL could not be reached: connecting failed, the connection broke, or the
    /// statement outlived its timeout. Opens the breaker.
    Unreachable(StoreError),
    /// The statement failed on a live connection (the server answered).
    Statement(StoreError),
}

/// A writer's circuit breaker. While PostgreSQL cannot be reached, each attempt costs up to a
/// statement timeout (a host that stopped answering) and every group queued behind it would
/// wait as long again; while open, those groups are told at once.
#[derive(Default)]
struct Breaker {
    /// Attempts in a row that could not reach PostgreSQL: sets how long it stays open.
    failures: u32,
    /// While open: until when, and the error that opened it (what each refused group is told).
    open: Option<(Instant, Arc<StoreError>)>,
}

impl Breaker {
    /// The error to fail a group with instead of trying, while open.
    fn refusal(&self) -> Option<Arc<StoreError>> {
        match &self.open {
            Some((until, error)) if Instant::now() < *until => Some(error.clone()),
            _ => None,
        }
    }

    /// A statement went through, or failed with the server answering: PostgreSQL is reachable.
    fn reached(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                failed_attempts = self.failures,
                "idempotency store reachable again"
            );
        }
        self.failures = 0;
        self.open = None;
    }

    /// An attempt could not reach PostgreSQL: open for the next backoff.
    fn unreachable(&mut self, error: Arc<StoreError>) {
        self.failures = self.failures.saturating_add(1);
        let wait = backoff_delay(BREAKER_FIRST_OPEN, BREAKER_MAX_OPEN, self.failures);
        tracing::warn!(
            %error,
            failed_attempts = self.failures,
            open_for_ms = wait.as_millis() as u64,
            "idempotency store unreachable; failing grouped requests at once until the next attempt"
        );
        self.open = Some((Instant::now() + wait, error));
    }
}

impl Writer {
    /// Takes whatever is waiting (up to `max_batch`), writes it as one statement, answers
    /// everyone; repeats until the channel closes. A writer that goes away before answering
    /// (runtime shutdown) drops the replies, which callers see as an error, never as a success.
    async fn run(mut self, mut rx: mpsc::Receiver<Write>, max_batch: usize) {
        let mut group = Vec::with_capacity(max_batch);
        loop {
            if rx.recv_many(&mut group, max_batch).await == 0 {
                return;
            }
            linger(&mut rx, &mut group, max_batch).await;
            let mut claims = Vec::new();
            let mut completions = Vec::new();
            for write in group.drain(..) {
                match write {
                    Write::Claim(claim, reply) => claims.push((claim, reply)),
                    Write::Complete(completion, reply) => completions.push((completion, reply)),
                }
            }
            if let Some(error) = self.breaker.refusal() {
                metrics::counter!("idempotency_group_refused_total").increment(1);
                fail(claims, completions, error);
                continue;
            }
            metrics::histogram!("idempotency_group_size")
                .record((claims.len() + completions.len()) as f64);
            let written =
                tokio::time::timeout(self.statement_timeout, self.write(&claims, &completions))
                    .await
                    .unwrap_or_else(|_| {
                        Err(WriteFailure::Unreachable(StoreError::GroupTimedOut(
                            self.statement_timeout,
                        )))
                    });
            match written {
                Ok(rows) => {
                    self.breaker.reached();
                    answer(claims, completions, rows);
                }
                Err(failure) => {
                    self.connection = None;
                    let error = match failure {
                        WriteFailure::Unreachable(error) => {
                            let error = Arc::new(error);
                            self.breaker.unreachable(error.clone());
                            error
                        }
                        // The server refused the statement (one request's values it cannot
                        // hold, a deadlock): no request of a group shares another's fate, so
                        // each is decided by its own single-row statement, and only the one at
                        // fault fails.
                        WriteFailure::Statement(error) if claims.len() + completions.len() > 1 => {
                            self.breaker.reached();
                            tracing::warn!(%error, size = claims.len() + completions.len(), "grouped idempotency statement refused; writing its requests one at a time");
                            metrics::counter!("idempotency_group_split_total").increment(1);
                            split(claims, completions);
                            continue;
                        }
                        WriteFailure::Statement(error) => {
                            self.breaker.reached();
                            Arc::new(error)
                        }
                    };
                    fail(claims, completions, error);
                }
            }
        }
    }

    /// Runs one grouped statement, connecting first if needed.
    async fn write(
        &mut self,
        claims: &[(NewClaim, ClaimReply)],
        completions: &[(NewCompletion, CompletionReply)],
    ) -> Result<Vec<PgRow>, WriteFailure> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => {
                let unreachable = |e: sqlx::Error| WriteFailure::Unreachable(e.into());
                let mut connection = PgConnection::connect_with(&self.connect)
                    .await
                    .map_err(unreachable)?;
                connection
                    .execute(&*self.settings)
                    .await
                    .map_err(unreachable)?;
                self.connection.insert(connection)
            }
        };
        (self.on_statement)();
        connection
            .fetch_all(group_query(&self.sql, claims, completions))
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(_) => WriteFailure::Statement(e.into()),
                // I/O, TLS, protocol: the connection broke under the statement.
                _ => WriteFailure::Unreachable(e.into()),
            })
    }
}

/// Most times a writer yields to collect more of its group before writing it.
const MAX_LINGER_YIELDS: usize = 8;

/// Lets the tasks that the last answers woke (queued behind this writer on the runtime) run
/// first, and takes what they send: their next claims and completions then join this statement
/// instead of waiting a whole statement for the next one. Yields again only while that brings
/// more, so an idle writer adds one yield of latency and a busy one writes fuller statements.
async fn linger(rx: &mut mpsc::Receiver<Write>, group: &mut Vec<Write>, max_batch: usize) {
    for _ in 0..MAX_LINGER_YIELDS {
        if group.len() >= max_batch {
            return;
        }
        tokio::task::yield_now().await;
        let before = group.len();
        while group.len() < max_batch {
            match rx.try_recv() {
                Ok(write) => group.push(write),
                Err(_) => break,
            }
        }
        if group.len() == before {
            return;
        }
    }
}

/// The grouped statement with its arrays bound.
fn group_query<'q>(
    sql: &'q str,
    claims: &'q [(NewClaim, ClaimReply)],
    completions: &'q [(NewCompletion, CompletionReply)],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let claims = claims.iter().map(|(c, _)| c);
    let completions = completions.iter().map(|(c, _)| c);
    sqlx::query(sql)
        .bind(
            claims
                .clone()
                .map(|c| c.account.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(claims.clone().map(|c| c.key.as_str()).collect::<Vec<_>>())
        .bind(
            claims
                .clone()
                .map(|c| &c.fingerprint.0[..])
                .collect::<Vec<_>>(),
        )
        .bind(claims.clone().map(|c| c.token).collect::<Vec<_>>())
        .bind(claims.clone().map(|c| c.lease_ms).collect::<Vec<_>>())
        .bind(claims.map(|c| c.ttl_ms).collect::<Vec<_>>())
        .bind(
            completions
                .clone()
                .map(|c| c.account.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .clone()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(completions.clone().map(|c| c.token).collect::<Vec<_>>())
        .bind(
            completions
                .clone()
                .map(|c| c.response.status as i16)
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .clone()
                .map(|c| Json(&c.response.headers))
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .map(|c| &c.response.body[..])
                .collect::<Vec<_>>(),
        )
}

/// Tells each member of a group what the statement did for it. Tokens are unique per request,
/// so a returned token identifies exactly one claim or completion. A key created by this
/// statement wins over the row found for it: that row was deleted (released) after the
/// statement started.
fn answer(
    claims: Vec<(NewClaim, ClaimReply)>,
    completions: Vec<(NewCompletion, CompletionReply)>,
    rows: Vec<PgRow>,
) {
    let mut created = HashSet::with_capacity(claims.len());
    let mut found = HashMap::new();
    let mut stored = HashMap::with_capacity(completions.len());
    for row in &rows {
        let decoded = (|| -> Result<(), StoreError> {
            let token: Uuid = row.try_get("token")?;
            match row.try_get::<&str, _>("kind")? {
                "created" => {
                    created.insert(token);
                }
                "completed" => {
                    stored.insert(token, row.try_get::<i64, _>("ttl_ms")?);
                }
                _ => match decode_existing(row) {
                    Ok(claim) => {
                        found.insert(token, claim);
                    }
                    // Only this claim is undecided: the single-row claim reads the row again
                    // and reports the error to this request alone.
                    Err(error) => tracing::warn!(%error, "idempotency key row unreadable"),
                },
            }
            Ok(())
        })();
        if let Err(error) = decoded {
            return fail(claims, completions, Arc::new(error));
        }
    }
    for (claim, reply) in claims {
        let decided = if created.contains(&claim.token) {
            Some(Claim::Acquired(ClaimToken(claim.token)))
        } else {
            found.remove(&claim.token)
        };
        let _ = reply.send(Ok(decided));
    }
    for (completion, reply) in completions {
        let _ = reply.send(Ok(match stored.get(&completion.token) {
            Some(&ttl_ms) => Completed::Stored { ttl_ms },
            None => Completed::Lost,
        }));
    }
}

/// Tells every member of a refused group to write on its own: claims are undecided, and
/// completions are to be written alone.
fn split(claims: Vec<(NewClaim, ClaimReply)>, completions: Vec<(NewCompletion, CompletionReply)>) {
    for (_, reply) in claims {
        let _ = reply.send(Ok(None));
    }
    for (_, reply) in completions {
        let _ = reply.send(Ok(Completed::Alone));
    }
}

/// Tells every member of a group that its statement failed (or was not tried).
fn fail(
    claims: Vec<(NewClaim, ClaimReply)>,
    completions: Vec<(NewCompletion, CompletionReply)>,
    error: Arc<StoreError>,
) {
    for (_, reply) in claims {
        let _ = reply.send(Err(StoreError::Grouped(error.clone())));
    }
    for (_, reply) in completions {
        let _ = reply.send(Err(StoreError::Grouped(error.clone())));
    }
}
