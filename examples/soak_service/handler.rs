//! The soak's handler: one effect row per call and the event forwarded, in the batch
//! transaction, so both commit with the dedup record or not at all.

use dedup_worker::async_trait;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::dedup::RING_SLOTS;
use dedup_worker_core::store::{dedup_key, Backend, DbTx};

/// A deliberately broken service (`SOAK_SERVICE_FAULT`), for showing that the checker fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceFault {
    /// Deletes the event's dedup record in the handler's transaction: the effect commits without
    /// it, so a later duplicate is handled again.
    ForgetDedup,
    /// Forwards nothing for about one event in fifty (chosen by the id, so every process
    /// agrees): the event is handled, and never reaches the sink.
    DropForward,
    /// The API role's handler writes its row on a connection of its own, committed at once,
    /// not in the layer's transaction (`soak_service api`): a request that fails after it, or
    /// whose process dies before the layer stores the answer, leaves the row, and the retry
    /// writes another. The pipeline's handler is correct under it.
    ApiOutsideTx,
}

impl ServiceFault {
    /// `SOAK_SERVICE_FAULT`, if set.
    pub fn from_env() -> Result<Option<Self>, UnknownFault> {
        match std::env::var("SOAK_SERVICE_FAULT") {
            Ok(value) if !value.is_empty() => Ok(Some(value.parse()?)),
            _ => Ok(None),
        }
    }
}

/// Why `SOAK_SERVICE_FAULT` is refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "SOAK_SERVICE_FAULT={0:?} is not one of: forget-dedup, drop-forward, api-outside-tx (or unset)"
)]
pub struct UnknownFault(String);

impl std::str::FromStr for ServiceFault {
    type Err = UnknownFault;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "forget-dedup" => Ok(ServiceFault::ForgetDedup),
            "drop-forward" => Ok(ServiceFault::DropForward),
            "api-outside-tx" => Ok(ServiceFault::ApiOutsideTx),
            other => Err(UnknownFault(other.to_owned())),
        }
    }
}

/// Records each call in `soak_effects` and forwards the event.
pub struct SoakEffects {
    /// `SOAK_PROCESS`, written into each row.
    process: String,
    fault: Option<ServiceFault>,
}

impl SoakEffects {
    /// From `SOAK_PROCESS` and `SOAK_SERVICE_FAULT`.
    pub fn from_env() -> Result<Self, UnknownFault> {
        let fault = ServiceFault::from_env()?;
        Ok(SoakEffects {
            process: std::env::var("SOAK_PROCESS").unwrap_or_else(|_| "unnamed".to_owned()),
            fault,
        })
    }
}

/// The id in the payload (a thin event's own id, not its snapshot's; empty for a foreign
/// message whose id travelled only as the transport's property).
#[derive(serde::Deserialize)]
struct PayloadId {
    #[serde(default)]
    id: String,
}

#[async_trait]
impl Handler for SoakEffects {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        let payload_id = event.json::<PayloadId>()?.id;
        let attempt = i32::try_from(event.delivery_attempt).unwrap_or(i32::MAX);
        dedup_worker::execute!(
            tx,
            "INSERT INTO public.soak_effects \
             (source, event_id, event_type, payload_id, process, delivery_attempt) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &event.source,
            &event.id,
            &event.event_type,
            &payload_id,
            &self.process,
            attempt
        )?;
        match self.fault {
            Some(ServiceFault::ForgetDedup) => forget_dedup_record(event, tx).await?,
            Some(ServiceFault::DropForward) if dropped(&event.id) => return Ok(Vec::new()),
            _ => {}
        }
        Ok(vec![OutboxMessage::forward(event)])
    }

    fn backends(&self) -> &'static [Backend] {
        &[Backend::Postgres]
    }
}

/// The broken service's deletion of the dedup row the consumer just inserted, in every
/// generation of the ring (whichever is current).
async fn forget_dedup_record(event: &Event, tx: &mut DbTx<'_>) -> Result<(), HandlerError> {
    let key = uuid::Uuid::from_bytes(dedup_key(&event.source, &event.id));
    for slot in 0..RING_SLOTS {
        let sql = format!("DELETE FROM dedup_worker.processed_events_{slot} WHERE key = $1");
        dedup_worker::execute!(tx, &sql, key)?;
    }
    Ok(())
}

/// About one id in fifty (5 of 256), the same in every process.
fn dropped(id: &str) -> bool {
    dedup_key("drop-forward", id)[0] < 5
}
