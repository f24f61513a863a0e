#!/usr/bin/env bash
# What the session reset of a kept connection costs PostgreSQL (issue 36, item 3): a request's
# transaction (BEGIN, one insert, COMMIT, three round trips) with its BEGIN plain (A,
# bench/session_reset/begin.sql) or prefixed by the reset the store sends on a kept connection
# (B, reset_begin.sql: the string `crates/idempotency-key/src/store/kept.rs` builds for a pool
# whose after_connect sets search_path), in one round trip either way. Alternating rounds
# A,B,A,B,… (B first in even rounds), pgbench simple protocol as sqlx sends BEGIN.
# Usage: bench/session_reset.sh [rounds] [seconds] [clients]     (defaults 4, 8, 8)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-4}
SECS=${2:-8}
CLIENTS=${3:-8}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
DB=session_reset_$$
cleanup() { psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)"; }
trap cleanup EXIT
psql "$PG/postgres" -qc "CREATE DATABASE $DB"
psql "$PG/$DB" -qc "CREATE TABLE session_reset_bench (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)"
run() { # script → "tps latency_ms"
  pgbench -n -M simple -c "$CLIENTS" -j 2 -T "$SECS" -f "bench/session_reset/$1.sql" "$PG/$DB" 2>/dev/null |
    awk '/^latency average/ { l = $4 } /^tps/ { t = int($3) } END { print t, l }'
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then a=$(run begin); b=$(run reset_begin); order=AB
  else b=$(run reset_begin); a=$(run begin); order=BA; fi
  set -- $a $b
  echo "round $round ($order): A $1 tps ($2 ms), B $3 tps ($4 ms), B/A $(python3 -c "print(f'{$3 / $1:.3f}')")"
done
