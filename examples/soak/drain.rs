//! The drain and the final reading. After the run every fault is healed and every process is
//! running again; the sender keeps retrying what is unanswered, and the drain polls until every
//! accepted event is at both sinks (the ordered one: answered 2xx) and nothing is left in any
//! queue or in the outbox, or until nothing has moved for [`STALL`], or the deadline. Then the
//! processes are stopped (SIGTERM) and the effect table, the dead letters, the outbox's failed
//! rows and the ordered sink's lane (its commit order) are read and written into the run's
//! directory.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use dedup_worker_core::store::Store;
use serde::Serialize;
use tokio::time::Instant;

use crate::api_check::ApiEffectRow;
use crate::checker::{DeadLetterRow, EffectRow};
use crate::history_check::{self, HistoryTables};
use crate::infra::{Infra, CALL_TIMEOUT};
use crate::order_check::LaneRow;
use crate::settings::ORDERED_SINK;
use crate::sink::SinkSeen;

/// Nothing moved (no delivery at the sink, no effect row, no answer to the sender) this long:
/// the drain stops waiting. Longer than a lease, a relay's backoff and a sender's timeout.
const STALL: Duration = Duration::from_secs(60);
/// Polls in a row that must find everything drained (a message in flight between two reads
/// of the queues could hide once).
const QUIET_POLLS: u32 = 3;

/// How the drain ended.
#[derive(Debug, Clone, Serialize)]
pub struct Drained {
    /// Every accepted event at the sink, every queue and the outbox empty.
    pub complete: bool,
    /// Why not, if not.
    pub stopped_by: Option<String>,
    pub seconds: u64,
    /// Accepted keys not at both sinks when it ended.
    pub missing: usize,
}

pub struct DrainWatch<'a> {
    pub infra: &'a Infra,
    pub store: &'a Store,
    pub accepted: &'a Arc<Mutex<HashSet<String>>>,
    pub seen: &'a Arc<SinkSeen>,
    pub sender_done: &'a dyn Fn() -> bool,
    pub deadline: Duration,
}

impl DrainWatch<'_> {
    pub async fn wait(&self) -> Drained {
        let started = Instant::now();
        let mut last_progress = Instant::now();
        let mut progress = (u64::MAX, u64::MAX, i64::MIN, 0usize);
        let mut quiet = 0;
        loop {
            let missing = self.missing();
            let effects = effect_count(self.store).await.unwrap_or(-1);
            let accepted = self.accepted.lock().expect("accepted").len();
            let now = (
                self.seen.deliveries.load(Ordering::SeqCst),
                self.seen.ordered_deliveries.load(Ordering::SeqCst),
                effects,
                accepted,
            );
            if now != progress {
                progress = now;
                last_progress = Instant::now();
            }
            if missing == 0 && (self.sender_done)() && self.queues_empty().await {
                quiet += 1;
                if quiet >= QUIET_POLLS {
                    return self.ended(started, true, None);
                }
            } else {
                quiet = 0;
            }
            if last_progress.elapsed() >= STALL {
                return self.ended(started, false, Some(format!("nothing moved for {STALL:?}")));
            }
            if started.elapsed() >= self.deadline {
                let why = format!("the drain's deadline ({:?}) passed", self.deadline);
                return self.ended(started, false, Some(why));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn missing(&self) -> usize {
        let accepted = self.accepted.lock().expect("accepted");
        let at_sink = self.seen.keys.lock().expect("sink");
        let at_ordered = self.seen.ordered_keys.lock().expect("sink");
        accepted
            .iter()
            .filter(|k| !at_sink.contains(*k) || !at_ordered.contains(*k))
            .count()
    }

    async fn queues_empty(&self) -> bool {
        let depths = self.infra.queue_depths(self.store).await;
        let pending = tokio::time::timeout(CALL_TIMEOUT, self.store.outbox().counts()).await;
        depths == [0, 0, 0] && matches!(pending, Ok(Ok(c)) if c.pending == 0)
    }

    fn ended(&self, started: Instant, complete: bool, stopped_by: Option<String>) -> Drained {
        Drained {
            complete,
            stopped_by,
            seconds: started.elapsed().as_secs(),
            missing: self.missing(),
        }
    }
}

async fn effect_count(store: &Store) -> anyhow::Result<i64> {
    let pool = store.postgres_pool().context("a PostgreSQL store")?;
    let count = sqlx::query_scalar("SELECT count(*) FROM public.soak_effects").fetch_one(pool);
    Ok(tokio::time::timeout(CALL_TIMEOUT, count).await??)
}

/// What the store holds after the processes stopped.
pub struct FinalState {
    pub effects: Vec<EffectRow>,
    pub api_effects: Vec<ApiEffectRow>,
    pub dead_letters: Vec<DeadLetterRow>,
    pub outbox_failed: usize,
    pub outbox_pending: i64,
    /// The ordered sink's rows in the outbox, in id order (`ordered_outbox.jsonl`).
    pub ordered_lane: Vec<LaneRow>,
    /// Messages left in the database queue, RabbitMQ and SQS.
    pub left_in_queues: [i64; 3],
    /// The history tables (`history_tables.json`): bodies, counts, attempts.
    pub history: HistoryTables,
}

/// Reads the final state and writes it into `run_dir` (`effects.jsonl`, `api_effects.jsonl`,
/// `dead_letters.txt`, `outbox_failed.txt`, `ordered_outbox.jsonl`, `history_tables.json`).
pub async fn read_final(
    store: &Store,
    infra: &Infra,
    run_dir: &Path,
) -> anyhow::Result<FinalState> {
    let pool = store.postgres_pool().context("a PostgreSQL store")?;
    let rows: Vec<(String, String, String, i32, i32, i64)> = bounded(
        "reading soak_effects",
        sqlx::query_as(
            "SELECT event_id, payload_id, process, backend_pid, delivery_attempt, \
                    (extract(epoch FROM inserted_at) * 1000000)::bigint \
             FROM public.soak_effects ORDER BY inserted_at",
        )
        .fetch_all(pool),
    )
    .await?;
    let effects: Vec<EffectRow> = rows
        .into_iter()
        .map(
            |(event_id, payload_id, process, backend_pid, delivery_attempt, inserted_at_us)| {
                EffectRow {
                    event_id,
                    payload_id,
                    process,
                    backend_pid,
                    delivery_attempt,
                    inserted_at_us,
                }
            },
        )
        .collect();
    write_jsonl(&run_dir.join("effects.jsonl"), &effects)?;
    let api_rows: Vec<(i64, String, String, i64, String, String, i32)> = bounded(
        "reading soak_api_effects",
        sqlx::query_as(
            "SELECT id, tenant, idem_key, amount, seen_tenant, process, backend_pid \
             FROM public.soak_api_effects ORDER BY id",
        )
        .fetch_all(pool),
    )
    .await?;
    let api_effects: Vec<ApiEffectRow> = api_rows
        .into_iter()
        .map(
            |(id, tenant, idem_key, amount, seen_tenant, process, backend_pid)| ApiEffectRow {
                id,
                tenant,
                idem_key,
                amount,
                seen_tenant,
                process,
                backend_pid,
            },
        )
        .collect();
    write_jsonl(&run_dir.join("api_effects.jsonl"), &api_effects)?;

    let dead_letters = bounded("reading dead letters", store.dead_letters().list(100_000)).await?;
    let failed = bounded("reading failed outbox rows", store.outbox().failed(100_000)).await?;
    std::fs::write(
        run_dir.join("dead_letters.txt"),
        format!("{dead_letters:#?}\n"),
    )?;
    let dead_letters: Vec<DeadLetterRow> = dead_letters
        .into_iter()
        .map(|dead| DeadLetterRow {
            soak_key: serde_json::from_slice::<serde_json::Value>(&dead.payload)
                .ok()
                .and_then(|v| Some(v.get("soak_key")?.as_str()?.to_owned())),
            event_id: dead.event_id,
            error: dead.error,
        })
        .collect();
    write_jsonl(&run_dir.join("dead_letters.jsonl"), &dead_letters)?;
    std::fs::write(run_dir.join("outbox_failed.txt"), format!("{failed:#?}\n"))?;
    let ordered_lane = read_lane(store).await?;
    write_jsonl(&run_dir.join("ordered_outbox.jsonl"), &ordered_lane)?;
    let pending = bounded("counting the outbox", store.outbox().counts())
        .await?
        .pending;
    let left_in_queues = infra.queue_depths(store).await;
    let history = history_check::read(store).await?;
    std::fs::write(
        run_dir.join("history_tables.json"),
        serde_json::to_string(&history)?,
    )?;
    Ok(FinalState {
        effects,
        api_effects,
        dead_letters,
        outbox_failed: failed.len(),
        outbox_pending: pending,
        ordered_lane,
        left_in_queues,
        history,
    })
}

/// The ordered sink's rows, in id order: its commit order per key. Dispatched rows stay for
/// `outbox.retention_hours` (168 in the soak), far beyond any run.
async fn read_lane(store: &Store) -> anyhow::Result<Vec<LaneRow>> {
    let pool = store.postgres_pool().context("a PostgreSQL store")?;
    let sql = format!(
        "SELECT id, ordering_key, idempotency_key, status FROM {}.outbox \
         WHERE sink = $1 ORDER BY id",
        dedup_worker_core::store::SCHEMA
    );
    let rows: Vec<(i64, Option<String>, String, String)> = bounded(
        "reading the ordered sink's lane",
        sqlx::query_as(&sql).bind(ORDERED_SINK).fetch_all(pool),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, ordering_key, idempotency_key, status)| LaneRow {
            id,
            ordering_key,
            idempotency_key,
            status,
        })
        .collect())
}

/// One JSON object a line.
fn write_jsonl<T: serde::Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for row in rows {
        serde_json::to_writer(&mut file, row)?;
        file.write_all(b"\n")?;
    }
    file.flush()?;
    Ok(())
}

/// `call`, given up after six times [`CALL_TIMEOUT`] (these read whole tables).
pub(crate) async fn bounded<T, E>(
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let limit = CALL_TIMEOUT * 6;
    tokio::time::timeout(limit, call)
        .await
        .with_context(|| format!("{what}: no answer within {limit:?}"))?
        .context(what)
}
