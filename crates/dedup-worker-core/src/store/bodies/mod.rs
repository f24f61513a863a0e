//! Kept event bodies (`event_bodies`): the body of each event the consumer handled or held back
//! as stale, written in the batch's transaction, read back for the console's event page.
//! [`Bodies`], reached as `store.bodies()`, reads; `insert` (through
//! `StoreTx::insert_event_bodies`) writes. Each statement's PostgreSQL and SQLite forms side by
//! side.
//!
//! * **Once per event id** follows from who writes: the consumer passes the bodies of the
//!   batch's *fresh* events only (their ids recorded in this same transaction), never of
//!   duplicates, so the dedup key's uniqueness makes the body's; no unique index is paid for.
//! * **Compressed in Rust** ([`codec`]) before the transaction's statements.
//! * **The partition guard** (PostgreSQL): the table is partitioned by UTC day
//!   (`store/partitions.rs`). If today's partition is missing (maintenance failed for days), the
//!   insert would fail with "no partition of relation found for row" and take the whole batch
//!   with it, for ever; instead the statement inserts nothing, the batch commits, and the bodies
//!   not kept are counted (`dedup_history_not_kept_total{table}`) and warned of. A body is a
//!   record, not what the pipeline's correctness rests on.

pub mod codec;

use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::dedup::{self, dedup_key};
use super::partitions::history_not_kept;
use super::sqlite::CHUNK;
use super::{Pool, StoreError, StoreTx};
use crate::event::search_keys::{SearchKeys, SearchPointers};
use crate::event::Event;

/// The table's name, as `dedup_history_not_kept_total` labels it and partitions are named.
pub const TABLE: &str = "event_bodies";

/// One body to keep, ready to insert: compressed, its search keys taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEventBody {
    /// `dedup_key(source, event_id)`.
    pub key: [u8; 16],
    /// The event's source (first half of the dedup key).
    pub source: String,
    /// The event's id (second half of the dedup key).
    pub event_id: String,
    /// The event's type, empty when unknown.
    pub event_type: String,
    /// The searched fields (`[search]`), checked.
    pub search: SearchKeys,
    /// The sender headers the source keeps, in their wire form; `None` when there are none.
    pub headers: Option<String>,
    /// When the transport took the event in (Unix ms), where it says.
    pub received_at: Option<i64>,
    /// How `body` is stored ([`codec::Encoding::code`]).
    pub encoding: i16,
    /// The body as stored.
    pub body: Vec<u8>,
}

impl NewEventBody {
    /// What is kept of `event`: compressed, with its search keys at `pointers`. Pure CPU work,
    /// done before the batch's statements.
    pub fn of(event: &Event, received_at: Option<i64>, pointers: &SearchPointers) -> Self {
        let (encoding, body) = codec::encode(&event.payload);
        NewEventBody {
            key: dedup_key(&event.source, &event.id),
            source: event.source.clone(),
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            search: SearchKeys::extract(&event.payload, pointers),
            headers: event.headers.to_wire(),
            received_at,
            encoding: encoding.code(),
            body,
        }
    }
}

/// A kept body as read back, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBody {
    /// When it was kept (Unix ms): the event's `processed_at`.
    pub kept_at: i64,
    /// The event's type.
    pub event_type: String,
    /// The object id kept beside it (`search.object_pointer`).
    pub object_id: Option<String>,
    /// The customer kept beside it (`search.customer_pointer`).
    pub customer: Option<String>,
    /// The sender headers, in their wire form.
    pub headers: Option<String>,
    /// The body as received.
    pub body: Vec<u8>,
}

/// A row as stored, before decoding.
#[derive(sqlx::FromRow)]
struct StoredBody {
    kept_at: i64,
    event_type: String,
    object_id: Option<String>,
    customer: Option<String>,
    headers: Option<String>,
    encoding: i16,
    body: Vec<u8>,
}

/// Why a kept body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyReadError {
    #[error("reading the kept body failed")]
    Store(#[source] StoreError),
    #[error("the kept body cannot be decoded")]
    Decode(#[source] codec::DecodeError),
}

/// The kept bodies' reads.
#[derive(Debug, Clone, Copy)]
pub struct Bodies<'a> {
    pub(super) pool: &'a Pool,
}

impl Bodies<'_> {
    /// The body kept for `(source, event_id)`, if one is: looked up at the event's
    /// `processed_at` (its dedup record's, the same transaction's time), so PostgreSQL reads one
    /// day's partition and probes one index.
    pub async fn kept(
        self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<KeptBody>, BodyReadError> {
        let key = dedup_key(source, event_id);
        let times = dedup::processed_times();
        let stored: Option<StoredBody> = match self.pool {
            Pool::Postgres(pool) => sqlx::query_as(&format!(
                "SELECT floor(extract(epoch FROM kept_at) * 1000)::int8 AS kept_at, event_type,
                        object_id, customer, headers, encoding, body
                   FROM event_bodies
                  WHERE kept_at = ANY (ARRAY({times})) AND event_id = $3 AND source = $2
                  LIMIT 1"
            ))
            .bind(Uuid::from_bytes(key))
            .bind(source)
            .bind(event_id)
            .fetch_optional(pool)
            .await
            .map_err(|e| BodyReadError::Store(e.into()))?,
            Pool::Sqlite(pool) => sqlx::query_as(&format!(
                "SELECT kept_at, event_type, object_id, customer, headers, encoding, body
                   FROM event_bodies
                  WHERE kept_at IN ({times}) AND event_id = $3 AND source = $2
                  LIMIT 1"
            ))
            .bind(key.to_vec())
            .bind(source)
            .bind(event_id)
            .fetch_optional(pool)
            .await
            .map_err(|e| BodyReadError::Store(e.into()))?,
        };
        let Some(stored) = stored else {
            return Ok(None);
        };
        let body = codec::decode(stored.encoding, &stored.body).map_err(BodyReadError::Decode)?;
        Ok(Some(KeptBody {
            kept_at: stored.kept_at,
            event_type: stored.event_type,
            object_id: stored.object_id,
            customer: stored.customer,
            headers: stored.headers,
            body,
        }))
    }
}

/// Writes `rows` in the batch transaction, kept at the transaction's time (the events'
/// `processed_at`); returns how many were kept. PostgreSQL: one statement, guarded (see the
/// module docs); what the guard skipped is counted and warned of here.
pub(super) async fn insert(tx: &mut StoreTx, rows: &[NewEventBody]) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    match tx {
        StoreTx::Postgres(tx) => {
            let keys: Vec<Uuid> = rows.iter().map(|r| Uuid::from_bytes(r.key)).collect();
            let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
            let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
            let types: Vec<&str> = rows.iter().map(|r| r.event_type.as_str()).collect();
            let objects: Vec<Option<&str>> =
                rows.iter().map(|r| r.search.object_id.as_deref()).collect();
            let customers: Vec<Option<&str>> =
                rows.iter().map(|r| r.search.customer.as_deref()).collect();
            let headers: Vec<Option<&str>> = rows.iter().map(|r| r.headers.as_deref()).collect();
            let received: Vec<Option<i64>> = rows.iter().map(|r| r.received_at).collect();
            let encodings: Vec<i16> = rows.iter().map(|r| r.encoding).collect();
            let bodies: Vec<&[u8]> = rows.iter().map(|r| r.body.as_slice()).collect();
            let kept: i64 = sqlx::query_scalar(
                "WITH kept AS (
                 INSERT INTO event_bodies (kept_at, key, source, event_id, event_type, object_id,
                                           customer, headers, received_at, encoding, body)
                 SELECT now(), c.key, c.source, c.event_id, c.event_type, c.object_id, c.customer,
                        c.headers, to_timestamp(c.received_at / 1000.0::float8), c.encoding, c.body
                   FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                               $6::text[], $7::text[], $8::int8[], $9::int2[], $10::bytea[])
                        AS c(key, source, event_id, event_type, object_id, customer, headers,
                             received_at, encoding, body)
                  WHERE EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
                                 WHERE i.inhparent = 'event_bodies'::regclass
                                   AND p.relname = 'event_bodies_p'
                                       || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'))
                 RETURNING 1)
                 SELECT count(*) FROM kept",
            )
            .bind(&keys)
            .bind(&sources)
            .bind(&ids)
            .bind(&types)
            .bind(&objects)
            .bind(&customers)
            .bind(&headers)
            .bind(&received)
            .bind(&encodings)
            .bind(&bodies)
            .fetch_one(&mut **tx)
            .await?;
            let kept = super::count(kept);
            history_not_kept(TABLE, rows.len() as u64 - kept.min(rows.len() as u64));
            Ok(kept)
        }
        StoreTx::Sqlite(tx, began) => {
            let now = *began;
            for chunk in rows.chunks(CHUNK / 2) {
                let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                    "INSERT INTO event_bodies (kept_at, key, source, event_id, event_type, \
                     object_id, customer, headers, received_at, encoding, body) ",
                );
                qb.push_values(chunk, |mut b, r| {
                    b.push_bind(now)
                        .push_bind(r.key.to_vec())
                        .push_bind(&r.source)
                        .push_bind(&r.event_id)
                        .push_bind(&r.event_type)
                        .push_bind(r.search.object_id.as_deref())
                        .push_bind(r.search.customer.as_deref())
                        .push_bind(r.headers.as_deref())
                        .push_bind(r.received_at)
                        .push_bind(r.encoding)
                        .push_bind(r.body.as_slice());
                });
                qb.build().execute(&mut **tx).await?;
            }
            Ok(rows.len() as u64)
        }
    }
}
