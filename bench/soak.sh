#!/usr/bin/env bash
# The fault soak (issues 26 and 36): sixteen processes of examples/soak_service (per transport,
# the database queue, RabbitMQ and SQS on moto_server, two ingress and two consumers with 1-4
# workers; two relays; two API processes behind the Idempotency-Key layer, whose clients retry
# keyed requests per tenant) on a PostgreSQL server of the run's own (initdb + pg_ctl in a temporary
# directory, its default_transaction_isolation drawn per run, removed at the end), a Stripe-like
# sender, a direct producer (a change's second channel at the same moment: an EventBridge copy
# on SQS or a thin event under its own id; a foreign producer's messages with and without ids on
# every queue), a nemesis drawn from the seed (SIGKILL, SIGSTOP longer than a lease, proxies
# black-holing, refusing, cutting or slowing PostgreSQL, RabbitMQ, the emulator and the sink,
# PostgreSQL itself SIGKILLed and restarted, SQS receives duplicated, seals and retention of a
# 60-s dedup window, restarts with another configuration), then a drain and a checker: every
# event answered 2xx at the sink at least once and in the effect table exactly once; every event
# also at a second, ordered sink (a route sends each forwarded event to both; `ordered = true`
# keyed by the event's customer, behind the same proxy, answering 500 to one delivery in ten),
# each key's deliveries there in the outbox's commit order (order_violations); and every
# keyed API operation's effect once, its replays byte-identical, no request seeing another's
# session. What it does and how it judges
# is written at the top of examples/soak/main.rs; RELIABILITY.md has the faults and results.
#
# Usage: bench/soak.sh SECONDS [SEED]
#   A fresh seed is drawn (and printed) unless SEED is given; `bench/soak.sh SECONDS SEED`
#   replays a run: the same event stream and the same fault schedule.
# Environment:
#   SOAK_PROFILE=release|debug  the build profile of the driver and the service (default
#                               release; CI uses debug, which `cargo test` has mostly built)
#   SOAK_RATE (60 events/s), SOAK_SQS_RATE (4 of them to the SQS lane), SOAK_API_RATE (a sixth
#   of SOAK_RATE, API calls/s), SOAK_WINDOW_SECS (60),
#   SOAK_DIR (target/soak): see the top of examples/soak/main.rs
#   SOAK_SERVICE_FAULT=forget-dedup|drop-forward|api-outside-tx: a deliberately broken service (the checker
#                               must fail)
#   AWS_ENDPOINT_URL            an SQS emulator already running; otherwise moto_server is started
#                               on a free port for the run (installed with pip if missing)
#   SOAK_PG_BIN                 where initdb and pg_ctl are (default: pg_config --bindir, else
#                               the newest /usr/lib/postgresql/*/bin); as root they run as postgres
#   AMQP_URL                    RabbitMQ (default the local one, as the test suite)
# The last line on stdout is one JSON object (seed, seconds, events_accepted, faults, workload,
# lost, doubled, api, …, order_violations, ordered_missing, ordered_deliveries_checked,
# ordered_keys_checked, …, verdict, why). Exit status 0 if the promise held; 1 on a violation, on
# fewer than 90 % of the events sent accepted (or of the API calls answered), or on a drain that
# did not finish (the seed, the schedule and the violating keys' history on stderr);
# 2 if the soak itself could not run.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

log() { printf '[soak.sh] %s\n' "$*" >&2; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '/^# Usage/,/^# 2 if/p' "bench/soak.sh" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
SECONDS_ARG=$1
SEED_ARG=${2:-}

BENCH_PROFILE=${SOAK_PROFILE:-release}
case "$BENCH_PROFILE" in
  release | debug) ;;
  *) log "SOAK_PROFILE must be release or debug, not $BENCH_PROFILE"; exit 2 ;;
esac
log "building the driver and the service ($BENCH_PROFILE)"
bench_build --locked --example soak --example soak_service
EXAMPLES="$(bench_out_dir)/examples"

# The SQS emulator, unless one is given: moto_server on a free port, stopped at the end.
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  PYTHON=${PYTHON:-python3}
  if ! "$PYTHON" -c 'import moto.server' 2>/dev/null; then
    log "installing moto[server]"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      'moto[server]>=5,<6'
  fi
  MOTO_PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # Its log outlives the run (in TMPDIR, not $WORK): what the emulator did, for a failed soak.
  bench_spawn "${TMPDIR:-/tmp}/soak-moto-$MOTO_PORT.log" "$PYTHON" scripts/moto_server.py -H 127.0.0.1 -p "$MOTO_PORT"
  bench_wait_until "moto_server on port $MOTO_PORT" 60 "$LAST" bench_port_open "$MOTO_PORT" || exit 2
  export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT"
  log "moto_server on $AWS_ENDPOINT_URL"
fi
export AWS_REGION=${AWS_REGION:-us-east-1} AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test} \
  AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}

# Not `exec`: the trap stops moto_server after the driver.
status=0
"$EXAMPLES/soak" --service "$EXAMPLES/soak_service" "$SECONDS_ARG" ${SEED_ARG:+"$SEED_ARG"} || status=$?
exit "$status"
