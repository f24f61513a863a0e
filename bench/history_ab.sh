#!/usr/bin/env bash
# Issue 40's cost check: the pipeline's three rates (bench/pipeline.sh: ingress requests/s,
# consumer events/s, relay rows/s; PostgreSQL) with the history kept (retention.payload_days =
# 14: each handled event's body compressed into event_bodies, each delivery attempt into
# outbox_attempts) against without (payload_days = 0: neither; the per-minute counts are
# written either way), in alternating rounds (A B A B …: this machine is shared and noisy), a
# pgbench calibration line first and last.
# Usage: bench/history_ab.sh [rounds=2] [connections=64] [seconds=10]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-2}
CONNECTIONS=${2:-64}
SECONDS_LOAD=${3:-10}
bench_library_schema
bench_worker_env
bench_build --bin dedup-worker --example loadgen
bench_calibrate
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
run() { # run NAME PAYLOAD_DAYS
  DEDUP_RETENTION__PAYLOAD_DAYS=$2 "$(dirname "$0")/pipeline.sh" "$CONNECTIONS" "$SECONDS_LOAD" postgres \
    >"$LOG/$1.log" 2>&1 || { cat "$LOG/$1.log"; exit 1; }
  local ingress consumer relay
  ingress=$(sed -n 's/^requests: .* = \([0-9]*\) req\/s.*/\1/p' "$LOG/$1.log")
  consumer=$(sed -n 's/^consumer events: .* = \([0-9]*\)\/s$/\1/p' "$LOG/$1.log")
  relay=$(sed -n 's/^relay rows: .* = \([0-9]*\)\/s$/\1/p' "$LOG/$1.log")
  printf '%-22s payload_days=%-3s ingress %8s req/s  consumer %6s ev/s  relay %6s rows/s\n' \
    "$1" "$2" "${ingress:-?}" "${consumer:-?}" "${relay:-?}"
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then
    run "round $round A (kept)" 14; run "round $round B (none)" 0
  else
    run "round $round B (none)" 0; run "round $round A (kept)" 14
  fi
done
bench_calibrate
