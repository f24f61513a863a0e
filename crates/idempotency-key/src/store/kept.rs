//! The connections a store keeps checked out of its pool between request transactions (see
//! [`super::request_tx`] for why), and what makes a kept connection as good as one the pool
//! would lend:
//!
//! - **its session.** The pool runs its hooks (`after_release`, `before_acquire`) only on
//!   connections that go through it; a kept one does not. So a handler's session state
//!   (`SET app.tenant = 'a'`, the usual way to drive row-level security, `SET ROLE`, `LISTEN`,
//!   a session advisory lock, a temporary table, a `WITH HOLD` cursor) would be seen by the next
//!   request on it. Before a kept connection serves another transaction, its session is put back
//!   to what the pool lent (see [`SessionReset`]). So is a connection from the pool: one given
//!   back by this set (full, or needed by a waiter) carries its last handler's session, and a
//!   pool without an `after_release` hook lends it so (the soak found a tenant's setting seen
//!   by the next tenant's request that way, issue 36). Other users of the pool get such a
//!   connection as any sqlx transaction leaves it: the pool's hooks are theirs to set;
//! - **the pool's waiters.** While a connection is kept, the pool cannot lend it. A connection is
//!   not kept while the pool has nothing to lend, and while any is kept a watcher looks at the
//!   pool every [`watch_period`] (a quarter of the pool's acquire timeout, at most 100 ms): when
//!   the pool has no idle connection and no room for another, someone may be waiting, and every
//!   kept connection goes back. Whoever waits gets one within the pool's own acquire timeout;
//! - **the pool's checks.** A connection is kept for at most [`KEEP_AT_MOST`] after it left the
//!   pool, then given back: the pool's own checks (its ping, `max_lifetime`) see every
//!   connection at least that often, so one that still answers but should not be used (a
//!   primary turned read-only replica behind a proxy) is not reused for ever. All go back when
//!   the pool closes (`Pool::close` waits for every checked-out connection).

use std::borrow::Cow;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

/// The longest a connection stays out of the pool between request transactions.
pub(crate) const KEEP_AT_MOST: Duration = Duration::from_secs(60);

/// A connection out of the pool, and when it left it.
pub(super) type Kept = (PoolConnection<Postgres>, Instant);

/// Connections checked out of the pool and kept between request transactions.
pub(crate) struct KeptConnections {
    /// Idle connections, each outside any transaction, whose session is reset before their next
    /// transaction.
    idle: Mutex<Vec<Kept>>,
    /// At most this many are kept idle (a quarter of the pool); more go back to the pool.
    cap: usize,
    /// The pool they are checked out of.
    pool: PgPool,
    /// How a kept connection's session goes back to what the pool lent; until it is known no
    /// connection is kept.
    reset: OnceLock<SessionReset>,
    /// Wakes the watcher when a connection is kept.
    kept_one: Arc<tokio::sync::Notify>,
    /// The watcher (see [`Self::watch`]), started with the first kept connection (inside the
    /// runtime).
    watching: Once,
}

impl std::fmt::Debug for KeptConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnections")
            .field("idle", &self.idle().len())
            .field("cap", &self.cap)
            .finish()
    }
}

/// How often the watcher looks at the pool while connections are kept: well within the pool's
/// acquire timeout, so a waiter is served before it gives up.
pub(super) fn watch_period(pool: &PgPool) -> Duration {
    (pool.options().get_acquire_timeout() / 4).clamp(Duration::from_millis(1), MAX_WATCH_PERIOD)
}

const MAX_WATCH_PERIOD: Duration = Duration::from_millis(100);

impl KeptConnections {
    pub(crate) fn for_pool(pool: &PgPool) -> Self {
        KeptConnections {
            idle: Mutex::new(Vec::new()),
            cap: pool.options().get_max_connections() as usize / 4,
            pool: pool.clone(),
            reset: OnceLock::new(),
            kept_one: Arc::new(tokio::sync::Notify::new()),
            watching: Once::new(),
        }
    }

    /// Gives kept connections back to the pool: all of them while the pool has nothing to lend
    /// (looked at every [`watch_period`] while any is kept), those out of it for
    /// [`KEEP_AT_MOST`], and all of them once the pool is closing. One task per store, started
    /// in the runtime of the first kept connection; it holds only a weak reference, so a store
    /// dropped first ends it at its next look.
    fn watch(self: &Arc<Self>) {
        self.watching.call_once(|| {
            let closing = self.pool.close_event();
            let period = watch_period(&self.pool);
            let kept = Arc::downgrade(self);
            let wake = self.kept_one.clone();
            tokio::spawn(async move {
                tokio::pin!(closing);
                loop {
                    let empty = match kept.upgrade() {
                        Some(kept) => kept.idle().is_empty(),
                        None => return,
                    };
                    // Nothing kept: nothing to look at until one is (`notify_one` leaves a
                    // permit if it comes before this wait), or the store is dropped.
                    let wait = if empty { KEEP_AT_MOST } else { period };
                    tokio::select! {
                        _ = &mut closing => {
                            if let Some(kept) = kept.upgrade() {
                                kept.idle().clear();
                            }
                            return;
                        }
                        _ = wake.notified(), if empty => {}
                        _ = tokio::time::sleep(wait) => match kept.upgrade() {
                            Some(kept) => kept.give_back_if_needed(),
                            None => return,
                        },
                    }
                }
            });
        });
    }

    /// Gives every kept connection back while the pool could lend none to a waiter, and those
    /// out of the pool for [`KEEP_AT_MOST`] in any case.
    fn give_back_if_needed(&self) {
        if self.pool_exhausted() {
            self.idle().clear();
        } else {
            self.idle().retain(|(_, out)| out.elapsed() < KEEP_AT_MOST);
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // A poisoned lock only means a panic elsewhere while it was held; the list is still a
        // list of idle connections.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently kept connection still within [`KEEP_AT_MOST`], with the statement that
    /// resets its session and begins its next transaction; older ones go back.
    pub(super) fn take(&self) -> Option<(Kept, Cow<'static, str>)> {
        let reset = self.reset_and_begin()?;
        let mut idle = self.idle();
        while let Some(kept) = idle.pop() {
            if kept.1.elapsed() < KEEP_AT_MOST {
                return Some((kept, reset));
            }
        }
        None
    }

    /// The statement that puts a session back to the one the pool lent and begins a
    /// transaction, once the session is known. Every request transaction begins with it, on a
    /// kept connection and on one from the pool alike: a connection that went back to the pool
    /// (the kept set was full, or a waiter needed it) carries what its last handler left in the
    /// session, and a pool without an `after_release` hook lends it as it is.
    pub(super) fn reset_and_begin(&self) -> Option<Cow<'static, str>> {
        self.reset
            .get()
            .map(|reset| Cow::Owned(reset.begin.clone()))
    }

    /// The pool could lend no connection now: none idle, and no room to open one.
    fn pool_exhausted(&self) -> bool {
        self.pool.num_idle() == 0 && self.pool.size() >= self.pool.options().get_max_connections()
    }

    /// Whether the session a kept connection goes back to is known yet.
    pub(super) fn knows_session(&self) -> bool {
        self.reset.get().is_some()
    }

    /// Records, from `conn` fresh from the pool, the session every kept connection goes back
    /// to (once per store). Until it is recorded nothing is kept.
    pub(super) async fn learn_session(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.knows_session() {
            return Ok(());
        }
        let reset = SessionReset::learn(conn).await?;
        let _ = self.reset.set(reset);
        Ok(())
    }

    /// Keeps `conn` (outside any transaction) for the next transaction, or gives it back to the
    /// pool: when the set is full, the connection has been out for [`KEEP_AT_MOST`], the
    /// session it must go back to is not known, or the pool has nothing to lend to whoever
    /// may be waiting on it.
    pub(super) fn put(self: &Arc<Self>, conn: Kept) {
        if self.cap == 0
            || conn.1.elapsed() >= KEEP_AT_MOST
            || !self.knows_session()
            || self.pool_exhausted()
        {
            return;
        }
        self.watch();
        let mut idle = self.idle();
        if idle.len() < self.cap {
            idle.push(conn);
            self.kept_one.notify_one();
        }
        // Closing began after the watcher cleared the set, or before it runs: either way
        // nothing stays kept (`close` marks the pool closed before it wakes the watcher).
        if self.pool.is_closed() {
            idle.clear();
        }
        // Otherwise `conn` is dropped: back to the pool, with sqlx's ping.
    }
}

/// What puts a kept connection's session back to the one the pool lent, sent in the same
/// round trip as its next `BEGIN` (so it costs no round trip of its own):
///
/// ```sql
/// BEGIN; CLOSE ALL; RESET ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES;
/// SELECT set_config('session_authorization', …), <the pool's settings>, set_config('role', …),
///        pg_advisory_unlock_all();
/// COMMIT; BEGIN
/// ```
///
/// - in its own transaction, committed before the request's `BEGIN`: statements before a
///   `BEGIN` in one simple-query string would join the request's transaction, and a request
///   that rolls back would roll the reset back with it (a `SET` is undone by `ROLLBACK`);
/// - `RESET ALL` puts every setting back to the session's start (the connection's startup
///   options, the role's and database's defaults) and clears custom ones (`app.tenant` reads
///   as empty, as on a connection where it was set and reset). It leaves the role and the
///   session authorization alone, so those are set explicitly, the session authorization first
///   (setting it ends any `SET ROLE`), to what the pool lent: the user that logged in, unless
///   the pool's hooks changed it (which only a superuser can, and then may again);
/// - then what the pool's hooks had set when a connection was first lent (dedup-db's
///   `put_schema_first`, say, puts a schema first in `search_path`): the settings whose source
///   is the session, recorded once per store from a connection fresh from the pool. That
///   assumes the pool's hooks set the same on every connection, as such hooks do; a custom
///   setting (`app.*`) a hook sets is not listed by PostgreSQL and is not restored;
/// - not `DISCARD ALL`, nor `DEALLOCATE ALL`: they drop the prepared statements sqlx's
///   statement cache holds, and its next use of one fails. A statement a handler prepared with
///   `PREPARE` stays (it carries no rights); `DISCARD PLANS` is left out as it changes nothing
///   a request can see;
/// - as few statements as that takes: each one of a simple-query string is parsed and run on
///   its own, and this string goes with most request transactions (BENCHMARKS.md, issue 36).
///
/// If any part fails, the `BEGIN` fails, the connection is closed, and the transaction begins
/// on a connection from the pool.
#[derive(Debug)]
struct SessionReset {
    /// The whole string, ending in the request's `BEGIN`.
    begin: String,
}

impl SessionReset {
    async fn learn(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        let settings: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, current_setting(name) FROM pg_settings WHERE source = 'session'
             UNION ALL SELECT 'session_authorization', current_setting('session_authorization')
             UNION ALL SELECT 'role', current_setting('role')",
        )
        .fetch_all(conn)
        .await?;
        Ok(Self::for_session(&settings))
    }

    /// The reset for a session lent with `settings` (which name the session authorization and
    /// the role).
    fn for_session(settings: &[(String, String)]) -> Self {
        let set = |name: &str, value: &str| {
            format!("set_config({}, {}, false)", literal(name), literal(value))
        };
        // The session authorization first (it ends any role), the role last.
        let mut calls = Vec::with_capacity(settings.len() + 1);
        let mut role = set("role", "none");
        for (name, value) in settings {
            match name.as_str() {
                "session_authorization" => calls.insert(0, set(name, value)),
                "role" => role = set(name, value),
                _ => calls.push(set(name, value)),
            }
        }
        calls.push(role);
        calls.push("pg_advisory_unlock_all()".to_owned());
        let begin = format!(
            "BEGIN; CLOSE ALL; RESET ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES; \
             SELECT {}; COMMIT; BEGIN",
            calls.join(", ")
        );
        SessionReset { begin }
    }
}

/// `value` as an SQL string literal, read the same whatever `standard_conforming_strings` is.
fn literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reset_restores_what_the_pool_set_and_nothing_else() {
        let lent = [
            (
                "search_path".to_owned(),
                "dedup_worker, \"my'app\"\\x".to_owned(),
            ),
            ("role".to_owned(), "app_rls".to_owned()),
            ("session_authorization".to_owned(), "postgres".to_owned()),
        ];
        assert_eq!(
            SessionReset::for_session(&lent).begin,
            "BEGIN; CLOSE ALL; RESET ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES; \
             SELECT set_config(E'session_authorization', E'postgres', false), \
             set_config(E'search_path', E'dedup_worker, \"my''app\"\\\\x', false), \
             set_config(E'role', E'app_rls', false), pg_advisory_unlock_all(); COMMIT; BEGIN"
        );
        let plain = [("session_authorization".to_owned(), "app".to_owned())];
        assert_eq!(
            SessionReset::for_session(&plain).begin,
            "BEGIN; CLOSE ALL; RESET ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES; \
             SELECT set_config(E'session_authorization', E'app', false), \
             set_config(E'role', E'none', false), pg_advisory_unlock_all(); COMMIT; BEGIN"
        );
    }
}
