#!/usr/bin/env bash
# The transactional Idempotency-Key request against its ceiling, in alternating rounds.
#   path:    idempotency_load --scenarios insert-first-tx (a new key per request; the handler
#            inserts one row through its IdempotentTx, committed with the stored response), 32
#            keep-alive connections, load generator and server in one process;
#   ceiling: pgbench, 32 clients, bench/ceilings/idempotency_tx.sql: the same statements (claim,
#            the handler's insert, the completion, commit) in one transaction per request, on
#            the same tables (the harness's database, kept between rounds).
# Usage: bench/ceilings/idempotency.sh [rounds] [seconds]      (defaults 3, 8; env POOL: the
#        server's pool, default the harness's 32; env BASE: another build of the harness, e.g.
#        one built at an earlier commit and copied out of target/: then each round runs BASE
#        (A) and this tree's (B) one after the other, A first in odd rounds and B first in even
#        ones, each against the round's ceiling)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/../lib.sh"
ROUNDS=${1:-3}
SECS=${2:-8}
CLIENTS=32
POOL=${POOL:-32}
if [ -n "${BASE:-}" ]; then BASE=$(bench_caller_path "$BASE"); fi
DB=$TAG
bench_build -p idempotency-key --example idempotency_load
bench_createdb "$DB"
tps() { sed -n 's/^tps = \([0-9.]*\).*/\1/p' | cut -d. -f1; }
bench_calibrate

run_path() { # binary → req/s
  DATABASE_URL=$PG/postgres "$1" --database "$DB" \
    --connections $CLIENTS --pool "$POOL" --seconds "$SECS" --scenarios insert-first-tx |
    awk '$1 == "insert-first-tx" { print $2 }'
}
run_ceiling() {
  pgbench -n -M prepared -c $CLIENTS -j 2 -T "$SECS" -f bench/ceilings/idempotency_tx.sql \
    "$PG/$DB" 2>/dev/null | tps
}
NEW=$(bench_out_dir)/examples/idempotency_load
if [ -n "${BASE:-}" ]; then
  # The harness migrates the database and creates bench_charges on its first run.
  run_path "$BASE" >/dev/null
  A=(); B=()
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) -eq 1 ]; then a=$(run_path "$BASE"); b=$(run_path "$NEW"); order=AB
    else b=$(run_path "$NEW"); a=$(run_path "$BASE"); order=BA; fi
    ceiling=$(run_ceiling)
    A+=("$(python3 -c "print(f'{$a / $ceiling:.3f}')")"); B+=("$(python3 -c "print(f'{$b / $ceiling:.3f}')")")
    echo "round $round ($order): A $a req/s, B $b req/s, ceiling $ceiling tps, B/A $(python3 -c "print(f'{$b / $a:.3f}')")"
  done
  python3 - "${A[*]}" "${B[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print(f"A rate/ceiling median {statistics.median(a):.2f} ({' '.join(sys.argv[1].split())})")
print(f"B rate/ceiling median {statistics.median(b):.2f} ({' '.join(sys.argv[2].split())})")
print(f"B/A of the medians {statistics.median(b) / statistics.median(a):.3f}")
PY
  exit 0
fi

RATIOS=()
for round in $(seq 1 "$ROUNDS"); do
  # The harness migrates the database and creates bench_charges on its first run, so the
  # path goes first in every round.
  path=$(run_path "$NEW")
  ceiling=$(run_ceiling)
  ratio=$(bench_ratio "$path" "$ceiling")
  RATIOS+=("$ratio")
  echo "round $round: transactional request $path req/s, ceiling $ceiling tps, ratio $ratio"
done
echo "idempotency (transactional): rate/ceiling median $(bench_median "${RATIOS[*]}") (rounds: ${RATIOS[*]})"
