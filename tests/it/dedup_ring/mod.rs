//! The dedup ring's concurrency on PostgreSQL (`store::dedup`), shown with the locks held by
//! the test where the product's own batches and retention would hold them:
//!
//! * [`isolation`]: a database (or role) whose `default_transaction_isolation` is `repeatable
//!   read` or `serializable` does not let a batch that waited on the ring lock during a seal
//!   record an id in the sealed generation while a retry after the seal records it in the new
//!   one: the store pins READ COMMITTED on every transaction it opens;
//! * [`lock_order`]: retention takes the ring lock before any generation table's lock, as
//!   batches do, so expiring a generation while batches run is never a `deadlock detected`.

mod isolation;
mod lock_order;

use std::time::{Duration, Instant};

use dedup_worker_core::store::dedup::RING_LOCK;
use dedup_worker_core::store::{RingMaintenance, Store};
use sqlx::{Connection, PgConnection, PgPool};

use crate::helpers::{
    poll_until, post_signed_until_not_503, stripe_event, RunningBinary, TestDb, TestQueue,
};

const SECRET: &str = "whsec_dedup_ring";
const WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// A session of the test's own that holds locks in one open transaction.
struct Holder(PgConnection);

impl Holder {
    async fn begin(db: &TestDb) -> Self {
        let mut conn = PgConnection::connect(&db.url).await.expect("connect");
        // The test's own sessions are READ COMMITTED whatever the database's default.
        sqlx::query("BEGIN ISOLATION LEVEL READ COMMITTED")
            .execute(&mut conn)
            .await
            .expect("begin");
        Holder(conn)
    }

    /// Holds the ring lock shared, as a batch in flight does (before it read any generation).
    async fn ring_shared(db: &TestDb) -> Self {
        let mut holder = Self::begin(db).await;
        holder
            .run(&format!("SELECT pg_advisory_xact_lock_shared({RING_LOCK})"))
            .await;
        holder
    }

    /// Holds the handler's table `event_ledger` so that no batch can write it: a batch of the
    /// `ledger` handler waits there, after its dedup insert and before its commit.
    async fn ledger(db: &TestDb) -> Self {
        let mut holder = Self::begin(db).await;
        holder
            .run("LOCK TABLE dedup_worker.event_ledger IN EXCLUSIVE MODE")
            .await;
        holder
    }

    async fn run(&mut self, sql: &str) {
        sqlx::query(sql)
            .execute(&mut self.0)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn commit(mut self) {
        self.run("COMMIT").await;
        self.0.close().await.ok();
    }
}

/// Sessions of the database waiting on a heavyweight lock, `kind` (`advisory`, `relation`,
/// `transactionid`…) or any.
async fn lock_waiters(observer: &PgPool, kind: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'
            AND backend_type = 'client backend' AND ($1::text IS NULL OR wait_event = $1)",
    )
    .bind(kind)
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity")
}

/// Waits until exactly `n` sessions wait on a lock of `kind` (any with `None`); on a timeout,
/// fails with what every session of the database was doing.
async fn wait_for_waiters(observer: &PgPool, kind: Option<&str>, n: i64, what: &str) {
    let waited = poll_until(Duration::from_secs(20), || async move {
        (lock_waiters(observer, kind).await == n).then_some(())
    })
    .await;
    if waited.is_none() {
        let sessions: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT state, wait_event, left(query, 120) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(observer)
        .await
        .unwrap_or_default();
        panic!("timed out waiting for {what}; the database's sessions: {sessions:#?}");
    }
}

/// The binary on `db`: database queue, the `ledger` handler (whose table has no unique key: an
/// event handled twice has two rows), two consumer workers, retention every `retention_secs`.
fn start_binary(
    db: &TestDb,
    queue: &TestQueue,
    retention_secs: u64,
    log_dir: &std::path::Path,
) -> RunningBinary {
    RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
            ("DEDUP_CONSUMER__HANDLER", "ledger".into()),
            ("DEDUP_CONSUMER__WORKERS", "2".into()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "100ms".into()),
            (
                "DEDUP_CONSUMER__RETENTION_INTERVAL",
                format!("{retention_secs}s"),
            ),
            ("DEDUP_TRANSPORT", queue.kind().into()),
            ("DEDUP_QUEUE", queue.name.clone()),
        ],
        log_dir,
    )
}

/// Seals the current generation (expiring what is due first), as `store.dedup().seal`
/// does, asking again while another process's retention pass holds the retention lock (the
/// binary runs one at start and every interval): a pass that was not ours did nothing.
async fn seal(store: &Store) -> RingMaintenance {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let done = store.dedup().seal(WINDOW).await.expect("seal");
        if done.sealed || done.next_slot_busy {
            return done;
        }
        assert!(Instant::now() < deadline, "the retention lock stayed taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts the signed Stripe event `id` to the binary until it is accepted (a 503 is the right
/// answer when the store is slow on a loaded machine; Stripe retries it).
async fn deliver(client: &reqwest::Client, bin: &RunningBinary, id: &str) {
    let status = post_signed_until_not_503(
        client,
        &bin.url("/webhooks/stripe"),
        SECRET,
        stripe_event(id, "invoice.paid"),
    )
    .await
    .status();
    assert_eq!(status, 200, "{id} accepted");
}
