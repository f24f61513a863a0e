//! The integration suite, one test binary (`it`): every module below is a feature, shown end to
//! end against the machine's PostgreSQL, RabbitMQ, Redis and the SQS emulator (moto_server),
//! through the application in this process or the real binary on port 0. Run it all with
//! `bash scripts/test.sh`; one module with `cargo test --test it outage::`, one test with
//! `cargo test --test it -- --exact outage::unreachable_brokers_answer_503`.
//!
//! * [`activity_store`]: the per-minute counts on both stores: writers sharing a shard add up,
//!   a redrive counts in its minute and leaves a past one alone, old minutes purged in batches;
//! * [`aliases`]: a message keyed differently by an earlier release (a thin event by its own
//!   id) or another `consumer.envelope` is a duplicate under its new key, on both stores;
//! * [`architecture`]: the import graph of `src/` goes down the floors of the book's "Layout"
//!   (docs/src/guide/layout.md) only and has no circle; no file in `src/` is over 500 lines;
//! * [`backfill`]: `dedup-worker backfill` against a stand-in of Stripe's list-events API
//!   (3 pages, a 429): what webhooks missed reaches the sink once, a second run publishes none;
//!   a page over the page limit, one that never ends and one that trickles stop it with nothing
//!   of that page published;
//! * [`bodies_store`] (issue 40): a handled event's body kept once on both stores and shown on
//!   its page (hidden with `admin.show_payloads = false`); SQLite's bounded purge; the stale
//!   guard's records pruned past the dedup window;
//! * [`broker_outage`]: RabbitMQ and SQS cut, black-holed and refused under traffic: 503 while
//!   down, reconnection by itself, every acknowledged event at the sink once;
//! * [`handler_errors`]: a handler's database errors classified (constraint, undefined
//!   table, syntax, unparsable payload: fatal; missing row, timeout, marked: retried).
//! * [`console`]: the operator console in Debian's chromium through chromedriver: log in,
//!   search, an event's page, redrive and bulk retry, and the refusals (no token, a wrong one,
//!   a cross-origin POST); `SCREENSHOTS=1` writes the book's screenshots;
//! * [`consumer`]: handler failures (poison, panic, flaky) dead-lettered or retried without
//!   blocking the batch; a step slower than its lease keeps its batch; no deadlock between
//!   overlapping batches of two processes;
//! * [`crash`]: SIGKILL and SIGTERM under load: nothing acknowledged lost, no effect twice,
//!   every redelivery under the same `Idempotency-Key`;
//! * [`dedup_model`]: the stateful property test of the dedup record on both stores (PostgreSQL
//!   at each default isolation level): random schedules of batches, seals, retention passes,
//!   window changes and time travel against a model; never accepted twice inside the window,
//!   never lost early;
//! * [`dedup_ring`]: the ring's locking whatever the database's default isolation (a batch that
//!   waited on a seal and a retry after it handle an event once), and retention's lock order
//!   (no deadlock with the batches), through the binary and at the store;
//! * [`event_list`]: `events list` (the console's `/events`) against a model on both stores:
//!   random events at shared instants and random filters read in random page sizes are the
//!   model's rows, newest first, each once;
//! * [`events_show`]: `dedup-worker events show` reports each outcome (handled, deduplicated,
//!   dead-lettered and redriven, stale, a failed outbox row, queued, not seen) of events driven
//!   through the binary, as text and as JSON;
//! * [`fifo`]: SQS FIFO queues: the event's object is the message group and `source:id` the
//!   deduplication id; interleaved objects handled in order, duplicates inside and outside the
//!   5-minute window once;
//! * [`hostile`]: hostile input (deep JSON, ids the store cannot hold, huge signature headers,
//!   slow clients, foreign queue messages) is a clear 4xx or a dead letter, never a crash;
//! * [`invalid_index`]: a concurrent index build cancelled mid-way leaves an invalid index;
//!   the next `migrate` rebuilds it (and drops what a cancelled `REINDEX CONCURRENTLY` left);
//! * [`layout_upgrade`]: a database of the previous version (library tables in `public`, one
//!   `_sqlx_migrations` shared with the application's) moves to schema `dedup_worker` (SQLite:
//!   `_dedup_worker_migrations`) keeping every row; the old migrations cannot start again;
//!   two processes upgrading at once; the SQLite runner's refusals;
//! * [`lock_order`]: batches touching the same objects (stale-event guard) or dead-lettering the
//!   same events in opposite orders both commit: locks are taken in one order, never deadlock;
//! * [`operations`]: JSON log lines carry the event they are about; no colours off a terminal;
//!   start-up errors name the database, its address and the cause, never the password;
//!   `/metrics` of the binary after traffic (histogram buckets, gauges that follow
//!   the queue, dead letters and the outbox), a real Prometheus scraping it with the alert rules
//!   loaded, `promtool` on the rules and their unit tests, the dashboard's and rules' queries
//!   naming only exposed metrics, the compose file and Kubernetes manifests validated;
//! * [`operator_actions`]: the CLI's bulk actions through the binary: `dlq redrive` and
//!   `outbox retry --failed` by filter with `--dry-run`, `outbox resend` of a dispatched range
//!   under the original keys, each recorded;
//! * [`partitions`] (issue 40): the history tables' day partitions on PostgreSQL: made once when
//!   two processes make them at once, an expired day dropped while inserts go on, an
//!   interrupted detach finished by the next pass;
//! * [`ordered`]: an ordered sink delivers each key's rows in commit order while other keys
//!   flow (1,000 events, 50 keys, a failing receiver); a row failed for good holds its key,
//!   shown by `outbox held` and the console, until `outbox skip`;
//! * [`outage`]: a store that refuses or stops answering: 503 and `/readyz` 503, nothing
//!   acknowledged lost, a mark lost to an outage written after it without a redelivery;
//! * [`paid_invoices`]: the example service of one's own (`examples/paid_invoices`) as its own
//!   binary on both stores: serves, restarts twice without a migration error, its `migrate`,
//!   `dlq list`, `outbox failed` and `events show` work; one row and one delivery per invoice,
//!   a malformed event a dead letter after one attempt;
//! * [`pipeline`]: 1,000 events with 30 % duplicates reach the sink once on every store and
//!   transport; an idle SQS consumer long-polls;
//! * [`rabbit_give_backs`]: a database that keeps failing makes the RabbitMQ consumer give its
//!   batches back again and again; events no handler saw never go over the delivery limit;
//! * [`redrive`]: dead letters on RabbitMQ and SQS redriven through the transport and handled
//!   once; the configured delivery limit on an older queue;
//! * [`relay`]: the outbox relay's retries under one key, failed rows, leases kept and lost,
//!   a sink that times out, is black-holed, refused or cut; the `migrate` and `dlq` commands;
//! * [`settings_refused`]: settings that cannot be right stop the start naming the key: secrets
//!   that verify nothing (`whsec_`), numbers past their bound (a dedup window that would wrap),
//!   and at the store, a two-day-old generation outliving the window such a number made; a
//!   short Stripe secret starts with a warning;
//! * [`sink_auth`]: receivers that ask for more than a shared secret: one requiring a client
//!   certificate (mTLS) gets every delivery of the sink with one and refuses the sink without;
//!   an OAuth 2.0 receiver revoking its token once gets every event, the token fetched twice
//!   and no attempt spent; a wrong client secret fails the deliveries showing the OAuth error;
//!   no secret or token in the logs; an unreadable certificate refuses the start naming its key;
//! * [`sink_connections`]: the HTTP sink reads a receiver's answer so its connection is
//!   reused, not one connection per delivery;
//! * [`sink_urls`]: a token in the HTTP sink's URL (path or query) reaches no log line,
//!   `last_error`, `outbox failed` or `events show`, with the sink refusing or answering 500;
//! * [`sinks`]: the RabbitMQ and SQS sinks forward each event once;
//! * [`sqs_slow`]: SQS calls made slow (latency on every call, the emulator's own on a deep
//!   queue): a backlog still drains through two processes; a fill, its heartbeat and its acks
//!   send their calls side by side; a fill stops at its time budget and keeps what it holds
//!   leased while it waits;
//! * [`stale`]: the stale-event guard: an older `updated` event of an object handled after a
//!   newer one is held back and listed; off, every update arrives;
//! * [`sources`]: named senders (`[sources.NAME]`): GitHub, Shopify and Slack deliveries signed
//!   by the senders' own libraries accepted, forgeries refused with nothing enqueued, retries
//!   handled once, Slack's `url_verification` answered; the binary configured from the
//!   environment, and refusing a source that cannot work, naming its key;
//! * [`standard_ingress`]: Standard Webhooks: the official vector, failed checks, `webhook-id`
//!   dedup under its own source;
//! * [`store_contract`]: one contract for both stores (dedup, outbox, queue leases, retention);
//! * [`stripe_channels`]: a thin event and its snapshot event handled once in any order; thin
//!   events replaced by their full events from a stand-in API that fails and hangs; EventBridge
//!   envelopes on SQS handled once, in the webhooks' key space;
//! * [`stripe_ingress`]: signatures of the official `stripe` library verify; every failed check
//!   is a 400 naming it; invalid configuration stops the start;
//! * [`testing_kit`]: the `testing` feature's kit as a handler crate's tests use it: the handler
//!   alone in one transaction on both stores (committed, or rolled back with its error), and in
//!   the application with its own migrations;
//! * [`trusted_created`]: a `created` decides which dedup generations an event skips only
//!   where Stripe's signature of it verifies (carried by every transport); a foreign message's
//!   `created` after a seal, or a day ahead, is looked up everywhere;
//! * [`transport_contract`]: one contract for every transport (publish, redelivery, retries,
//!   lease extension, late acks);
//! * [`two_channels`]: one change on two channels at once (a webhook and its thin event or
//!   EventBridge copy, side by side in a batch or in two batches at once) is one event,
//!   handled once under the change's key;
//! * [`user_migrations`]: an application's own migrations applied by every start and by
//!   `migrate`, in order, once each, with its history apart from the library's; a changed one
//!   reported once; a handler or migrations for the other store refused before anything runs;
//! * [`wakeup`]: LISTEN/NOTIFY wakes the consumer and relay of another process.
//!
//! [`helpers`] is the harness they share. All tests run in this one process, as many at a time
//! as the machine has cores (libtest's default), tests of different modules side by side: what
//! a test changes must be its own (database, queue, Redis prefix, port 0; no environment
//! variable set, no process-wide subscriber or recorder installed by a test), and the tests
//! that use the SQS emulator take turns through [`helpers::sqs_turn`].

mod helpers;

mod activity_store;
mod aliases;
mod architecture;
mod attempts_store;
mod backfill;
mod bodies_store;
mod broker_outage;
mod console;
mod consumer;
mod crash;
mod dedup_model;
mod dedup_ring;
mod dedup_window;
mod event_list;
mod events_show;
mod fifo;
mod handler_errors;
mod hostile;
mod invalid_index;
mod lanes;
mod lanes_store;
mod layout_upgrade;
mod lock_order;
mod operations;
mod operator_actions;
mod ordered;
mod outage;
mod paid_invoices;
mod partitions;
mod pipeline;
mod rabbit_give_backs;
mod redrive;
mod relay;
mod settings_refused;
mod sink_auth;
mod sink_connections;
mod sink_urls;
mod sinks;
mod sources;
mod sqs_slow;
mod stale;
mod standard_ingress;
mod standard_v1a;
mod store_contract;
mod stripe_channels;
mod stripe_ingress;
mod testing_kit;
mod transport_contract;
mod trusted_created;
mod two_channels;
mod user_migrations;
mod wakeup;
