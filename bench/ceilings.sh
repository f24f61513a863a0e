#!/usr/bin/env bash
# Each hot path's rate next to its ceiling: what PostgreSQL itself does with exactly the
# statements the path sends, at the same concurrency (issue 29). One script per path, each in
# alternating rounds (path, ceiling, path, ceiling, …) with a calibration line first; this one
# runs them in turn and repeats their summary lines at the end.
#   bench/ceilings/idempotency.sh  the transactional Idempotency-Key request (claim, the
#                                  handler's insert, the completion, commit);
#   bench/ceilings/consumer.sh     one consumer batch (database queue and RabbitMQ);
#   bench/ceilings/ingress.sh      the database queue's group commit behind the ingress.
# Usage: bench/ceilings.sh [rounds]   (default 3; the machine is shared and noisy: read ratios
# of back-to-back rounds, never one absolute figure)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}
LOG=$WORK/ceilings.log
# Built once here; the scripts below find it built (BENCH_BUILT).
bench_build -p idempotency-key --example idempotency_load
[ -n "${BIN:-}" ] || bench_build --bin dedup-worker --example loadgen
for path in idempotency consumer ingress; do
  echo "== $path"
  bash "bench/ceilings/$path.sh" "$ROUNDS" | tee -a "$LOG"
done
echo "== summary"
grep -E 'median' "$LOG"
