//! The lanes' shared state (`outbox_sinks`): [`Sinks`], reached as `store.sinks()`. Every relay
//! process reads it before claiming, so they agree on what the operator (pause), the circuit
//! breaker (open, half-open, the next probe) and the receiver (`Retry-After`) said. A lane
//! without a row is closed, not paused and not held. Times are Unix milliseconds in both stores
//! as read here; PostgreSQL keeps `timestamptz`, SQLite integers.

use std::time::Duration;

use super::postgres::secs;
use super::{millis, now_ms, Pool, StoreError};

/// The lanes' shared state (`outbox_sinks`).
#[derive(Debug, Clone, Copy)]
pub struct Sinks<'a> {
    pub(super) pool: &'a Pool,
}

/// A lane's circuit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Circuit {
    /// Delivering.
    #[default]
    Closed,
    /// Not delivering; a probe may go at `probe_at`.
    Open,
    /// One relay is sending a probe (until `probe_at`, its lease).
    HalfOpen,
}

impl Circuit {
    pub fn as_str(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half_open",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "open" => Circuit::Open,
            "half_open" => Circuit::HalfOpen,
            _ => Circuit::Closed,
        }
    }
}

/// One lane's row, as the relay, the console, the CLI and the gauges read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SinkState {
    pub sink: String,
    pub paused: bool,
    /// Who paused it (`cli (…)`, `console (…)`), and when.
    pub paused_by: Option<String>,
    pub paused_at_ms: Option<i64>,
    pub circuit: Circuit,
    pub opened_at_ms: Option<i64>,
    /// How many times its circuit opened, ever.
    pub trips: i64,
    /// Open: when the next probe may go; half-open: when the probe's lease ends.
    pub probe_at_ms: Option<i64>,
    /// The wait before the current probe (doubled after each failed one).
    pub probe_interval_ms: i64,
    /// The receiver's `Retry-After`: no delivery before it.
    pub hold_until_ms: Option<i64>,
    pub last_error: Option<String>,
    /// The store's clock when this was read, so remaining times need no clock of ours.
    pub read_at_ms: i64,
}

impl SinkState {
    /// How long the receiver's hold still lasts.
    pub fn held_for(&self) -> Option<Duration> {
        remaining(self.hold_until_ms, self.read_at_ms)
    }

    /// Open: how long until a probe may go (zero: now).
    pub fn probe_in(&self) -> Duration {
        remaining(self.probe_at_ms, self.read_at_ms).unwrap_or_default()
    }
}

fn remaining(until_ms: Option<i64>, now_ms: i64) -> Option<Duration> {
    let left = until_ms? - now_ms;
    (left > 0).then(|| Duration::from_millis(left as u64))
}

const PG_COLUMNS: &str = "sink, paused, paused_by,
       (extract(epoch FROM paused_at) * 1000)::int8, circuit,
       (extract(epoch FROM opened_at) * 1000)::int8, trips::int8,
       (extract(epoch FROM probe_at) * 1000)::int8, probe_interval_ms,
       (extract(epoch FROM hold_until) * 1000)::int8, last_error,
       (extract(epoch FROM now()) * 1000)::int8";
const SQLITE_COLUMNS: &str = "sink, paused, paused_by, paused_at, circuit, opened_at, trips,
       probe_at, probe_interval_ms, hold_until, last_error, $1";

type StateRow = (
    String,
    bool,
    Option<String>,
    Option<i64>,
    String,
    Option<i64>,
    i64,
    Option<i64>,
    i64,
    Option<i64>,
    Option<String>,
    i64,
);

fn state(row: StateRow) -> SinkState {
    SinkState {
        sink: row.0,
        paused: row.1,
        paused_by: row.2,
        paused_at_ms: row.3,
        circuit: Circuit::parse(&row.4),
        opened_at_ms: row.5,
        trips: row.6,
        probe_at_ms: row.7,
        probe_interval_ms: row.8,
        hold_until_ms: row.9,
        last_error: row.10,
        read_at_ms: row.11,
    }
}

impl Sinks<'_> {
    /// Lane `sink`'s state; a lane without a row is closed, not paused, not held.
    pub async fn gate(self, sink: &str) -> Result<SinkState, StoreError> {
        let row: Option<StateRow> = match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {PG_COLUMNS} FROM outbox_sinks WHERE sink = $1"
                ))
                .bind(sink)
                .fetch_optional(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {SQLITE_COLUMNS} FROM outbox_sinks WHERE sink = $2"
                ))
                .bind(now_ms())
                .bind(sink)
                .fetch_optional(pool)
                .await?
            }
        };
        Ok(row.map(state).unwrap_or_else(|| SinkState {
            sink: sink.to_owned(),
            read_at_ms: now_ms(),
            ..SinkState::default()
        }))
    }

    /// Every lane with a row, by name.
    pub async fn list(self) -> Result<Vec<SinkState>, StoreError> {
        let rows: Vec<StateRow> = match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {PG_COLUMNS} FROM outbox_sinks ORDER BY sink"
                ))
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(&format!(
                    "SELECT {SQLITE_COLUMNS} FROM outbox_sinks ORDER BY sink"
                ))
                .bind(now_ms())
                .fetch_all(pool)
                .await?
            }
        };
        Ok(rows.into_iter().map(state).collect())
    }

    /// Opens lane `sink`'s circuit, its first probe after `probe_after`. Returns the lane's
    /// trips so far if this call opened it; `None` if it was not closed (another relay opened
    /// it first, or it is probing), so an opening is logged and counted once.
    pub async fn trip(
        self,
        sink: &str,
        probe_after: Duration,
        error: &str,
    ) -> Result<Option<i64>, StoreError> {
        let interval = millis(probe_after);
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_scalar(
                    "INSERT INTO outbox_sinks AS s
                        (sink, circuit, opened_at, trips, probe_at, probe_interval_ms, last_error)
                 VALUES ($1, 'open', now(), 1, now() + make_interval(secs => $2), $3, $4)
                 ON CONFLICT (sink) DO UPDATE
                    SET circuit = 'open', opened_at = now(), trips = s.trips + 1,
                        probe_at = excluded.probe_at, probe_interval_ms = excluded.probe_interval_ms,
                        last_error = excluded.last_error, updated_at = now()
                  WHERE s.circuit = 'closed'
                 RETURNING trips::int8",
                )
                .bind(sink)
                .bind(secs(probe_after))
                .bind(interval)
                .bind(error)
                .fetch_optional(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query_scalar(
                    "INSERT INTO outbox_sinks AS s
                        (sink, circuit, opened_at, trips, probe_at, probe_interval_ms, last_error,
                         updated_at)
                 VALUES ($1, 'open', $2, 1, $3, $4, $5, $2)
                 ON CONFLICT (sink) DO UPDATE
                    SET circuit = 'open', opened_at = $2, trips = s.trips + 1,
                        probe_at = excluded.probe_at, probe_interval_ms = excluded.probe_interval_ms,
                        last_error = excluded.last_error, updated_at = $2
                  WHERE s.circuit = 'closed'
                 RETURNING trips",
                )
                .bind(sink)
                .bind(now)
                .bind(now + interval)
                .bind(interval)
                .bind(error)
                .fetch_optional(pool)
                .await?
            }
        })
    }

    /// Takes lane `sink`'s probe if its circuit is open (or a probe's lease ran out) and the
    /// probe is due, for `lease`: this relay alone then sends one row. Returns the interval
    /// waited before it (to double after a failure), `None` if another relay took it or it is
    /// not due, or the lane is paused.
    pub async fn take_probe(
        self,
        sink: &str,
        lease: Duration,
    ) -> Result<Option<Duration>, StoreError> {
        let interval: Option<i64> = match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_scalar(
                    "UPDATE outbox_sinks
                SET circuit = 'half_open', probe_at = now() + make_interval(secs => $2),
                    updated_at = now()
              WHERE sink = $1 AND NOT paused AND circuit IN ('open', 'half_open')
                AND probe_at <= now()
          RETURNING probe_interval_ms",
                )
                .bind(sink)
                .bind(secs(lease))
                .fetch_optional(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query_scalar(
                    "UPDATE outbox_sinks SET circuit = 'half_open', probe_at = $2, updated_at = $3
              WHERE sink = $1 AND NOT paused AND circuit IN ('open', 'half_open')
                AND probe_at <= $3
          RETURNING probe_interval_ms",
                )
                .bind(sink)
                .bind(now + millis(lease))
                .bind(now)
                .fetch_optional(pool)
                .await?
            }
        };
        Ok(interval.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    /// A probe failed: lane `sink` opens again, its next probe after `interval`.
    pub async fn probe_failed(
        self,
        sink: &str,
        interval: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query(
                    "UPDATE outbox_sinks
                SET circuit = 'open', probe_at = now() + make_interval(secs => $2),
                    probe_interval_ms = $3, last_error = $4, updated_at = now()
              WHERE sink = $1 AND circuit = 'half_open'",
                )
                .bind(sink)
                .bind(secs(interval))
                .bind(millis(interval))
                .bind(error)
                .execute(pool)
                .await?;
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query(
                    "UPDATE outbox_sinks
                SET circuit = 'open', probe_at = $2, probe_interval_ms = $3, last_error = $4,
                    updated_at = $5
              WHERE sink = $1 AND circuit = 'half_open'",
                )
                .bind(sink)
                .bind(now + millis(interval))
                .bind(millis(interval))
                .bind(error)
                .bind(now)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Closes lane `sink`'s circuit (a delivery went through). Returns whether it was open or
    /// half-open, so a closing is logged and counted once.
    pub async fn close(self, sink: &str) -> Result<bool, StoreError> {
        const SET: &str = "circuit = 'closed', opened_at = NULL, probe_at = NULL,
                           probe_interval_ms = 0";
        let closed = match self.pool {
            Pool::Postgres(pool) => sqlx::query(&format!(
                "UPDATE outbox_sinks SET {SET}, updated_at = now()
                  WHERE sink = $1 AND circuit <> 'closed'"
            ))
            .bind(sink)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(&format!(
                "UPDATE outbox_sinks SET {SET}, updated_at = $2
                  WHERE sink = $1 AND circuit <> 'closed'"
            ))
            .bind(sink)
            .bind(now_ms())
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(closed > 0)
    }

    /// The receiver asked for `delay` (`Retry-After`): no relay delivers to lane `sink` before
    /// then (an earlier, longer hold stands).
    pub async fn hold(self, sink: &str, delay: Duration) -> Result<(), StoreError> {
        match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query(
                    "INSERT INTO outbox_sinks AS s (sink, hold_until)
                 VALUES ($1, now() + make_interval(secs => $2))
                 ON CONFLICT (sink) DO UPDATE
                    SET hold_until = GREATEST(s.hold_until, excluded.hold_until),
                        updated_at = now()",
                )
                .bind(sink)
                .bind(secs(delay))
                .execute(pool)
                .await?;
            }
            Pool::Sqlite(pool) => {
                let now = now_ms();
                sqlx::query(
                    "INSERT INTO outbox_sinks AS s (sink, hold_until, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (sink) DO UPDATE
                    SET hold_until = max(coalesce(s.hold_until, 0), excluded.hold_until),
                        updated_at = $3",
                )
                .bind(sink)
                .bind(now + millis(delay))
                .bind(now)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Pauses lane `sink` for every relay (deliveries in flight finish). Returns whether it was
    /// running.
    pub async fn pause(self, sink: &str, by: &str) -> Result<bool, StoreError> {
        let paused = match self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "INSERT INTO outbox_sinks AS s (sink, paused, paused_by, paused_at)
                 VALUES ($1, true, $2, now())
                 ON CONFLICT (sink) DO UPDATE
                    SET paused = true, paused_by = $2, paused_at = now(), updated_at = now()
                  WHERE NOT s.paused",
            )
            .bind(sink)
            .bind(by)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(
                "INSERT INTO outbox_sinks AS s (sink, paused, paused_by, paused_at, updated_at)
                 VALUES ($1, 1, $2, $3, $3)
                 ON CONFLICT (sink) DO UPDATE
                    SET paused = 1, paused_by = $2, paused_at = $3, updated_at = $3
                  WHERE NOT s.paused",
            )
            .bind(sink)
            .bind(by)
            .bind(now_ms())
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(paused > 0)
    }

    /// Resumes lane `sink`: not paused, its circuit closed and the receiver's hold lifted (the
    /// operator says the receiver is fixed; if it is not, the breaker opens it again). Returns
    /// whether the lane had anything to lift.
    pub async fn resume(self, sink: &str) -> Result<bool, StoreError> {
        const SET: &str = "paused_by = NULL, paused_at = NULL, circuit = 'closed',
                           opened_at = NULL, probe_at = NULL, probe_interval_ms = 0,
                           hold_until = NULL";
        const WHERE: &str =
            "sink = $1 AND (paused OR circuit <> 'closed' OR hold_until IS NOT NULL)";
        let resumed = match self.pool {
            Pool::Postgres(pool) => sqlx::query(&format!(
                "UPDATE outbox_sinks SET paused = false, {SET}, updated_at = now() WHERE {WHERE}"
            ))
            .bind(sink)
            .execute(pool)
            .await?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(&format!(
                "UPDATE outbox_sinks SET paused = 0, {SET}, updated_at = $2 WHERE {WHERE}"
            ))
            .bind(sink)
            .bind(now_ms())
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(resumed > 0)
    }
}
