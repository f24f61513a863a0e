//! The stateful property test of the dedup record (issues 26 and 36): random schedules of
//! batches on several connections (begin, insert deliveries new, repeated and shared between open
//! batches, undo one record as the consumer does when a handler fails, commit or roll back),
//! seals, retention passes, window changes and time travel (generations sealed days apart), on
//! both stores, the PostgreSQL ones with the database's `default_transaction_isolation` at each
//! level PostgreSQL offers, against a model ([`model`]) that predicts every answer and which
//! calls wait on which lock. A change has two ids: its key, which every copy is claimed under,
//! and the id an earlier release gave one of its messages, which copies carry as their alias;
//! the earlier release's records are made by batches (deliveries under the old id) and in the
//! legacy table.
//!
//! Checked after every step, on what the store answered ([`sut`]):
//! * an id committed less than the window ago (the shortest window in effect since) is never
//!   recorded as new again, nor is a change whose copies all carry an alias recorded (committed
//!   before the insert, or by the same batch) ("ACCEPTED TWICE"); nor is an id taken for a
//!   duplicate if neither it nor its alias was ever committed ("LOST");
//! * it is still recorded (`store.dedup().processed_among`) until then ("LOST EARLY"), and an id no committed
//!   batch recorded (or one its batch undid) is not ("ROLLED BACK");
//! * the ring has one current generation ("RING");
//! * and every answer, every wait, the ring's shape and what is recorded are the model's
//!   ("MODEL").
//!
//! Deterministic: a fixed seed (`PROPTEST_RNG_SEED` overrides it), no failure persistence; a
//! failure prints the shrunk schedule. Sized by `CASES` × up to `STEPS` steps per store variant
//! (`PROPTEST_CASES` overrides the cases); a run of the full size fails if it never reached a
//! corner of aliases or of the handler-failure path ([`Coverage`]).

mod model;
mod schedule;
mod sut;

use std::cell::{Cell, RefCell};
use std::time::Duration;

use dedup_worker_core::store::{RingMaintenance, Store, StoreError, StoreTx};
use proptest::test_runner::{Config, RngSeed, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use sqlx::PgPool;
use tokio::task::JoinHandle;

use crate::helpers::db::{database_name, pg_admin_url};
use crate::helpers::{Backend, TestDb};
use schedule::DedupModel;
use sut::DedupTest;

/// Schedules per store variant, and the longest schedule.
const CASES: u32 = 128;
const STEPS: usize = 40;
const SEED: u64 = 26;

#[test]
fn postgres_read_committed() {
    run::<true>(Backend::Postgres, Some("read committed"), 0);
}

#[test]
fn postgres_repeatable_read() {
    run::<true>(Backend::Postgres, Some("repeatable read"), 1);
}

#[test]
fn postgres_serializable() {
    run::<true>(Backend::Postgres, Some("serializable"), 2);
}

#[test]
fn sqlite() {
    run::<false>(Backend::Sqlite, None, 3);
}

/// A call of a case that failed, ended by the next case.
enum Leftover {
    Begin(JoinHandle<Result<StoreTx, StoreError>>),
    Insert(JoinHandle<(StoreTx, Result<Vec<String>, StoreError>)>),
    Maintenance(JoinHandle<Result<RingMaintenance, StoreError>>),
    Tx(StoreTx),
}

/// What the cases of one test share: the runtime, the database and a store on it.
struct Context {
    rt: tokio::runtime::Runtime,
    db_url: String,
    store: Store,
    /// PostgreSQL: a session of its own that watches the others wait.
    observer: Option<PgPool>,
    leftovers: Vec<Leftover>,
    coverage: Coverage,
}

/// What the schedules exercised, summed over the cases (printed at the end: is the property
/// reaching the corners it is about?).
#[derive(Debug, Default)]
struct Coverage {
    cases: u32,
    steps: u32,
    inserts: u32,
    /// Ids answered as duplicates of an id recorded in a sealed generation.
    duplicates_in_sealed: u32,
    /// Deliveries that carried an alias.
    aliased: u32,
    /// Changes answered as duplicates because their alias is recorded: in a sealed generation,
    /// the current one, the legacy table, or earlier by the same batch.
    alias_in_sealed: u32,
    alias_in_current: u32,
    alias_in_legacy: u32,
    alias_in_batch: u32,
    /// Changes recorded as new while another open batch held their alias uncommitted (the
    /// lookup sees committed records only).
    alias_uncommitted: u32,
    /// Inserts of a copy carrying an alias that waited for another batch's claim of the change.
    aliased_waits_for_key: u32,
    /// Records an earlier release made in the legacy table.
    legacy_records: u32,
    /// `delete_processed` calls (a handler failed), and ids recorded as new again after one.
    undone: u32,
    new_again: u32,
    /// Calls that waited: a batch for an id another holds, a batch behind a seal, a begin
    /// behind the writer, a seal or expiry for the batches.
    waits_for_key: u32,
    waits_for_ring: u32,
    /// … of which behind a pass that expires a generation.
    waits_behind_expiry: u32,
    waits_for_begin: u32,
    waits_of_maintenance: u32,
    seals: u32,
    expired: u32,
    next_slot_busy: u32,
    /// The longest a maintenance pass took from its call to its answer (it waits for the ring
    /// lock at most `RING_LOCK_TIMEOUT`, 2 s, and fails after: the steps must be quicker).
    longest_maintenance_ms: u64,
}

thread_local! {
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
    /// Cases begun, and the first that failed (before shrinking).
    static CASES_RUN: Cell<u32> = const { Cell::new(0) };
    static FIRST_FAILURE: Cell<Option<u32>> = const { Cell::new(None) };
}

fn with_context<R>(f: impl FnOnce(&mut Context) -> R) -> R {
    CONTEXT.with(|c| f(c.borrow_mut().as_mut().expect("the test's context")))
}

fn leave(left: Vec<Leftover>) {
    CONTEXT.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if let Some(ctx) = c.as_mut() {
                ctx.leftovers.extend(left);
            }
        }
    });
}

impl Context {
    /// Empties the dedup record and starts the ring afresh (slot 0 current, started now). A
    /// failed case's leftovers are ended first, on fresh connections.
    async fn reset(&mut self) {
        if !self.leftovers.is_empty() {
            for left in self.leftovers.drain(..) {
                match left {
                    Leftover::Begin(h) => h.abort(),
                    Leftover::Insert(h) => h.abort(),
                    Leftover::Maintenance(h) => h.abort(),
                    Leftover::Tx(tx) => drop(tx),
                }
            }
            if let Some(observer) = &self.observer {
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .execute(observer)
                .await
                .expect("end the failed case's sessions");
            }
            self.store.close().await;
            self.store = connect(&self.db_url).await;
        }
        let tables = (0..5).map(|s| format!("processed_events_{s}"));
        if let Some(pool) = self.store.postgres_pool() {
            let all: Vec<String> = tables.collect();
            sqlx::raw_sql(&format!(
                "TRUNCATE {}, processed_events_legacy;
                 DELETE FROM dedup_generations;
                 INSERT INTO dedup_generations (slot) VALUES (0);",
                all.join(", ")
            ))
            .execute(pool)
            .await
            .expect("reset");
        } else if let Some(pool) = self.store.sqlite_pool() {
            let more = ["processed_events_legacy".into(), "dedup_generations".into()];
            for table in tables.chain(more) {
                sqlx::query(&format!("DELETE FROM {table}"))
                    .execute(pool)
                    .await
                    .expect("reset");
            }
            sqlx::query("INSERT INTO dedup_generations (slot, started_at) VALUES (0, $1)")
                .bind(chrono::Utc::now().timestamp_millis())
                .execute(pool)
                .await
                .expect("reset");
        }
    }

    /// Moves every timestamp of the ring `seconds` back: the model's clock moves on.
    async fn travel(&self, seconds: i64) {
        let done = if let Some(pool) = self.store.postgres_pool() {
            sqlx::query(
                "UPDATE dedup_generations
                    SET started_at = started_at - make_interval(secs => $1),
                        sealed_at = sealed_at - make_interval(secs => $1)",
            )
            .bind(seconds as f64)
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
        } else {
            sqlx::query(
                "UPDATE dedup_generations
                    SET started_at = started_at - $1, sealed_at = sealed_at - $1",
            )
            .bind(seconds * 1000)
            .execute(self.store.sqlite_pool().expect("one of the two"))
            .await
            .map(|done| done.rows_affected())
        };
        done.expect("time travel");
    }

    /// Records `id` in the legacy table, as a release before the ring did (committed at once).
    async fn record_legacy(&self, id: &str) {
        let done = if let Some(pool) = self.store.postgres_pool() {
            sqlx::query(
                "INSERT INTO processed_events_legacy (source, event_id, event_type)
                 VALUES ($1, $2, 'test.event')",
            )
            .bind(model::SOURCE)
            .bind(id)
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
        } else {
            sqlx::query(
                "INSERT INTO processed_events_legacy (source, event_id, event_type, processed_at)
                 VALUES ($1, $2, 'test.event', $3)",
            )
            .bind(model::SOURCE)
            .bind(id)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(self.store.sqlite_pool().expect("one of the two"))
            .await
            .map(|done| done.rows_affected())
        };
        assert_eq!(done.expect("a legacy record"), 1);
    }

    /// `(slot, current)` of each generation in use.
    async fn generations(&self) -> Vec<(i64, bool)> {
        let sql = "SELECT CAST(slot AS BIGINT), sealed_at IS NULL FROM dedup_generations
                    ORDER BY slot";
        match (self.store.postgres_pool(), self.store.sqlite_pool()) {
            (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
            (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
            (None, None) => unreachable!(),
        }
        .expect("the ring")
    }

    /// PostgreSQL: the sessions of the database waiting on a lock.
    async fn lock_waiters(&self) -> i64 {
        let observer = self.observer.as_ref().expect("PostgreSQL");
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND backend_type = 'client backend'",
        )
        .fetch_one(observer)
        .await
        .expect("pg_stat_activity")
    }
}

async fn connect(url: &str) -> Store {
    Store::connect_url(url, 8, Duration::from_secs(5))
        .await
        .expect("connect the store")
}

/// Runs the property on a database of its own: `isolation` is the PostgreSQL database's
/// `default_transaction_isolation` (the store must not depend on it); each variant's schedules
/// come from the seed plus `variant`.
fn run<const POSTGRES: bool>(backend: Backend, isolation: Option<&str>, variant: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Timers and spawns outside `block_on` too (the steps build their timeouts first).
    let handle = rt.handle().clone();
    let _in_runtime = handle.enter();
    let db = rt.block_on(TestDb::new(backend));
    let observer = rt.block_on(async {
        let migrated = db.store().await;
        migrated.close().await;
        let level = isolation?;
        let admin = PgPool::connect(&pg_admin_url()).await.expect("admin");
        sqlx::query(&format!(
            "ALTER DATABASE {} SET default_transaction_isolation = '{level}'",
            database_name(&db.url)
        ))
        .execute(&admin)
        .await
        .expect("set the database's default isolation");
        admin.close().await;
        Some(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&db.url)
                .await
                .expect("observer"),
        )
    });
    assert_eq!(observer.is_some(), POSTGRES);
    // Connected after the database's default was set: its sessions start with it.
    let store = rt.block_on(connect(&db.url));
    CONTEXT.with(|c| {
        *c.borrow_mut() = Some(Context {
            rt,
            db_url: db.url.clone(),
            store,
            observer,
            leftovers: Vec::new(),
            coverage: Coverage::default(),
        })
    });

    let mut config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(CASES),
        failure_persistence: None,
        max_shrink_time: 300_000,
        ..Config::default()
    };
    let seed = match config.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => SEED,
    };
    config.rng_seed = RngSeed::Fixed(seed + variant);
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(
        &DedupModel::<POSTGRES>::sequential_strategy(1..=STEPS),
        |(initial, steps, seen)| {
            DedupTest::<POSTGRES>::test_sequential(config.clone(), initial, steps, seen);
            Ok(())
        },
    );

    let ctx = CONTEXT
        .with(|c| c.borrow_mut().take())
        .expect("the context");
    eprintln!(
        "dedup model on {backend:?} (database default {isolation:?}): {:?}, first failure in \
         case {:?}",
        ctx.coverage,
        FIRST_FAILURE.with(|f| f.get())
    );
    ctx.rt.block_on(async {
        for left in ctx.leftovers {
            if let Leftover::Tx(tx) = left {
                drop(tx);
            }
        }
        ctx.store.close().await;
        if let Some(observer) = ctx.observer {
            observer.close().await;
        }
        db.remove().await;
    });
    if let Err(failure) = result {
        panic!(
            "{failure}\n(PROPTEST_RNG_SEED={seed} replays it; {backend:?}, database default \
             {isolation:?})"
        );
    }
    // A run of the full size that never reached a corner of aliases or of the handler-failure
    // path would pass without testing it (a change to the weights, the model or the store can
    // make the schedules miss it); shorter runs are for replays.
    let unreached = ctx.coverage.unreached(POSTGRES);
    assert!(
        config.cases < CASES || unreached.is_empty(),
        "the schedules never reached {unreached:?} (seed {seed}; {backend:?}, database default \
         {isolation:?})"
    );
}

impl Coverage {
    /// The counts of aliases and of `delete_processed` that are still zero. On SQLite one batch
    /// is open at a time: no batch holds an alias or a change another one inserts.
    fn unreached(&self, postgres: bool) -> Vec<&'static str> {
        let mut counts = vec![
            ("alias_in_sealed", self.alias_in_sealed),
            ("alias_in_current", self.alias_in_current),
            ("alias_in_legacy", self.alias_in_legacy),
            ("alias_in_batch", self.alias_in_batch),
            ("undone", self.undone),
            ("new_again", self.new_again),
        ];
        if postgres {
            counts.push(("alias_uncommitted", self.alias_uncommitted));
            counts.push(("aliased_waits_for_key", self.aliased_waits_for_key));
        }
        counts
            .into_iter()
            .filter(|(_, n)| *n == 0)
            .map(|(name, _)| name)
            .collect()
    }
}
