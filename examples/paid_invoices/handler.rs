//! The handler: `invoice.paid` → one row in `paid_invoices` and one `invoice.recorded`
//! message for the sink, both in the consumer's transaction, so they commit with the dedup
//! record or not at all.

use dedup_worker::prelude::*;
use serde::{Deserialize, Serialize};

/// Records paid invoices; ignores every other event type.
pub struct PaidInvoices;

/// The part of a Stripe event this service reads: `data.object`.
#[derive(Deserialize)]
struct StripeEvent<T> {
    data: StripeData<T>,
}

#[derive(Deserialize)]
struct StripeData<T> {
    object: T,
}

/// The fields of Stripe's Invoice object the service keeps (and sends on).
#[derive(Debug, Deserialize, Serialize)]
pub struct Invoice {
    pub id: String,
    pub amount_paid: i64,
    pub currency: String,
}

#[async_trait]
impl Handler for PaidInvoices {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        if event.event_type != "invoice.paid" {
            return Ok(Vec::new());
        }
        // A payload that does not parse never will: `?` makes it a fatal error, so the event
        // is a dead letter after one attempt instead of eight.
        let invoice = event.json::<StripeEvent<Invoice>>()?.data.object;
        // The dedup record makes each *event* once; the key makes each *invoice* once, even if
        // two events (a resend under a new id) carry it.
        let inserted = dedup_worker::execute!(
            tx,
            "INSERT INTO paid_invoices (invoice_id, event_id, amount_paid, currency) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (invoice_id) DO NOTHING",
            &invoice.id,
            &event.id,
            invoice.amount_paid,
            &invoice.currency
        )?;
        if inserted == 0 {
            return Ok(Vec::new());
        }
        Ok(vec![OutboxMessage::json(
            "invoice.recorded",
            &event.id,
            &invoice,
        )?])
    }
}

#[cfg(test)]
mod tests {
    //! The handler on the test kit (`dedup-worker` with feature `testing`), on both stores:
    //! the service's own migrations applied after the library's, each call in one transaction
    //! as the consumer runs it.

    use dedup_worker::testing::{event, handle, Backend, TestDb};
    use serde_json::json;

    use super::PaidInvoices;

    fn invoice_paid(invoice: &str, amount_paid: serde_json::Value) -> Vec<u8> {
        json!({
            "id": "evt_unused",
            "object": "event",
            "type": "invoice.paid",
            "data": {"object": {
                "id": invoice, "object": "invoice", "amount_paid": amount_paid, "currency": "eur"
            }}
        })
        .to_string()
        .into_bytes()
    }

    async fn rows(db: &TestDb) -> Vec<(String, String, i64)> {
        const SQL: &str =
            "SELECT invoice_id, event_id, amount_paid FROM paid_invoices ORDER BY invoice_id";
        let store = db.store().await;
        let rows = match (store.postgres_pool(), store.sqlite_pool()) {
            (Some(pool), _) => sqlx::query_as(SQL).fetch_all(pool).await,
            (_, Some(pool)) => sqlx::query_as(SQL).fetch_all(pool).await,
            _ => unreachable!("a store is one or the other"),
        };
        store.close().await;
        rows.expect("read paid_invoices")
    }

    async fn records_each_invoice_once(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store_with(&crate::migrations()).await;
        let first = event(
            "stripe",
            "evt_1",
            "invoice.paid",
            &invoice_paid("in_1", json!(2000)),
        );
        let sent = handle(&store, &PaidInvoices, &first)
            .await
            .expect("handled");
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].event_type, "invoice.recorded");
        assert_eq!(sent[0].idempotency_key, "evt_1");
        let body: serde_json::Value = serde_json::from_slice(&sent[0].payload).expect("json");
        assert_eq!(
            body,
            json!({"id": "in_1", "amount_paid": 2000, "currency": "eur"})
        );

        // The same invoice under another event id: no second row, nothing more to send.
        let resent = event(
            "stripe",
            "evt_2",
            "invoice.paid",
            &invoice_paid("in_1", json!(2000)),
        );
        assert!(handle(&store, &PaidInvoices, &resent)
            .await
            .expect("handled")
            .is_empty());
        assert_eq!(rows(&db).await, vec![("in_1".into(), "evt_1".into(), 2000)]);
        store.close().await;
        db.remove().await;
    }

    async fn another_type_is_ignored(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store_with(&crate::migrations()).await;
        let created = event("stripe", "evt_3", "customer.created", br#"{"id":"evt_3"}"#);
        assert!(handle(&store, &PaidInvoices, &created)
            .await
            .expect("handled")
            .is_empty());
        assert!(rows(&db).await.is_empty());
        store.close().await;
        db.remove().await;
    }

    async fn a_malformed_invoice_is_fatal(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store_with(&crate::migrations()).await;
        let malformed = event(
            "stripe",
            "evt_4",
            "invoice.paid",
            &invoice_paid("in_4", json!("lots")),
        );
        let error = handle(&store, &PaidInvoices, &malformed)
            .await
            .expect_err("a payload that does not parse");
        assert!(error.is_fatal(), "{error:?}");
        assert!(rows(&db).await.is_empty());
        store.close().await;
        db.remove().await;
    }

    #[tokio::test]
    async fn records_each_invoice_once_on_postgres() {
        records_each_invoice_once(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn records_each_invoice_once_on_sqlite() {
        records_each_invoice_once(Backend::Sqlite).await;
    }

    #[tokio::test]
    async fn another_type_is_ignored_on_postgres() {
        another_type_is_ignored(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn another_type_is_ignored_on_sqlite() {
        another_type_is_ignored(Backend::Sqlite).await;
    }

    #[tokio::test]
    async fn a_malformed_invoice_is_fatal_on_postgres() {
        a_malformed_invoice_is_fatal(Backend::Postgres).await;
    }

    #[tokio::test]
    async fn a_malformed_invoice_is_fatal_on_sqlite() {
        a_malformed_invoice_is_fatal(Backend::Sqlite).await;
    }
}
