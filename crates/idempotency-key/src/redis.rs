//! Optional Redis fast path in front of the PostgreSQL store.
//!
//! - Completed responses are mirrored (after PostgreSQL stored them) under the key's remaining
//!   TTL, so a replay is answered from Redis without a PostgreSQL query.
//! - `SET NX PX` is a short lock: a duplicate arriving while the first request holds it is
//!   answered 409 without touching PostgreSQL.
//!
//! Redis is never the authority for "may this run": a miss, an error, a flushed or stopped Redis
//! all fall through to the PostgreSQL claim, which alone decides. Errors are logged, open a short
//! circuit breaker (so a dead Redis costs one failed attempt per second, not one per request) and
//! never fail the request. Each call, connecting included, is bounded by one timeout, so a Redis
//! that stops answering delays a request by at most that.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::fingerprint::Fingerprint;
use super::records::StoredResponse;

/// Errors from Redis (logged by the layer, never returned to clients).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Redis failed, is unreachable or the breaker is open.
    #[error("idempotency redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The circuit breaker is open after a recent failure.
    #[error("idempotency redis: skipped after a recent failure")]
    Skipped,
    /// No answer (or no connection) within the cache's timeout.
    #[error("idempotency redis: no answer within {0:?}")]
    TimedOut(Duration),
    /// A cached value could not be decoded.
    #[error("idempotency redis: corrupt cached value")]
    Corrupt,
}

/// A cached completed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedResponse {
    /// Fingerprint of the request that produced it.
    pub(crate) fingerprint: Fingerprint,
    /// The response.
    pub(crate) response: StoredResponse,
}

/// Proof of holding the short lock (its value in Redis), for unlocking it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockToken(String);

impl LockToken {
    /// The lock's value.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// What [`RedisCache::try_lock`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockOutcome {
    /// This request holds the lock.
    Acquired(LockToken),
    /// Another request holds it; its fingerprint, if the value could be read.
    Held {
        /// The holder's request fingerprint.
        fingerprint: Option<Fingerprint>,
    },
}

/// Redis mirror and lock.
#[derive(Clone)]
pub struct RedisCache {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    prefix: String,
    conn: OnceCell<ConnectionManager>,
    /// Unix milliseconds until which Redis is skipped after a failure.
    skip_until_ms: AtomicU64,
    breaker: Duration,
    timeout: Duration,
    // Built once: `Script::new` hashes the source (SHA-1) for EVALSHA.
    store: redis::Script,
    lock: redis::Script,
    unlock: redis::Script,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCache")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

// Store the response under KEYS[1] for ARGV[2] ms, then drop the lock KEYS[2] if we hold it.
const STORE_SCRIPT: &str = r#"
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
return 1
"#;

// Take the lock KEYS[1] (value ARGV[1], for ARGV[2] ms), or return the holder's value: one
// round trip, atomic, on any Redis version (`SET NX GET` needs 7.0).
const LOCK_SCRIPT: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
"#;

const UNLOCK_SCRIPT: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

impl RedisCache {
    /// Creates the cache. Does not connect: the first use does, so a Redis that is down at
    /// start-up does not stop the service. `prefix` namespaces every key (tests and tenants).
    pub fn new(url: &str, prefix: impl Into<String>) -> Result<Self, CacheError> {
        Ok(Self {
            inner: Arc::new(Inner {
                client: redis::Client::open(url)?,
                prefix: prefix.into(),
                conn: OnceCell::new(),
                skip_until_ms: AtomicU64::new(0),
                breaker: Duration::from_secs(1),
                timeout: Duration::from_millis(500),
                store: redis::Script::new(STORE_SCRIPT),
                lock: redis::Script::new(LOCK_SCRIPT),
                unlock: redis::Script::new(UNLOCK_SCRIPT),
            }),
        })
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    async fn conn(&self) -> Result<ConnectionManager, CacheError> {
        if Self::now_ms() < self.inner.skip_until_ms.load(Ordering::Relaxed) {
            return Err(CacheError::Skipped);
        }
        let res = self
            .inner
            .conn
            .get_or_try_init(|| async {
                // Callers queued behind a failed attempt must not each retry the connection.
                if Self::now_ms() < self.inner.skip_until_ms.load(Ordering::Relaxed) {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::IoError,
                        "redis recently unreachable",
                    )));
                }
                // No response timeout of the manager's own: `call` bounds each call, waiting
                // for a reconnection included. The connection timeout bounds the manager's
                // reconnections, which run in the background.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.inner.timeout)
                    .set_number_of_retries(1)
                    .set_max_delay(100);
                ConnectionManager::new_with_config(self.inner.client.clone(), config).await
            })
            .await;
        match res {
            Ok(c) => Ok(c.clone()),
            Err(e) => Err(self.failed(e.into())),
        }
    }

    /// One Redis call on the shared connection, connecting included, within the timeout. The
    /// bound is here rather than in the connection manager, whose waits add up (a command
    /// queued behind a reconnection waits for its attempts, then for its own answer).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, CacheError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let conn = self.conn().await?;
            f(conn).await.map_err(|e| self.failed(e.into()))
        };
        match tokio::time::timeout(self.inner.timeout, attempt).await {
            Ok(result) => result,
            Err(_elapsed) => Err(self.failed(CacheError::TimedOut(self.inner.timeout))),
        }
    }

    fn failed(&self, e: CacheError) -> CacheError {
        if matches!(e, CacheError::Redis(_) | CacheError::TimedOut(_)) {
            let until = Self::now_ms() + self.inner.breaker.as_millis() as u64;
            self.inner.skip_until_ms.store(until, Ordering::Relaxed);
            metrics::counter!("idempotency_redis_errors_total").increment(1);
        }
        e
    }

    fn id(&self, kind: &str, account: &str, key: &str) -> String {
        // Length-prefixing the account keeps ("a:b", "c") and ("a", "b:c") apart.
        format!(
            "{}:{}:{}:{}:{}",
            self.inner.prefix,
            kind,
            account.len(),
            account,
            key
        )
    }

    /// The cached response for `(account, key)`, if any.
    pub(crate) async fn get(
        &self,
        account: &str,
        key: &str,
    ) -> Result<Option<CachedResponse>, CacheError> {
        let id = self.id("resp", account, key);
        let raw: Option<Vec<u8>> = self
            .call(|mut conn| async move { redis::cmd("GET").arg(id).query_async(&mut conn).await })
            .await?;
        match raw {
            None => Ok(None),
            Some(raw) => decode(&raw).map(Some).ok_or(CacheError::Corrupt),
        }
    }

    /// Tries the short lock for a request with `fingerprint`. The lock's value names the
    /// holder's fingerprint, so a different request arriving meanwhile is told apart (422)
    /// from a duplicate (409) without asking PostgreSQL.
    pub(crate) async fn try_lock(
        &self,
        account: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<LockOutcome, CacheError> {
        let value = format!("{}:{}", uuid::Uuid::new_v4().simple(), fingerprint.to_hex());
        let (script, id, v) = (&self.inner.lock, self.id("lock", account, key), &value);
        let holder: Option<String> = self
            .call(|mut conn| async move {
                script
                    .key(id)
                    .arg(v)
                    .arg(ttl.as_millis().max(1) as u64)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(match holder {
            None => LockOutcome::Acquired(LockToken(value)),
            Some(holder) => LockOutcome::Held {
                fingerprint: holder
                    .split_once(':')
                    .and_then(|(_, fp)| hex::decode(fp).ok())
                    .and_then(|fp| Fingerprint::from_slice(&fp)),
            },
        })
    }

    /// Mirrors a completed response for `ttl` and drops our lock, in one round trip.
    pub(crate) async fn store(
        &self,
        account: &str,
        key: &str,
        lock_token: Option<&str>,
        cached: &CachedResponse,
        ttl: Duration,
    ) -> Result<(), CacheError> {
        let script = &self.inner.store;
        let (resp, lock) = (self.id("resp", account, key), self.id("lock", account, key));
        self.call(|mut conn| async move {
            script
                .key(resp)
                .key(lock)
                .arg(encode(cached))
                .arg(ttl.as_millis() as u64)
                .arg(lock_token.unwrap_or(""))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    /// Drops our lock (after a released 5xx).
    pub(crate) async fn unlock(
        &self,
        account: &str,
        key: &str,
        token: &str,
    ) -> Result<(), CacheError> {
        let (script, id) = (&self.inner.unlock, self.id("lock", account, key));
        self.call(|mut conn| async move {
            script
                .key(id)
                .arg(token)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    /// Drops our lock once Redis answers again, after dropping it failed (Redis was down when
    /// the request finished). Left in place, the lock would answer every retry of a request that
    /// has completed with 409 until the lock's `ttl`, although PostgreSQL holds its result. In
    /// the background, one try per breaker period, until the lock would have expired anyway.
    pub(crate) fn unlock_when_back(&self, account: &str, key: &str, token: &str, ttl: Duration) {
        let cache = self.clone();
        let (account, key, token) = (account.to_owned(), key.to_owned(), token.to_owned());
        let deadline = tokio::time::Instant::now() + ttl;
        tokio::spawn(async move {
            let period = cache.inner.breaker;
            while tokio::time::Instant::now() + period < deadline {
                tokio::time::sleep(period).await;
                if cache.unlock(&account, &key, &token).await.is_ok() {
                    return;
                }
            }
        });
    }
}

// Layout: fingerprint[32] | status u16 | header count u16 | (name len u16, name, value len u32,
// value)* | body. Binary rather than JSON because replays are the hot path.
fn encode(c: &CachedResponse) -> Vec<u8> {
    let r = &c.response;
    let mut out = Vec::with_capacity(64 + r.body.len());
    out.extend_from_slice(c.fingerprint.as_bytes());
    out.extend_from_slice(&r.status.to_be_bytes());
    out.extend_from_slice(&(r.headers.len() as u16).to_be_bytes());
    for (name, value) in &r.headers {
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(&r.body);
    out
}

fn decode(raw: &[u8]) -> Option<CachedResponse> {
    let mut cur = raw;
    let mut take = |n: usize| -> Option<&[u8]> {
        if cur.len() < n {
            return None;
        }
        let (head, rest) = cur.split_at(n);
        cur = rest;
        Some(head)
    };
    let fingerprint = Fingerprint::from_slice(take(32)?)?;
    let status = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n = u16::from_be_bytes(take(2)?.try_into().ok()?) as usize;
        let name = std::str::from_utf8(take(n)?).ok()?.to_owned();
        let v = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let value = std::str::from_utf8(take(v)?).ok()?.to_owned();
        headers.push((name, value));
    }
    let body = Bytes::copy_from_slice(cur);
    Some(CachedResponse {
        fingerprint,
        response: StoredResponse {
            status,
            headers,
            body,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let c = CachedResponse {
            fingerprint: Fingerprint([7; 32]),
            response: StoredResponse {
                status: 402,
                headers: vec![
                    ("content-type".into(), "application/json".into()),
                    ("location".into(), "/v1/payments/1".into()),
                ],
                body: Bytes::from_static(b"{\"error\":\"card_declined\"}"),
            },
        };
        assert_eq!(decode(&encode(&c)), Some(c));
        assert_eq!(decode(b"short"), None);
    }
}
