//! The unit that flows through the pipeline once it has been received from a transport.

use bytes::Bytes;

/// An event as the consumer sees it: its dedup key and the raw payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Where it came from (`stripe`, …): the first half of the dedup key.
    pub source: String,
    /// The provider's event id (`evt_…`): the second half of the dedup key.
    pub id: String,
    /// The event type (`invoice.paid`), empty when unknown.
    pub event_type: String,
    /// The body exactly as received; forwarded byte for byte.
    pub payload: Bytes,
    /// Which delivery of this message this is (1 on the first); lets a handler tell a retry.
    pub delivery_attempt: u32,
}
