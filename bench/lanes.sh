#!/usr/bin/env bash
# Issue 39's isolation: does a dead sink slow a healthy one? Two named HTTP sinks, `a` and `b`,
# one route sending every event to both (the `forward` handler writes each event as two outbox
# rows, one in lane a, one in lane b). Once per backend: EVENTS unique signed events through an
# ingress-only process (loadgen), then a consume-only process writes the 2 × EVENTS outbox rows;
# that database is the backlog every run starts from (a PostgreSQL template / an SQLite copy).
# Each run starts a relay-only process on a fresh copy and measures lane a alone: its rows/s
# (EVENTS over relay start → the last `dispatched_at` of lane a, once none is pending) and the
# p50/p99/max of relay start → each row's arrival at receiver A (bench/lanes/receiver.py,
# answering 200 at once, the same in every run). What receiver B is decides the run's kind:
#   H     B answers 200 at once (both healthy);
#   X     B is a black hole: accepts, reads, never answers (each request waits out
#         outbox.http_timeout, 10 s); the breaker at its defaults (production);
#   X30   B answers 200 after 30 s (b's own http_timeout = "40s", so the answer arrives);
#   XOFF  as X with b's breaker off (b's breaker = { failures = 0, window = 0 });
#   P     b paused (`dedup-worker outbox pause b` before the relay starts): lane a alone, the
#         reference for "no neighbour at all" (H's lane b shares the 2 cores; P's does nothing).
# A round runs H then each of KINDS, the order reversed in even rounds (H X P X30, X30 P X H, …);
# each kind's figures are divided by the same round's H (and X's by P's when both ran). Also per
# run: what lane b did by the time lane a finished (its rows by status with their attempts, the
# relay's deferred and failed counts, `circuit opened` lines in the relay's log), the CPU
# seconds the relay and the two receivers had used by then, and the load average at its start.
# Usage: bench/lanes.sh [rounds] [kinds] [backends]
#   defaults: 2 "X P X30" postgres   (backends: "postgres", "sqlite" or "postgres sqlite")
# Env: EVENTS (default 120000: lane a takes about 30 s in X on this 2-core machine under a
# neighbour's load, so a dead b's first timeouts (10 s), the circuit's opening (about 20 s: the
# requests started before the 20th failure are waited out) and its first probe fall inside the
# measured window; a faster machine wants more), CONNECTIONS (the fill's, default 64), KEEP (a
# directory: each run's receiver arrivals, relay log and start time are copied there as
# BACKEND-RUN-KIND.{a.json,b.json,relay.log,start}). Prints the calibration line first and last.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-2}
KINDS=${2:-X P X30}
BACKENDS=${3:-postgres}
EVENTS=${EVENTS:-120000}
CONNECTIONS=${CONNECTIONS:-64}
bench_library_schema
bench_worker_env
bench_build --bin dedup-worker --example loadgen
OUT=$(bench_out_dir)
BIN=$OUT/dedup-worker
RECEIVER=bench/lanes/receiver.py
if [ -n "${KEEP:-}" ]; then KEEP=$(bench_caller_path "$KEEP"); fi
FORMAT='%-8s %-5s %-3s %-4s %8s %7s %7s %7s %4s %5s %14s %4s %8s %6s  %s\n'

# sinks_toml PORT_A PORT_B [LINES FOR b]: the two lanes and the route.
sinks_toml() {
  cat <<EOF
[outbox.sinks.a]
url = "http://127.0.0.1:$1/hook"
[outbox.sinks.b]
url = "http://127.0.0.1:$2/hook"
${3:-}
[[outbox.routes]]
sinks = ["a", "b"]
EOF
}

# use_db BACKEND NAME: DATABASE_URL and `q SQL` (one value) for database NAME of this run.
use_db() {
  if [ "$1" = postgres ]; then
    export DATABASE_URL="$PG/$2"
    q() { psql -X -tA -v ON_ERROR_STOP=1 "$DATABASE_URL" -c "$1"; }
    EPOCH="extract(epoch FROM max(dispatched_at))"
  else
    export DATABASE_URL="sqlite://$WORK/$2.db"
    q() { python3 - "${DATABASE_URL#sqlite://}" "$1" <<'PY'
import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]):
    print("|".join("" if v is None else str(v) for v in row))
PY
    }
    EPOCH="max(dispatched_at) / 1000.0"
  fi
}
zero() { [ "$(q "$1")" = 0 ]; }
equals() { [ "$(q "$1")" = "$2" ]; }

# fill BACKEND: database ${TAG}_fill holding the backlog; N = lane a's rows (= lane b's).
fill() {
  local backend=$1
  if [ "$backend" = postgres ]; then bench_createdb "${TAG}_fill"; fi
  use_db "$backend" "${TAG}_fill"
  sinks_toml 9 9 >"$WORK/fill.toml" # not delivered: no relay runs on the fill
  DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    bench_start_worker "$WORK/ingress.log" "$BIN" --config "$WORK/fill.toml" serve
  "$OUT/examples/loadgen" --url "$URL/webhooks/stripe" --connections "$CONNECTIONS" \
    --seconds 300 --requests "$EVENTS" >"$WORK/loadgen.log" 2>&1
  bench_stop_last
  echo "fill ($backend): $(grep -m1 'req/s' "$WORK/loadgen.log" || tail -1 "$WORK/loadgen.log")"
  DEDUP_LISTEN=127.0.0.1:0 bench_spawn "$WORK/consume.log" "$BIN" --config "$WORK/fill.toml" consume
  BENCH_POLL=0.5 bench_wait_until "consumer drain" 600 "$LAST" zero "SELECT count(*) FROM queue_messages"
  bench_stop_last
  N=$(q "SELECT count(*) FROM outbox WHERE sink = 'a'")
  [ "$N" -gt 0 ] && equals "SELECT count(*) FROM outbox WHERE sink = 'b'" "$N" || {
    echo "fill: outbox rows by lane: $(q "SELECT sink, count(*) FROM outbox GROUP BY 1")" >&2; return 1; }
  echo "fill ($backend): $N events → $((2 * N)) outbox rows (lanes a and b), $(q "SELECT count(*) FROM outbox WHERE sink NOT IN ('a', 'b')") elsewhere"
}

# start_receiver MODE NAME: RECV_PID and RECV_PORT (its arrivals go to $WORK/NAME.json at stop).
start_receiver() {
  bench_spawn "$WORK/$2.log" python3 "$RECEIVER" "$1" "$WORK/$2.json"
  RECV_PID=$LAST
  bench_wait_until "receiver $2" 10 "$LAST" grep -q '^listening' "$WORK/$2.log"
  RECV_PORT=$(awk '/^listening/ { print $2 }' "$WORK/$2.log")
}

# cpu_seconds PID: user + system CPU the process has used.
cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.1f", ($12 + $13) / hz }' "/proc/$1/stat"
}

# run BACKEND ROUND NUMBER KIND: one relay run on a fresh copy of the backlog; appends its line
# to $WORK/rows (backend round run kind rate p50 p99 … tab-separated) and prints it.
run() {
  local backend=$1 r=$2 n=$3 kind=$4 db=${TAG}_r$3 mode_b extra="" a_pid b_pid relay start
  case $kind in
    H | P) mode_b=ok ;;
    X) mode_b=hang ;;
    XOFF) mode_b=hang; extra='breaker = { failures = 0, window = 0 }' ;;
    X30) mode_b=delay:30; extra='http_timeout = "40s"' ;;
    *) echo "unknown variant $kind (H, X, X30, XOFF, P)" >&2; return 2 ;;
  esac
  if [ "$backend" = postgres ]; then
    bench_createdb "$db" "${TAG}_fill"
  else
    python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' \
      "$WORK/${TAG}_fill.db" "$WORK/$db.db"
  fi
  use_db "$backend" "$db"
  start_receiver ok "a$n"; a_pid=$RECV_PID; local port_a=$RECV_PORT
  start_receiver "$mode_b" "b$n"; b_pid=$RECV_PID; local port_b=$RECV_PORT
  sinks_toml "$port_a" "$port_b" "$extra" >"$WORK/r$n.toml"
  if [ "$kind" = P ]; then "$BIN" --config "$WORK/r$n.toml" outbox pause b >/dev/null; fi
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  DEDUP_LISTEN=127.0.0.1:0 bench_spawn "$WORK/relay$n.log" "$BIN" --config "$WORK/r$n.toml" relay
  relay=$LAST
  BENCH_POLL=0.2 bench_wait_until "lane a drain (run $n, $kind)" 600 "$relay" \
    zero "SELECT count(*) FROM outbox WHERE sink = 'a' AND status = 'pending'"
  # What lane b did meanwhile, read while the relay still runs.
  local end cpu b_rows opened url deferred failed
  end=$(q "SELECT $EPOCH FROM outbox WHERE sink = 'a'")
  cpu="$(cpu_seconds "$relay")/$(cpu_seconds "$a_pid")/$(cpu_seconds "$b_pid")"
  b_rows=$(q "SELECT status || ' ' || count(*) || ' (' || sum(attempts) || ' att.)' FROM outbox
              WHERE sink = 'b' GROUP BY status ORDER BY status" | paste -sd, | sed 's/,/, /g')
  opened=$(grep -c 'circuit opened' "$WORK/relay$n.log" || true)
  url=$(sed -n 's/^dedup-worker listening on \(http:[^ ]*\).*/\1/p' "$WORK/relay$n.log" | head -1)
  deferred=$({ curl -sf "$url/metrics" || true; } |
    awk '/^dedup_outbox_deferred_total\{/ && /lane="b"/ { s += $2 } END { print s + 0 }')
  failed=$(bench_metric "$url" dedup_outbox_delivery_failures_total)
  bench_stop "$a_pid" "$b_pid" "$relay"
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$WORK/a$n.json" "$KEEP/$backend-$n-$kind.a.json"
    cp "$WORK/b$n.json" "$KEEP/$backend-$n-$kind.b.json"
    cp "$WORK/relay$n.log" "$KEEP/$backend-$n-$kind.relay.log"
    echo "$start" >"$KEEP/$backend-$n-$kind.start"
  fi
  if [ "$backend" = postgres ]; then bench_dropdb "$db"; else rm -f "$WORK/$db.db"*; fi
  python3 - "$WORK/a$n.json" "$start" "$end" "$N" "$backend" "$r" "$n" "$kind" "$load" "$cpu" \
    "$b_rows" "$opened" "$deferred" "$failed" >>"$WORK/rows" <<'PY'
import json, sys
a, start, end, n = json.load(open(sys.argv[1])), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
backend, rnd, run, kind, load, cpu, b_rows, opened, deferred, failed = sys.argv[5:]
if a["unique"] != n:
    sys.exit(f"run {run}: receiver A saw {a['unique']} distinct keys, not {n}")
d = sorted((t - start) * 1000 for t in a["times"])
pct = lambda p: d[min(len(d) - 1, int(p * len(d)))]
rate = n / (end - start)
print(f"{backend}\t{rnd}\t{run}\t{kind}\t{rate:.0f}\t{pct(.5):.0f}\t{pct(.99):.0f}\t{d[-1]:.0f}\t{a['requests'] - n}"
      f"\t{load}\t{cpu}\t{opened}\t{deferred}\t{failed}\t{b_rows}")
PY
  tail -1 "$WORK/rows" | awk -F'\t' -v FORMAT="$FORMAT" '{ printf FORMAT, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 }'
}

bench_calibrate
echo "dedup-worker $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates src Cargo.toml Cargo.lock || echo ' (plus uncommitted changes)'), EVENTS=$EVENTS, $ROUNDS rounds of H $KINDS, $(date -u +%FT%TZ)"
: >"$WORK/rows"
for backend in $BACKENDS; do
  fill "$backend"
  # shellcheck disable=SC2059 # the table's format
  printf "$FORMAT" backend round run kind \
    'a rows/s' 'p50 ms' 'p99 ms' 'max ms' dup load 'cpu s: relay/A/B' open deferred failed \
    "lane b's rows when lane a finished"
  n=0
  for r in $(seq "$ROUNDS"); do
    order="H $KINDS"
    if [ $((r % 2)) = 0 ]; then order=$(echo "$order" | tr ' ' '\n' | tac | paste -sd' '); fi
    for kind in $order; do
      n=$((n + 1))
      run "$backend" "$r" "$n" "$kind"
    done
  done
  if [ "$backend" = postgres ]; then bench_dropdb "${TAG}_fill"; fi
done
echo "per round, kind / H of the same round (lane a's rows/s, p50, p99; X / P too when both ran):"
python3 - "$WORK/rows" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
runs = {(r[0], r[1], r[3]): [float(r[i]) for i in (4, 5, 6)] for r in rows}
ratios = {}
for (backend, rnd, kind), v in runs.items():
    refs = [("H", runs.get((backend, rnd, "H")))]
    if kind.startswith("X"):
        refs.append(("P", runs.get((backend, rnd, "P"))))
    for ref, h in refs:
        if kind == ref or h is None:
            continue
        x = [v[i] / h[i] for i in range(3)]
        ratios.setdefault((backend, f"{kind}/{ref}"), []).append(x)
        print(f"  {backend} round {rnd} {kind}/{ref}: rate {x[0]:.2f}, p50 {x[1]:.2f}, p99 {x[2]:.2f}")
for (backend, name), xs in ratios.items():
    med = [statistics.median(x[i] for x in xs) for i in range(3)]
    print(f"  {backend} {name} median of {len(xs)}: rate {med[0]:.2f}, p50 {med[1]:.2f}, p99 {med[2]:.2f}")
PY
bench_calibrate
