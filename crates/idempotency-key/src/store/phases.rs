//! The records of a request split into phases (see [`Phases`](crate::Phases)):
//! each finished phase's name and JSON output, written in the phase's own transaction and
//! guarded by the claim token like every write of a claimed key.

use std::time::Duration;

use sqlx::types::Json;

use super::PgIdempotencyStore;
use crate::records::{ClaimToken, Ownership, StoreError};

impl PgIdempotencyStore {
    /// The phases a claimed request has recorded (see
    /// [`Phases`](crate::Phases)): each finished phase's name and output. `None` if the claim
    /// was lost.
    pub(crate) async fn recorded_phases(
        &self,
        account: &str,
        key: &str,
        token: ClaimToken,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, StoreError> {
        self.count();
        let row: Option<Option<Json<serde_json::Map<String, serde_json::Value>>>> =
            sqlx::query_scalar(
                r#"SELECT phase_data FROM dedup_worker.idempotency_keys
                   WHERE account = $1 AND key = $2 AND claim_token = $3::uuid
                     AND status = 'in_progress'"#,
            )
            .bind(account)
            .bind(key)
            .bind(token.0.to_string())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|data| data.map(|Json(map)| map).unwrap_or_default()))
    }

    /// Records phase `name` as finished with `output`, inside `tx` (the phase's own writes
    /// commit with it). `Lost` if the claim was taken over; the caller then rolls back.
    pub(crate) async fn record_phase_in(
        &self,
        tx: &mut sqlx::PgConnection,
        account: &str,
        key: &str,
        token: ClaimToken,
        name: &str,
        output: &serde_json::Value,
    ) -> Result<Ownership, StoreError> {
        self.count();
        let done = sqlx::query(
            r#"UPDATE dedup_worker.idempotency_keys
                  SET recovery_point = $4,
                      phase_data = COALESCE(phase_data, '{}'::jsonb) || jsonb_build_object($4::text, $5::jsonb)
               WHERE account = $1 AND key = $2 AND claim_token = $3::uuid AND status = 'in_progress'"#,
        )
        .bind(account)
        .bind(key)
        .bind(token.0.to_string())
        .bind(name)
        .bind(Json(output))
        .execute(tx)
        .await?;
        Ok(if done.rows_affected() == 1 {
            Ownership::Owned {
                ttl: Duration::ZERO,
            }
        } else {
            Ownership::Lost
        })
    }
}
