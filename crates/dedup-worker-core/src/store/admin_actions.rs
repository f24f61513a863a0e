//! The record of the operator's bulk actions (`admin_actions`): who took which action, when,
//! with which filter, and how many rows it acted on. Written once per action, never updated;
//! read newest first. Each statement once per store: the method, then its two forms below.

use super::{Pool, Store, StoreError};

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

impl Store {
    /// Records one action; returns its id.
    pub async fn record_admin_action(
        &self,
        actor: &str,
        action: &str,
        filter: &str,
        count: i64,
    ) -> Result<i64, StoreError> {
        on_pool!(self, record_admin_action(actor, action, filter, count))
    }

    /// The newest `limit` actions, newest first.
    pub async fn admin_actions(&self, limit: i64) -> Result<Vec<AdminAction>, StoreError> {
        on_pool!(self, admin_actions(limit))
    }
}

/// The PostgreSQL forms.
pub(super) mod postgres {
    use sqlx::PgPool;

    use super::AdminAction;
    use crate::store::StoreError;

    pub(super) async fn record_admin_action(
        pool: &PgPool,
        actor: &str,
        action: &str,
        filter: &str,
        count: i64,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "INSERT INTO admin_actions (actor, action, filter, count)
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(actor)
        .bind(action)
        .bind(filter)
        .bind(count)
        .fetch_one(pool)
        .await?)
    }

    pub(super) async fn admin_actions(
        pool: &PgPool,
        limit: i64,
    ) -> Result<Vec<AdminAction>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, floor(extract(epoch FROM at) * 1000)::int8 AS at_ms, actor, action,
                    filter, count
               FROM admin_actions ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }
}

/// The SQLite forms.
mod sqlite {
    use sqlx::SqlitePool;

    use super::AdminAction;
    use crate::store::{now_ms, StoreError};

    pub(super) async fn record_admin_action(
        pool: &SqlitePool,
        actor: &str,
        action: &str,
        filter: &str,
        count: i64,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "INSERT INTO admin_actions (at, actor, action, filter, count)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(now_ms())
        .bind(actor)
        .bind(action)
        .bind(filter)
        .bind(count)
        .fetch_one(pool)
        .await?)
    }

    pub(super) async fn admin_actions(
        pool: &SqlitePool,
        limit: i64,
    ) -> Result<Vec<AdminAction>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, at AS at_ms, actor, action, filter, count
               FROM admin_actions ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }
}
