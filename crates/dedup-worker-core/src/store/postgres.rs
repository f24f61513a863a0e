//! What every PostgreSQL statement of the store shares: the transaction's isolation, the
//! advisory locks' names, and the listener that turns notifications into wake-ups. The
//! statements themselves live with their table family (queue.rs, outbox.rs, dead_letters.rs,
//! dedup/, …: see the store's module), each beside its SQLite form.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;

use super::{Wakeups, OUTBOX_CHANNEL, QUEUE_CHANNEL};

/// The isolation every transaction of the pipeline runs at on PostgreSQL, whatever the server's,
/// the database's or the role's default (`default_transaction_isolation`, which shops set to
/// `repeatable read` or `serializable` cluster-wide). The dedup ring needs it: a batch reads
/// which generation is current in a statement after the one that waited for the shared ring
/// lock, and only at READ COMMITTED does that statement see a seal that committed during the
/// wait. At REPEATABLE READ the snapshot is taken by the waiting statement, so a batch that
/// waited during a seal records its ids in the sealed generation while a retry after the seal
/// records them in the new one, neither seeing the other's uncommitted row: handled twice.
/// Queue and outbox claims (single statements) rely on it too: at READ COMMITTED a row another
/// claim updated meanwhile is re-checked, not a serialization failure.
///
/// Set twice, at the mechanism rather than per call site: as a startup parameter of every
/// connection of the store's pools ([`READ_COMMITTED_OPTION`], no round trip, and it outranks
/// database and role defaults), and in the `BEGIN` of each transaction the store opens
/// ([`begin`]), should a session's default be changed after it connected.
pub(super) const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The startup parameter of [`BEGIN_READ_COMMITTED`]: `-c default_transaction_isolation=…` (the
/// space escaped, as the `options` string splits on unescaped spaces). Appended after any
/// `options` of the database URL, so it wins over them as well.
pub(super) const READ_COMMITTED_OPTION: (&str, &str) =
    ("default_transaction_isolation", r"read\ committed");

/// Begins a transaction of the pipeline, at READ COMMITTED (see [`BEGIN_READ_COMMITTED`]).
pub(super) async fn begin(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    pool.begin_with(BEGIN_READ_COMMITTED).await
}

/// A duration as PostgreSQL's `make_interval(secs => …)` takes it.
pub(super) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Arbitrary constant naming the advisory locks (the two-`int4` key space, apart from the
/// `bigint` locks of retention and `dedup`) that make a once-only dead letter once.
pub(super) const DEAD_LETTER_LOCK_CLASS: i32 = 0x6465_6164;

/// Arbitrary constant naming the advisory locks, one per `(source, object)`, that the stale-event
/// guard takes for a batch before it records any version (see `StoreTx::lock_objects`).
pub(super) const OBJECT_LOCK_CLASS: i32 = 0x6f62_6a76;

/// Arbitrary constant naming the retention job's advisory lock.
pub(super) const RETENTION_LOCK: i64 = 0x6465_6475_7072_6574;

/// Turns notifications into in-process wake-ups. Reconnects (PgListener does) after errors;
/// while it is down the pollers' fallback keeps things moving.
pub(super) async fn listen(pool: PgPool, wakeups: Arc<Wakeups>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(error) => {
                if pool.is_closed() {
                    return;
                }
                tracing::warn!(%error, "LISTEN connection failed; relying on polling");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([QUEUE_CHANNEL, OUTBOX_CHANNEL]).await {
            tracing::warn!(%error, "LISTEN failed; relying on polling");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.recv().await {
                Ok(n) if n.channel() == QUEUE_CHANNEL => wakeups.queue.notify_waiters(),
                Ok(_) => wakeups.outbox.notify_waiters(),
                Err(error) => {
                    if pool.is_closed() {
                        return;
                    }
                    tracing::debug!(%error, "notification listener error; reconnecting");
                    // Something may have been missed while reconnecting.
                    wakeups.queue.notify_waiters();
                    wakeups.outbox.notify_waiters();
                    break;
                }
            }
        }
    }
}

/// PostgreSQL: whether today's (UTC) partition exists. Without it an insert fails ("no
/// partition of relation found for row"), which would fail the mark and deliver the row again
/// at lease end, for ever: the history row is skipped instead and counted. Two catalog index
/// probes; no cached horizon to go stale in a relay-only process.
pub(super) const PG_TODAYS_PARTITION: &str = "EXISTS (SELECT 1 FROM pg_inherits i
        JOIN pg_class p ON p.oid = i.inhrelid
       WHERE i.inhparent = 'outbox_attempts'::regclass
         AND p.relname = 'outbox_attempts_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'))";

/// PostgreSQL: `dedup_key(source, event_id)` of a row's `source` and `event_id` columns, as a
/// uuid: the first 16 bytes of sha256(be_u32(byte length of source) || source || event_id).
pub(super) const PG_DEDUP_KEY: &str = "encode(substring(sha256(int4send(octet_length(source)) \
     || convert_to(source, 'UTF8') || convert_to(event_id, 'UTF8')) for 16), 'hex')::uuid";
