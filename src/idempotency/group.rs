//! Group commit for the idempotency store: concurrent first claims and completions are written
//! as one multi-row statement each, so N requests cost one commit instead of N.
//!
//! On a small machine the ceiling of the layer is PostgreSQL's per-statement CPU (parse, bind,
//! commit, one backend wake-up per round trip), not the rows. Each request still makes at most
//! two round trips of its own (it waits for the group holding its claim, then for the group
//! holding its completion); what is shared is the statement.
//!
//! Guarantees:
//! - a grouped claim is `INSERT … ON CONFLICT DO NOTHING`: it only ever creates a key that did
//!   not exist. Anything else (a stored result, a running claim, an expired key, a lease to take
//!   over) is left to the caller's single-row claim, which decides those cases one at a time;
//! - two requests for the same key in one group: the primary key admits one, the other is told
//!   it did not claim and goes to the single-row claim (which answers 409);
//! - rows are inserted in `(account, key)` order, so two groups waiting on each other's
//!   uncommitted keys always wait in the same order and never deadlock;
//! - a grouped completion updates only rows still holding the caller's claim token;
//! - a failed statement fails every request of its group; none is told it succeeded.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::types::Json;
use sqlx::{PgPool, Row};
use tokio::sync::{mpsc, oneshot, Mutex};
use uuid::Uuid;

use super::fingerprint::Fingerprint;
use super::store::{StoreError, StoredResponse};

/// How statements are grouped.
#[derive(Debug, Clone, Copy)]
pub struct GroupOptions {
    /// Most requests written by one statement.
    pub max_batch: usize,
    /// Writer tasks per statement kind: how many grouped statements are in flight at once.
    pub writers: usize,
}

impl Default for GroupOptions {
    /// 64 rows, 4 writers: at 32 concurrent requests a group holds whoever arrived while the
    /// previous statements ran, and four in flight keep both cores busy.
    fn default() -> Self {
        GroupOptions {
            max_batch: 64,
            writers: 4,
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

/// `true`: the row was created, the caller holds the key.
type ClaimReply = oneshot::Sender<Result<bool, StoreError>>;
/// `Some(ttl_ms)`: stored; `None`: the claim was no longer ours.
type CompletionReply = oneshot::Sender<Result<Option<i64>, StoreError>>;

/// The channels to the writer tasks. The writers end when this is dropped (the channels close).
#[derive(Debug)]
pub(crate) struct Groups {
    claims: mpsc::Sender<(NewClaim, ClaimReply)>,
    completions: mpsc::Sender<(NewCompletion, CompletionReply)>,
}

const GROUP_CLAIM_SQL: &str = r#"
INSERT INTO idempotency_keys AS k
    (account, key, fingerprint, status, claim_token, locked_until, created_at, expires_at)
SELECT u.account, u.key, u.fingerprint, 'in_progress', u.token,
       now() + u.lease_ms * interval '1 millisecond', now(),
       now() + u.ttl_ms * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]::uuid[], $5::int8[], $6::int8[])
     AS u(account, key, fingerprint, token, lease_ms, ttl_ms)
ORDER BY u.account, u.key
ON CONFLICT (account, key) DO NOTHING
RETURNING k.claim_token::text
"#;

const GROUP_COMPLETE_SQL: &str = r#"
UPDATE idempotency_keys AS k
   SET status = 'completed', claim_token = NULL, locked_until = NULL,
       response_status = u.status, response_headers = u.headers, response_body = u.body
  FROM unnest($1::text[], $2::text[], $3::text[]::uuid[], $4::int2[], $5::jsonb[], $6::bytea[])
       AS u(account, key, token, status, headers, body)
 WHERE k.account = u.account AND k.key = u.key AND k.claim_token = u.token
   AND k.status = 'in_progress'
RETURNING u.token::text,
          GREATEST(0, floor(extract(epoch FROM (k.expires_at - now())) * 1000))::bigint
"#;

impl Groups {
    /// Starts the writer tasks on the current runtime.
    pub(crate) fn start(
        pool: PgPool,
        options: GroupOptions,
        on_statement: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let max_batch = options.max_batch.max(1);
        let (claims, claim_rx) = mpsc::channel(max_batch * options.writers.max(1));
        let (completions, completion_rx) = mpsc::channel(max_batch * options.writers.max(1));
        let claim_rx = Arc::new(Mutex::new(claim_rx));
        let completion_rx = Arc::new(Mutex::new(completion_rx));
        for _ in 0..options.writers.max(1) {
            tokio::spawn(write_groups(
                claim_rx.clone(),
                max_batch,
                ClaimWriter(pool.clone(), on_statement.clone()),
            ));
            tokio::spawn(write_groups(
                completion_rx.clone(),
                max_batch,
                CompletionWriter(pool.clone(), on_statement.clone()),
            ));
        }
        Groups {
            claims,
            completions,
        }
    }

    /// Creates the key if it does not exist; `false` means "decide it one at a time".
    pub(crate) async fn claim_new(&self, claim: NewClaim) -> Result<bool, StoreError> {
        ask(&self.claims, claim).await
    }

    /// Stores a result; `None` when the claim was no longer ours.
    pub(crate) async fn complete(
        &self,
        completion: NewCompletion,
    ) -> Result<Option<i64>, StoreError> {
        ask(&self.completions, completion).await
    }
}

/// Hands `item` to the writers and waits for its answer. A writer that went away before
/// answering (runtime shutdown) is an error, never a success.
async fn ask<Item, Answer>(
    writers: &mpsc::Sender<(Item, oneshot::Sender<Result<Answer, StoreError>>)>,
    item: Item,
) -> Result<Answer, StoreError> {
    let (reply, answer) = oneshot::channel();
    writers
        .send((item, reply))
        .await
        .map_err(|_| StoreError::GroupClosed)?;
    answer.await.map_err(|_| StoreError::GroupClosed)?
}

/// One kind of grouped statement: runs a group, answers each member.
trait GroupWriter<Item, Answer>: Send + 'static {
    fn write(
        &self,
        items: &[Item],
    ) -> impl std::future::Future<Output = Result<Vec<Answer>, sqlx::Error>> + Send;
}

/// The writers' common end of one channel: a request and where its answer goes.
type SharedReceiver<Item, Answer> =
    Arc<Mutex<mpsc::Receiver<(Item, oneshot::Sender<Result<Answer, StoreError>>)>>>;

/// One writer: take whatever is waiting (up to `max_batch`), write it as one statement, answer
/// everyone. Several writers share the receiver, so statements overlap.
async fn write_groups<Item, Answer, W>(
    rx: SharedReceiver<Item, Answer>,
    max_batch: usize,
    writer: W,
) where
    Item: Send + 'static,
    Answer: Send + 'static,
    W: GroupWriter<Item, Answer>,
{
    let mut group = Vec::with_capacity(max_batch);
    loop {
        {
            let mut rx = rx.lock().await;
            if rx.recv_many(&mut group, max_batch).await == 0 {
                return;
            }
        }
        let (items, replies): (Vec<_>, Vec<_>) = group.drain(..).unzip();
        metrics::histogram!("idempotency_group_size").record(items.len() as f64);
        match writer.write(&items).await {
            Ok(answers) => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Grouped(error.clone())));
                }
            }
        }
    }
}

struct ClaimWriter(PgPool, Arc<dyn Fn() + Send + Sync>);

impl GroupWriter<NewClaim, bool> for ClaimWriter {
    async fn write(&self, items: &[NewClaim]) -> Result<Vec<bool>, sqlx::Error> {
        (self.1)();
        let tokens: Vec<String> = items.iter().map(|c| c.token.to_string()).collect();
        let rows = sqlx::query(GROUP_CLAIM_SQL)
            .bind(items.iter().map(|c| c.account.as_str()).collect::<Vec<_>>())
            .bind(items.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())
            .bind(
                items
                    .iter()
                    .map(|c| &c.fingerprint.0[..])
                    .collect::<Vec<_>>(),
            )
            .bind(&tokens)
            .bind(items.iter().map(|c| c.lease_ms).collect::<Vec<_>>())
            .bind(items.iter().map(|c| c.ttl_ms).collect::<Vec<_>>())
            .fetch_all(&self.0)
            .await?;
        let mut created = std::collections::HashSet::with_capacity(rows.len());
        for row in rows {
            created.insert(row.try_get::<String, _>(0)?);
        }
        Ok(tokens.iter().map(|t| created.contains(t)).collect())
    }
}

struct CompletionWriter(PgPool, Arc<dyn Fn() + Send + Sync>);

impl GroupWriter<NewCompletion, Option<i64>> for CompletionWriter {
    async fn write(&self, items: &[NewCompletion]) -> Result<Vec<Option<i64>>, sqlx::Error> {
        (self.1)();
        let tokens: Vec<String> = items.iter().map(|c| c.token.to_string()).collect();
        let rows = sqlx::query(GROUP_COMPLETE_SQL)
            .bind(items.iter().map(|c| c.account.as_str()).collect::<Vec<_>>())
            .bind(items.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())
            .bind(&tokens)
            .bind(
                items
                    .iter()
                    .map(|c| c.response.status as i16)
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|c| Json(&c.response.headers))
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|c| &c.response.body[..])
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&self.0)
            .await?;
        let mut stored = HashMap::with_capacity(rows.len());
        for row in rows {
            stored.insert(row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?);
        }
        Ok(tokens.iter().map(|t| stored.get(t).copied()).collect())
    }
}
