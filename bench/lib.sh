# shellcheck shell=bash
# What every bench script shares, sourced first thing after `set -euo pipefail`:
#   source "$(dirname "$0")/lib.sh"          (bench/ceilings/*: "$(dirname "$0")/../lib.sh")
# Sourcing it moves to the repository's root, makes the run's scratch directory $WORK and its
# tag $TAG (bench_<script>_<pid>: the names of the databases and queues it makes), and sets one
# EXIT trap that stops the processes the script started (by pid: the machine is shared), drops
# the databases it made, runs what it registered with bench_at_exit, and removes $WORK.
# Configuration stays where it was: each script's arguments and env variables with their
# defaults (`ROUNDS=${1:-3}`, `EVENTS=${EVENTS:-…}`); here only what they all read.

BENCH_CALLER_DIR=$PWD
BENCH_SCRIPT=$(realpath "$0")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
BENCH_SCRIPT=$(realpath --relative-to=bench "$BENCH_SCRIPT")
[[ $BENCH_SCRIPT != ../* ]] || BENCH_SCRIPT=$(basename "$BENCH_SCRIPT")
BENCH_SCRIPT=${BENCH_SCRIPT%.sh}
TAG=bench_${BENCH_SCRIPT//[^a-z0-9]/_}_$$
# The shared PostgreSQL server (trust authentication); databases are named after $TAG.
PG=${PG:-postgres://postgres@127.0.0.1:5432}
WORK=$(mktemp -d)
BENCH_PIDS=()          # processes started and not yet stopped
declare -A BENCH_LOGS  # pid → its output, shown when it exits too early
BENCH_MADE_DB=         # set once a database of $TAG exists
BENCH_EXIT_HOOKS=()

# --- configuration ---------------------------------------------------------------------------

# bench_caller_path PATH: PATH (a BIN= or BASE= given by the caller) made absolute from the
# directory the script was called from, since the script now runs at the repository's root.
bench_caller_path() { (cd "$BENCH_CALLER_DIR" && realpath "$1"); }

# bench_toml SECTION KEY: a default the binary runs with (config/default.toml).
bench_toml() {
  awk -v s="[$1]" -v k="$2" '$0 == s { c = 1; next } /^\[/ { c = 0 } c && $1 == k { print $3; exit }' \
    config/default.toml
}

# psql and pgbench name the library's tables unqualified: they live in schema dedup_worker (the
# binary's own connections put it first; an older binary's tables in public are found too).
bench_library_schema() { export PGOPTIONS='-c search_path=dedup_worker,public'; }

# What a dedup-worker under load runs with: the signing secret loadgen uses, quiet logs.
bench_worker_env() { export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn; }

# --- build -------------------------------------------------------------------------------------

# bench_build CARGO_ARGS…: `cargo build --release --quiet CARGO_ARGS…` (BENCH_PROFILE=debug: a
# debug build), once per run: a script that runs others (bench/ceilings.sh) builds for them.
export BENCH_BUILT=${BENCH_BUILT:-}
bench_build() {
  local key="${BENCH_PROFILE:-release} $*"
  case "|$BENCH_BUILT|" in *"|$key|"*) return 0 ;; esac
  if [ "${BENCH_PROFILE:-release}" = release ]; then
    cargo build --release --quiet "$@"
  else
    cargo build --quiet "$@"
  fi
  BENCH_BUILT="$BENCH_BUILT|$key"
}
# bench_out_dir: where the build's binaries are (target/release, or the profile's).
bench_out_dir() {
  : "${BENCH_TARGET_DIR:=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}"
  echo "$BENCH_TARGET_DIR/${BENCH_PROFILE:-release}"
}

# bench_bin CARGO_ARGS…: BIN = the dedup-worker to measure: BIN from the environment if given (a
# build to compare, A/B: a path from the caller's directory), else this tree's, built now; the
# CARGO_ARGS (loadgen…) are this tree's, built either way. OUT = this tree's build directory.
bench_bin() {
  if [ -n "${BIN:-}" ]; then
    BIN=$(bench_caller_path "$BIN")
    [ $# -eq 0 ] || bench_build "$@"
  else
    bench_build --bin dedup-worker "$@"
    BIN=$(bench_out_dir)/dedup-worker
  fi
  # shellcheck disable=SC2034 # the caller's
  OUT=$(bench_out_dir)
  [ -x "$BIN" ] || { echo "BIN=$BIN: not an executable" >&2; return 1; }
}

# --- processes and readiness -------------------------------------------------------------------

# bench_spawn LOG CMD…: CMD in the background, its output in LOG; LAST = its pid.
bench_spawn() {
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  LAST=$!
  BENCH_PIDS+=("$LAST")
  BENCH_LOGS[$LAST]=$log
}

# bench_wait_until WHAT SECONDS PID CMD…: polls CMD every BENCH_POLL seconds (default 0.1; a
# drain polled by psql uses more, not to load the machine it measures) until it succeeds; fails,
# saying WHAT, once SECONDS have passed or (PID not empty) PID has exited, whose log it shows.
bench_wait_until() {
  local what=$1 secs=$2 pid=$3 deadline=$((SECONDS + $2)); shift 3
  until "$@" >/dev/null 2>&1; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "$what: process $pid exited:" >&2; cat "${BENCH_LOGS[$pid]:-/dev/null}" >&2; return 1
    fi
    ((SECONDS < deadline)) || { echo "$what: not within $secs s" >&2; return 1; }
    sleep "${BENCH_POLL:-0.1}"
  done
}

# bench_port_open PORT: something accepts connections on 127.0.0.1:PORT.
bench_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# bench_start_worker LOG CMD…: starts a dedup-worker (LAST = its pid) on DEDUP_LISTEN (default a
# port of its own choosing), waits up to 60 s until it answers /readyz; URL = its base address.
bench_start_worker() {
  local log=$1; shift
  DEDUP_LISTEN=${DEDUP_LISTEN:-127.0.0.1:0} bench_spawn "$log" "$@"
  URL=""
  bench_wait_until "dedup-worker ready" 60 "$LAST" bench_worker_ready "$log"
}
bench_worker_ready() { # the address it printed, answering /readyz
  URL=$(sed -n 's/^dedup-worker listening on \(http:[^ ]*\).*/\1/p' "$1" | head -1)
  [ -n "$URL" ] && curl -sf "$URL/readyz" >/dev/null
}

# bench_stop PID…: SIGTERM, up to 30 s to exit, then SIGKILL; waits for each.
bench_stop() {
  local pid p keep=() deadline=$((SECONDS + 30))
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for p in "${BENCH_PIDS[@]}"; do
    for pid in "$@"; do [ "$p" = "$pid" ] && continue 2; done
    keep+=("$p")
  done
  BENCH_PIDS=("${keep[@]}")
}
# Stops the process started last.
bench_stop_last() { bench_stop "$LAST"; }

# --- PostgreSQL ----------------------------------------------------------------------------------

# bench_sql DB SQL: one statement's rows, unaligned (DB a name or a URL).
bench_sql() { psql -X -tA -v ON_ERROR_STOP=1 "$1" -c "$2"; }
# bench_createdb NAME [TEMPLATE]: a database of this run (NAME starts with $TAG), dropped at exit.
bench_createdb() {
  BENCH_MADE_DB=1
  bench_sql "$PG/postgres" "CREATE DATABASE $1${2:+ TEMPLATE $2}" >/dev/null
}
bench_dropdb() { bench_sql "$PG/postgres" "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null; }

# The machine's calibration, the same line in every script that prints one, so figures from
# different days compare: pgbench of a durable one-row insert (bench/calibration.sql) in a
# scratch database.
bench_calibrate() {
  local db=${TAG}_calib tps
  bench_createdb "$db"
  bench_sql "$PG/$db" "CREATE TABLE calibration (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)" >/dev/null
  tps=$(pgbench -n -M prepared -c 16 -j 2 -T 8 -f bench/calibration.sql "$PG/$db" 2>/dev/null |
    sed -n 's/^tps = \([0-9]*\).*/\1/p')
  bench_dropdb "$db"
  echo "calibration: pgbench -n -M prepared -c 16 -j 2 -T 8, one-row insert: $tps tps ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
}

# --- fills -------------------------------------------------------------------------------------

# bench_ring_generations HEADROOM: the SQL that makes dedup_generations the worst case, just
# before a rotation: slots 0 and 1 sealed (the oldest ten days, the ten after), slot 2 current
# (the last ten days), every time HEADROOM seconds later than the 30/20/10-day marks.
bench_ring_generations() {
  local day=86400 h=$1
  echo "DELETE FROM dedup_generations;"
  echo "INSERT INTO dedup_generations (slot, started_at, sealed_at) VALUES
      (0, now() - make_interval(secs => $((30 * day - h))), now() - make_interval(secs => $((20 * day - h)))),
      (1, now() - make_interval(secs => $((20 * day - h))), now() - make_interval(secs => $((10 * day - h)))),
      (2, now() - make_interval(secs => $((10 * day - h))), NULL);"
}
# The console's ten generation indexes (issue 28), dropped for a fill and built again after it:
# their migration files, and from one file the index's name and its statement (CONCURRENTLY
# removed: nothing else runs).
bench_console_index_files() { ls crates/dedup-worker-core/migrations/postgres/20261230*_console_generation_*.sql; }
bench_index_name() { grep -o 'IF NOT EXISTS [a-z0-9_]*' "$1" | awk '{print $4}'; }
bench_index_statement() { grep -v '^--' "$1" | sed 's/CONCURRENTLY //'; }

# --- load and measures ---------------------------------------------------------------------------

# bench_loadgen_accepted LOG: the requests loadgen's summary (in LOG) counts as answered 2xx.
bench_loadgen_accepted() {
  awk '{ for (i = 1; i < NF; i++) { if ($i == "requests:") n = $(i + 1); if ($i == "non-2xx:") f = $(i + 1) } }
       END { sub(";", "", f); print n - f }' "$1"
}
# bench_metric URL NAME: an unlabelled counter of that process's /metrics (0 if none).
bench_metric() {
  { curl -sf "$1/metrics" || true; } | awk -v m="$2" '$1 == m { v = int($2) } END { print v + 0 }'
}
# bench_ratio A B: A / B, two decimals.
bench_ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
# bench_median "R1 R2 …": the median, two decimals.
bench_median() {
  python3 -c 'import statistics, sys; print(f"{statistics.median(float(x) for x in sys.argv[1].split()):.2f}")' "$1"
}
# bench_since START: seconds since START (a `date +%s.%N`), as a float.
bench_since() { python3 -c "import time,sys; print(time.time() - float(sys.argv[1]))" "$1"; }

# --- cleanup -------------------------------------------------------------------------------------

# bench_at_exit CMD…: one more thing the EXIT trap does (before the databases are dropped).
bench_at_exit() { BENCH_EXIT_HOOKS+=("$*"); }
# The RabbitMQ queues of this run ($TAG, $TAG_…): register with `bench_at_exit bench_delete_queues`.
bench_delete_queues() {
  local q
  for q in $(rabbitmqctl -q list_queues name 2>/dev/null | grep -E "^${TAG}(_|$)" || true); do
    rabbitmqctl -q delete_queue "$q" >/dev/null || true
  done
}
bench_cleanup() {
  local status=$? hook db
  set +e
  bench_stop "${BENCH_PIDS[@]}"
  for hook in "${BENCH_EXIT_HOOKS[@]}"; do eval "$hook"; done
  if [ -n "$BENCH_MADE_DB" ]; then
    for db in $(bench_sql "$PG/postgres" "SELECT datname FROM pg_database
                  WHERE datname = '$TAG' OR left(datname, length('$TAG') + 1) = '${TAG}_'"); do
      bench_dropdb "$db"
    done
  fi
  rm -rf "$WORK"
  return "$status"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
