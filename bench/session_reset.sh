#!/usr/bin/env bash
# What the session reset of a kept connection costs PostgreSQL (issue 36, item 3): a request's
# transaction (BEGIN, one insert, COMMIT, three round trips) with its BEGIN plain (A,
# bench/session_reset/begin.sql) or prefixed by the reset the store sends on a kept connection
# (B, reset_begin.sql: the string `crates/idempotency-key/src/store/kept.rs` builds for a pool
# whose after_connect sets search_path), in one round trip either way. Alternating rounds
# A,B,A,B,… (B first in even rounds), pgbench simple protocol as sqlx sends BEGIN.
# Usage: bench/session_reset.sh [rounds] [seconds] [clients]     (defaults 4, 8, 8)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-4}
SECS=${2:-8}
CLIENTS=${3:-8}
bench_createdb "$TAG"
bench_sql "$PG/$TAG" "CREATE TABLE session_reset_bench (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)" >/dev/null
run() { # script → "tps latency_ms"
  pgbench -n -M simple -c "$CLIENTS" -j 2 -T "$SECS" -f "bench/session_reset/$1.sql" "$PG/$TAG" 2>/dev/null |
    awk '/^latency average/ { l = $4 } /^tps/ { t = int($3) } END { print t, l }'
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then a=$(run begin); b=$(run reset_begin); order=AB
  else b=$(run reset_begin); a=$(run begin); order=BA; fi
  read -r a_tps a_ms <<<"$a"
  read -r b_tps b_ms <<<"$b"
  echo "round $round ($order): A $a_tps tps ($a_ms ms), B $b_tps tps ($b_ms ms), B/A $(python3 -c "print(f'{$b_tps / $a_tps:.3f}')")"
done
