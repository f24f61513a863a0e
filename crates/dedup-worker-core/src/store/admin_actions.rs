//! The record of the operator's bulk actions (`admin_actions`): [`AdminActions`], reached as
//! `store.admin_actions()`, each statement's PostgreSQL and SQLite form side by side.

use super::{now_ms, Pool, StoreError};

/// Who took which bulk action, when, with which filter, and how many rows it acted on. Written
/// once per action, never updated; read newest first.
#[derive(Debug, Clone, Copy)]
pub struct AdminActions<'a> {
    pub(super) pool: &'a Pool,
}

/// One recorded bulk action.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct AdminAction {
    pub id: i64,
    /// When it was recorded (its end), Unix milliseconds.
    pub at_ms: i64,
    /// Who acted: `console (…)` or `cli (…)`.
    pub actor: String,
    /// `dlq_redrive`, `outbox_retry` or `outbox_resend`.
    pub action: String,
    /// The filter it applied, as JSON text.
    pub filter: String,
    /// How many rows it acted on (before it stopped, if it failed part-way).
    pub count: i64,
}

impl AdminActions<'_> {
    /// Records one action; returns its id.
    pub async fn record(
        self,
        actor: &str,
        action: &str,
        filter: &str,
        count: i64,
    ) -> Result<i64, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_scalar(
                    "INSERT INTO admin_actions (actor, action, filter, count)
             VALUES ($1, $2, $3, $4) RETURNING id",
                )
                .bind(actor)
                .bind(action)
                .bind(filter)
                .bind(count)
                .fetch_one(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_scalar(
                    "INSERT INTO admin_actions (at, actor, action, filter, count)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
                )
                .bind(now_ms())
                .bind(actor)
                .bind(action)
                .bind(filter)
                .bind(count)
                .fetch_one(pool)
                .await?
            }
        })
    }

    /// The newest `limit` actions, newest first.
    pub async fn newest(self, limit: i64) -> Result<Vec<AdminAction>, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT id, floor(extract(epoch FROM at) * 1000)::int8 AS at_ms, actor, action,
                    filter, count
               FROM admin_actions ORDER BY id DESC LIMIT $1",
                )
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(
                    "SELECT id, at AS at_ms, actor, action, filter, count
               FROM admin_actions ORDER BY id DESC LIMIT $1",
                )
                .bind(limit)
                .fetch_all(pool)
                .await?
            }
        })
    }

    /// The action recorded as `id`, if it is there (a banner's "what was done").
    pub async fn get(self, id: i64) -> Result<Option<AdminAction>, StoreError> {
        Ok(match self.pool {
            Pool::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT id, floor(extract(epoch FROM at) * 1000)::int8 AS at_ms, actor, action,
                    filter, count
               FROM admin_actions WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await?
            }
            Pool::Sqlite(pool) => {
                sqlx::query_as(
                    "SELECT id, at AS at_ms, actor, action, filter, count
               FROM admin_actions WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await?
            }
        })
    }
}
