//! Hostile input: nothing a client or a foreign producer sends can crash, wedge or poison the
//! service, and one bad input never fails another's request. Through the real binary on port 0,
//! against the machine's PostgreSQL, RabbitMQ and the SQS emulator (the checkout example's
//! hostile input is its own crate's test, crates/idempotency-key/examples/checkout/tests):
//!
//! * `ingress`: event ids with a NUL or 5,000 characters are a 400 while 300 events posted with
//!   them all arrive once; 10,000-entry signature headers are refused before any HMAC; the
//!   database queue refuses one bad row alone;
//! * `slow_clients`: 300 clients that never finish their headers or trickle a body do not delay
//!   a webhook and are disconnected within the configured timeouts; past the concurrency cap,
//!   503 with `Retry-After`;
//! * `foreign_messages`: on RabbitMQ and SQS, messages that are not JSON, have no id, are binary
//!   or carry an id PostgreSQL cannot store become dead letters with their reason, and the good
//!   messages behind them are all handled; a batch the database refuses for one event's outbox
//!   row dead-letters that event alone.

mod foreign_messages;
mod ingress;
mod slow_clients;
