//! `soak`: a randomized fault soak of the whole pipeline with an exactly-once checker, in the
//! manner of Jepsen (a history of operations under a nemesis, judged against the promise
//! afterwards) with the seed discipline of FoundationDB's and TigerBeetle's simulators (one seed
//! decides the workload and the faults). Run it through `bench/soak.sh SECONDS [SEED]`, which
//! builds it and `soak_service`, starts the SQS emulator if needed, and passes the rest on.
//!
//! # What runs
//!
//! The service under test is `examples/soak_service`: a service on the library whose handler
//! inserts one row per call into `soak_effects`, a table with no unique key, and forwards the
//! event, both in the consumer's batch transaction; a route (`outbox.routes`) sends every
//! forwarded event to two sinks, each a lane of the relay's and a row of its own under the same
//! `Idempotency-Key`: `default` and `ordered` (`ordered = true`, `ordering_key =
//! "/data/object/customer"`: each webhook event's object names one of 32 customers, drawn from
//! its id, so every key carries many events; a thin event or a foreign message has no key and
//! goes unordered). Sixteen processes of it run on
//! a PostgreSQL server of the run's own ([`postgres`]: `initdb` and `pg_ctl` in a temporary
//! directory, on a free port, its `default_transaction_isolation` drawn per run, stopped and
//! removed at the end) ([`cluster::LAYOUT`]): per transport (the database queue, RabbitMQ, SQS
//! on the emulator, whose consumers unwrap EventBridge envelopes) two `ingest` and two
//! `consume` processes with 1–4 workers each (drawn per run, 4 half the time), two `relay`
//! processes, and two `api` processes: a synchronous API behind the Idempotency-Key layer
//! (`soak_service api`) whose handler, in the layer's transaction, reads and then sets the
//! session's `app.tenant` (as row-level security is driven) and writes one row per execution
//! into `soak_api_effects` (no unique key). Every process reaches PostgreSQL, RabbitMQ, the
//! emulator and the sink through a fault proxy of the driver's
//! ([`dedup_worker::testing::fault_proxy`]), one per dependency (both sinks are paths of one
//! receiver, [`sink`], behind one proxy: the sink's faults hit both lanes); the emulator also
//! through a
//! duplicating proxy ([`sqs_dup`]). The dedup window is short (`consumer.dedup_window`,
//! 60 s by default, `SOAK_WINDOW_SECS`), and every consumer runs retention every 2 s, so
//! generations are sealed and emptied many times in a run.
//!
//! Time is compressed, not travelled: a window of days and one of 60 s take the same code (the
//! seal and the expiry compare the database's `now()` with the ring's own timestamps), and since
//! issue 36 nothing a message carries (its signed `created`) chooses which generations are
//! looked up, so no mechanism needs generations sealed days apart in wall-clock time. The
//! property test (`tests/it/dedup_model`) moves the ring's timestamps by days ("time travel").
//!
//! # The plan (replayable)
//!
//! From `SEED`, `SECONDS` and the rate (`SOAK_RATE` events a second, default 60) the driver
//! draws, before anything starts ([`plan::Plan`]):
//!
//! * the event stream: events at the rate, each posted to one of the six ingress processes
//!   (`SOAK_SQS_RATE` events a second, default 4, to the SQS lane's two, the rest evenly to the
//!   other four: moto_server, one Python process, slows down as its queue grows and stops
//!   accepting connections under a backlog of a few hundred at a third of 60 events a second);
//!   a quarter re-sent one to three times up to 25 s later to any ingress, in shuffled order;
//!   every post up to 1.5 s late (reordering); 12 % delivered as a snapshot event and its thin
//!   event (`v2.core.event` with `snapshot_event`: one change, one key); 10 % with a `created`
//!   hours in the past; 6 % sent on two channels at the same moment ([`workload::Twin`]): the
//!   webhook and an EventBridge envelope on SQS, or the webhook and the thin event put on a
//!   queue under its own id (the key an earlier release gave it: two keys, one change), or two
//!   webhooks (snapshot and thin);
//! * the direct producer's messages ([`producer`]), put on the queues with their own clients:
//!   those second channels, and a foreign producer's messages (one a second for every 20 events
//!   of the rate, to each queue): half with the transport's id, three in ten with only an `id`
//!   in the body, two in ten with no id at all (no event: a dead letter is the promise), a fifth
//!   published twice;
//! * the API clients' calls ([`api`], `SOAK_API_RATE` a second, default a sixth of the rate):
//!   one operation of one of six tenants under one `Idempotency-Key`, retried with the same key
//!   and body after a timeout, a lost connection, a 409, a 429 or a 5xx, to either API process;
//!   a tenth also sent to the other process at the same moment, three in ten sent again after
//!   their answer (replays), 3 % reusing an earlier call's key under another tenant. The
//!   handler draws per execution a 500 after its insert (1 in 20), a transaction of its own left
//!   open (1 in 40: the layer's commit at depth 2), a swallowed failed statement (1 in 40), and
//!   holds the transaction 50–400 ms one time in five;
//! * the fault schedule: one fault every 2–6 s, never two on one process or one proxy at once:
//!   SIGKILL and a restart; SIGSTOP longer than any lease, then SIGCONT; a proxy black-holing or
//!   refusing PostgreSQL, RabbitMQ, the emulator or the sink for 2–10 s; every connection of
//!   one cut; every consumer paused for 3–8 s (a backlog builds), then 200 ms–2 s of latency on
//!   every chunk to one dependency for 10–40 s; a seal of the current dedup generation; a
//!   retention pass; a restart with another batch size, lease and parallelism (a config reload);
//!   the PostgreSQL server SIGKILLed (postmaster and backends) and started again 0.5–5 s later
//!   (`pg_kill`, `pg_restart`); for 3–12 s, one in 1–3 of the messages each SQS receive hands
//!   out made visible again at once, so another receive gets it while it is handled
//!   (`sqs_duplicate`; the summary counts `sqs_made_visible` and `sqs_received_twice`). Every
//!   run of 20 s or more has at least one `pg_kill` and one `sqs_duplicate`.
//!
//! The same `SECONDS SEED` (and rate, SQS share and window) gives the same stream and the same schedule:
//! `bench/soak.sh SECONDS SEED` replays a run. What the processes then do is real concurrency,
//! not a simulation: timings, 503s and retries differ between replays, so a replay reproduces
//! the conditions of a failure, and usually the failure, not its every step.
//!
//! # The run
//!
//! The sender ([`sender`]) behaves like Stripe: each post signed at each attempt, a 2xx ends
//! it (the event is *accepted*), a 503, a timeout or a refused connection is retried with
//! backoff (up to 5 s) through the run and the drain. The nemesis ([`nemesis`]) carries out the
//! schedule; a watch restarts any process that exits by itself and records it as a crash.
//!
//! After `SECONDS`, no new post starts. The drain ([`drain`]) heals every proxy, continues every
//! paused process and starts every stopped one, lets the sender finish its retries, and polls
//! until every accepted event is at both sinks (the ordered one: answered 2xx) and the three
//! queues and the outbox are empty
//! (three polls in a row), or nothing moved for 60 s, or its deadline (180 s, or half the run if
//! longer). Then every process gets SIGTERM, and the effect table, the dead letters, the
//! outbox's failed rows, the ordered sink's rows in the outbox (id order: its commit order per
//! key) and `soak_api_effects` are read.
//!
//! # The checker
//!
//! The history (`history.jsonl`: every post's attempts and answers, every direct publish,
//! every sink delivery with its `Idempotency-Key` (at the ordered sink also its ordering key
//! and its answer: that sink answers 500 to about one delivery in ten, so heads are retried),
//! every fault's start and end), the effect
//! table and the dead letters are judged by [`checker`]: nothing accepted lost (at the sink at
//! least once, with its effect row), nothing doubled (no two effect rows of one change less
//! than the window apart, a thin event's own id counted as its change's; rows further apart
//! are allowed by the promise and reported as `reaccepted_after_window`; doubled changes sent on
//! two channels are also `doubled_two_channels`), sink redeliveries under the first delivery's
//! `Idempotency-Key`, each foreign message with no id dead-lettered (at least once) and no
//! other dead letter, no failed outbox row, no crash. The verdict also fails when fewer than
//! 90 % of the events sent were accepted, or the drain did not finish: a run that says nothing
//! about the pipeline does not pass. The ordered sink is judged by [`order_check`] against the
//! lane's commit order: no delivery of a key's row arriving (whatever its answer) before every
//! earlier row of its key was answered 2xx, or after a later row of its key arrived
//! (`order_violations`); every accepted event answered 2xx there too (`ordered_missing`);
//! nothing there that is no row of its lane (`ordered_unexpected`); and a run that judged no key
//! with two rows delivered fails (the summary counts `ordered_deliveries_checked` and
//! `ordered_keys_checked`). The API's attempts are judged by [`api_check`] against
//! `soak_api_effects`: per `(tenant, key)`, at most one effect row, exactly one with the
//! answered charge for every operation answered 2xx, every 2xx byte-identical (each execution's
//! answer carries a fresh nonce, so a second execution never looks like a replay), no execution
//! that found another request's `app.tenant` in its session, no refusal of the valid request;
//! and 90 % of the operations answered. The last line printed is one JSON object:
//! `{"seed", "seconds", "events_accepted", "faults", "workload", "lost", "doubled", "api", …,
//! "order_violations", "ordered_missing", …, "verdict", "why"}`. On a violation the driver prints the seed, the replay command, the
//! schedule and the history of the violating keys, and exits 1; the run's directory keeps what
//! a post-mortem reads (the server itself is removed).
//!
//! # The run's directory
//!
//! `target/soak/<run>/` (`SOAK_DIR` for another parent): `schedule.json` (the plan's
//! parameters and faults), `history.jsonl`, `effects.jsonl`, `api_effects.jsonl`,
//! `dead_letters.txt` and
//! `dead_letters.jsonl`,
//! `outbox_failed.txt`, `ordered_outbox.jsonl` (the ordered sink's rows: id, ordering key,
//! `Idempotency-Key`, status), `summary.json`, and `logs/<process>.log` (each process's stderr,
//! across its restarts), `history_tables.json` (issue 40's history tables summed: bodies per
//! event id, counts per series, attempts per kind; judged by `history_check`). `soak --check
//! DIR` judges a kept run again.
//!
//! # Broken on purpose
//!
//! `SOAK_SERVICE_FAULT=forget-dedup`, `drop-forward` or `api-outside-tx` makes the service wrong (see
//! `examples/soak_service`), to see the checker fail.

mod api;
mod api_check;
mod checker;
mod cluster;
mod drain;
mod faults;
mod history;
mod history_check;
mod infra;
mod nemesis;
mod order_check;
mod plan;
mod postgres;
mod producer;
mod report;
mod run;
mod sender;
mod settings;
mod sink;
mod sqs_dup;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "soak",
    about = "A fault soak of the pipeline with an exactly-once checker"
)]
struct Args {
    /// How long the workload and the nemesis run (the drain comes after).
    seconds: Option<u64>,
    /// The seed of the event stream and the fault schedule (default: a fresh one, printed).
    seed: Option<u64>,
    /// Events a second.
    #[arg(long, env = "SOAK_RATE", default_value_t = 60)]
    rate: u32,
    /// Events a second sent to the SQS lane, out of the rate (the emulator slows down as its
    /// queue grows: a third of a high rate buries it under the first backlog).
    #[arg(long, env = "SOAK_SQS_RATE", default_value_t = 4)]
    sqs_rate: u32,
    /// API calls a second behind the Idempotency-Key layer (default: a sixth of the rate,
    /// rounded up; 0: none).
    #[arg(long, env = "SOAK_API_RATE")]
    api_rate: Option<u32>,
    /// The dedup window (`consumer.dedup_window`).
    #[arg(long, env = "SOAK_WINDOW_SECS", default_value_t = 60)]
    window_secs: u64,
    /// Where the run's directory is made.
    #[arg(long, env = "SOAK_DIR", default_value = "target/soak")]
    dir: PathBuf,
    /// The service's binary (default: `soak_service` beside this one).
    #[arg(long, env = "SOAK_SERVICE")]
    service: Option<PathBuf>,
    /// Judge the run kept in this directory again, instead of running.
    #[arg(long, value_name = "RUN_DIR")]
    check: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match (&args.check, args.seconds) {
        (Some(dir), _) => report::check_again(dir),
        (None, Some(seconds)) => {
            let seed = args.seed.unwrap_or_else(rand::random);
            let service = match &args.service {
                Some(path) => path.clone(),
                None => beside_this_binary("soak_service"),
            };
            run::soak(run::Options {
                seconds,
                seed,
                rate: args.rate,
                sqs_rate: args.sqs_rate,
                api_rate: args.api_rate.unwrap_or(args.rate.div_ceil(6)),
                window_secs: args.window_secs,
                parent_dir: args.dir.clone(),
                service,
            })
            .await
        }
        (None, None) => Err(anyhow::anyhow!(
            "usage: soak SECONDS [SEED] (or soak --check RUN_DIR)"
        )),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("soak: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn beside_this_binary(name: &str) -> PathBuf {
    let this = std::env::current_exe().unwrap_or_default();
    this.with_file_name(name)
}
