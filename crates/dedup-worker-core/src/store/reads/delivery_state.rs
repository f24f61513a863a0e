//! Where the deliveries of a page of handled events stand ([`Reads::delivery_states`]): what
//! turns "handled" into "handled and delivered", "delivering", "delivery failing" or "delivery
//! failed" on the console's lists and `events list`.
//!
//! Two statements for a whole page, each bounded by it. The first joins the page's events to
//! their outbox rows through the time index (`outbox_created_at`): the rows are written in the
//! transaction that recorded the id, so `created_at = processed_at` exactly, as
//! [`Reads::outbox_of`] relies on. The second runs only for the events with no outbox row left
//! (none written, or dispatched rows purged after `outbox.retention_hours`): the latest relay
//! attempt of each of their outbox ids, from `outbox_attempts` (which outlives the rows).

use super::Reads;
use crate::store::dedup::dedup_key;
use crate::store::{Pool, StoreError};

/// One handled event of a page, as the list found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandledEvent {
    pub source: String,
    pub event_id: String,
    /// Its `processed_at`, Unix microseconds (the list's time: PostgreSQL keeps microseconds,
    /// and the outbox rows' `created_at` equals it exactly).
    pub processed_us: i64,
}

/// What the store says of one handled event's deliveries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryState {
    /// Its outbox rows still in the table.
    pub rows: i64,
    /// Rows that failed for good and were not skipped by an operator.
    pub failed: i64,
    /// Pending rows whose last attempt failed (they will be tried again).
    pub failing: i64,
    /// Pending rows (including the failing ones).
    pub pending: i64,
    /// With no outbox row left: the latest relay attempt's kind of each outbox id it had
    /// (`delivered`, `failed`, `gave_up`, …); empty when none is recorded either.
    pub latest_attempts: Vec<String>,
}

impl Reads<'_> {
    /// The delivery state of each of `events`, in their order.
    pub async fn delivery_states(
        self,
        events: &[HandledEvent],
    ) -> Result<Vec<DeliveryState>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut states = self.outbox_counts(events).await?;
        let gone: Vec<usize> = (0..events.len()).filter(|&i| states[i].rows == 0).collect();
        if !gone.is_empty() {
            let asked: Vec<&HandledEvent> = gone.iter().map(|&i| &events[i]).collect();
            for (j, kind) in self.latest_attempts(&asked).await? {
                states[gone[j]].latest_attempts.push(kind);
            }
        }
        Ok(states)
    }

    /// The first statement: the events' outbox rows counted by state.
    async fn outbox_counts(
        self,
        events: &[HandledEvent],
    ) -> Result<Vec<DeliveryState>, StoreError> {
        const COUNTS: &str = "count(o.id) AS n_rows,
            count(o.id) FILTER (WHERE o.status = 'failed' AND o.skipped_at IS NULL) AS n_failed,
            count(o.id) FILTER (WHERE o.status = 'pending' AND o.last_error IS NOT NULL) AS n_failing,
            count(o.id) FILTER (WHERE o.status = 'pending') AS n_pending";
        let rows: Vec<(i64, i64, i64, i64, i64)> = match self.pool {
            Pool::Postgres(pool) => {
                let sources: Vec<&str> = events.iter().map(|e| e.source.as_str()).collect();
                let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
                let times: Vec<i64> = events.iter().map(|e| e.processed_us).collect();
                sqlx::query_as(&format!(
                    "SELECT (u.i - 1)::int8 AS i, {COUNTS}
                       FROM UNNEST($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS u(s, e, t, i)
                       LEFT JOIN outbox o
                         ON o.created_at = 'epoch'::timestamptz + u.t * interval '1 microsecond'
                        AND o.source = u.s AND o.event_id = u.e
                      GROUP BY u.i"
                ))
                .bind(&sources)
                .bind(&ids)
                .bind(&times)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                // SQLite keeps milliseconds; the list's microseconds are those times 1,000.
                let page: Vec<(&str, &str, i64)> = events
                    .iter()
                    .map(|e| {
                        (
                            e.source.as_str(),
                            e.event_id.as_str(),
                            e.processed_us / 1000,
                        )
                    })
                    .collect();
                let page = serde_json::to_string(&page).expect("strings and numbers");
                sqlx::query_as(&format!(
                    "SELECT u.key AS i, {COUNTS}
                       FROM json_each($1) AS u
                       LEFT JOIN outbox o
                         ON o.created_at = json_extract(u.value, '$[2]')
                        AND o.source = json_extract(u.value, '$[0]')
                        AND o.event_id = json_extract(u.value, '$[1]')
                      GROUP BY u.key"
                ))
                .bind(page)
                .fetch_all(pool)
                .await?
            }
        };
        let mut states = vec![DeliveryState::default(); events.len()];
        for (i, rows, failed, failing, pending) in rows {
            if let Some(state) = states.get_mut(i as usize) {
                *state = DeliveryState {
                    rows,
                    failed,
                    failing,
                    pending,
                    latest_attempts: Vec::new(),
                };
            }
        }
        Ok(states)
    }

    /// The second statement: for each event (by its index in `events`), the latest relay
    /// attempt's kind of each outbox id recorded since it was processed. Operator acts (retry,
    /// resend, skip) are not deliveries and are passed over.
    async fn latest_attempts(
        self,
        events: &[&HandledEvent],
    ) -> Result<Vec<(usize, String)>, StoreError> {
        const RELAY_KINDS: &str = "a.kind NOT IN ('retry', 'resend', 'skip')";
        let rows: Vec<(i64, String)> = match self.pool {
            Pool::Postgres(pool) => {
                let keys: Vec<uuid::Uuid> = events
                    .iter()
                    .map(|e| uuid::Uuid::from_bytes(dedup_key(&e.source, &e.event_id)))
                    .collect();
                let times: Vec<i64> = events.iter().map(|e| e.processed_us).collect();
                sqlx::query_as(&format!(
                    "SELECT DISTINCT ON (u.i, a.outbox_id) (u.i - 1)::int8 AS i, a.kind
                       FROM UNNEST($1::uuid[], $2::int8[]) WITH ORDINALITY AS u(k, t, i)
                       JOIN outbox_attempts a
                         ON a.event_key = u.k
                        AND a.at >= 'epoch'::timestamptz + u.t * interval '1 microsecond'
                      WHERE {RELAY_KINDS}
                      ORDER BY u.i, a.outbox_id, a.at DESC, a.attempt DESC"
                ))
                .bind(&keys)
                .bind(&times)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                let page: Vec<(String, i64)> = events
                    .iter()
                    .map(|e| {
                        (
                            hex::encode(dedup_key(&e.source, &e.event_id)),
                            e.processed_us / 1000,
                        )
                    })
                    .collect();
                let page = serde_json::to_string(&page).expect("strings and numbers");
                // The latest by `at`, then by the row's own order (`id`) within one time.
                sqlx::query_as(&format!(
                    "SELECT i, kind FROM (
                        SELECT u.key AS i, a.kind,
                               row_number() OVER (PARTITION BY u.key, a.outbox_id
                                                  ORDER BY a.at DESC, a.id DESC) AS latest
                          FROM json_each($1) AS u
                          JOIN outbox_attempts a
                            ON a.event_key = unhex(json_extract(u.value, '$[0]'))
                           AND a.at >= json_extract(u.value, '$[1]')
                         WHERE {RELAY_KINDS})
                      WHERE latest = 1"
                ))
                .bind(page)
                .fetch_all(pool)
                .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|(i, kind)| (i as usize, kind))
            .collect())
    }
}
