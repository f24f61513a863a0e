//! A partition's writer: takes whatever is waiting, writes it as one statement, answers every
//! request of the group.
//!
//! Every request gets an answer, and never a false success: a group whose statement went
//! through is answered row by row; one the server refused is split so that each request is
//! decided by its own single-row statement (no shared fate); one that could not reach the server
//! fails as a whole and opens the breaker (`dedup_db::group_commit`, which also bounds each
//! statement). A writer that goes away mid-group drops the replies, which callers see as an
//! error.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{Connection, Executor, PgConnection, Row};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::statement::group_query;
use super::{ClaimEntry, Completed, CompletionEntry, Write};
use crate::records::{decode_existing, Claim, ClaimToken, StoreError};
use dedup_db::group_commit::{server_answered, Committed, Committer, WriteFailure};

/// One partition's writer.
pub(super) struct Writer {
    /// Its connection, and the statement it sends.
    pub(super) link: Link,
    /// Bounds each statement and fails groups at once while PostgreSQL could not be reached
    /// lately (one per writer: each has a connection of its own).
    pub(super) committer: Committer<StoreError>,
}

/// A writer's own connection and what it sends on it.
pub(super) struct Link {
    /// How to connect (the store's pool's options).
    pub(super) connect: Arc<PgConnectOptions>,
    /// A connection of its own, kept across statements: a pooled connection would add a ping
    /// on every release and acquire, two round trips in front of each statement. Dropped on
    /// any error and opened again for the next group.
    pub(super) connection: Option<PgConnection>,
    /// [`writer_settings`](super::statement::writer_settings), run on each new connection.
    pub(super) settings: Arc<str>,
    /// The grouped statement.
    pub(super) sql: Arc<str>,
    /// Counts statements (the store's `query_count`).
    pub(super) on_statement: Arc<dyn Fn() + Send + Sync>,
}

impl Writer {
    /// Takes whatever is waiting (up to `max_batch`), writes it as one statement, answers
    /// everyone; repeats until the channel closes. A writer that goes away before answering
    /// (runtime shutdown) drops the replies, which callers see as an error, never as a success.
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Write>, max_batch: usize) {
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
            let size = claims.len() + completions.len();
            let written = self.link.write(&claims, &completions);
            let error = match self.committer.commit(size, written).await {
                Committed::Written(rows) => {
                    answer(claims, completions, rows);
                    continue;
                }
                Committed::Refused(error) => error,
                Committed::Unreachable(error) => {
                    self.link.connection = None;
                    error
                }
                // The server refused the statement (one request's values it cannot hold, a
                // deadlock): no request of a group shares another's fate, so each is decided by
                // its own single-row statement, and only the one at fault fails.
                Committed::Failed(error) if size > 1 => {
                    self.link.connection = None;
                    tracing::warn!(%error, size, "grouped idempotency statement refused; writing its requests one at a time");
                    metrics::counter!("idempotency_group_split_total").increment(1);
                    split(claims, completions);
                    continue;
                }
                Committed::Failed(error) => {
                    self.link.connection = None;
                    Arc::new(error)
                }
            };
            fail(claims, completions, error);
        }
    }
}

impl Link {
    /// Runs one grouped statement, connecting first if needed.
    async fn write(
        &mut self,
        claims: &[ClaimEntry],
        completions: &[CompletionEntry],
    ) -> Result<Vec<PgRow>, WriteFailure<StoreError>> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => {
                // Whatever the error, the connection is not there: even an error the server
                // sent while connecting (authentication, too many clients) says nothing about a
                // statement.
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
            .map_err(|e| match server_answered(&e) {
                true => WriteFailure::Statement(e.into()),
                // I/O, TLS, protocol: the connection broke under the statement.
                false => WriteFailure::Unreachable(e.into()),
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

/// Tells each member of a group what the statement did for it. Tokens are unique per request,
/// so a returned token identifies exactly one claim or completion. A key created by this
/// statement wins over the row found for it: that row was deleted (released) after the
/// statement started.
fn answer(claims: Vec<ClaimEntry>, completions: Vec<CompletionEntry>, rows: Vec<PgRow>) {
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
fn split(claims: Vec<ClaimEntry>, completions: Vec<CompletionEntry>) {
    for (_, reply) in claims {
        let _ = reply.send(Ok(None));
    }
    for (_, reply) in completions {
        let _ = reply.send(Ok(Completed::Alone));
    }
}

/// Tells every member of a group that its statement failed (or was not tried).
fn fail(claims: Vec<ClaimEntry>, completions: Vec<CompletionEntry>, error: Arc<StoreError>) {
    for (_, reply) in claims {
        let _ = reply.send(Err(StoreError::Grouped(error.clone())));
    }
    for (_, reply) in completions {
        let _ = reply.send(Err(StoreError::Grouped(error.clone())));
    }
}
