#!/usr/bin/env bash
# Side by side: the checkout example's first payments (crates/idempotency-key/examples/checkout,
# Rust, behind the idempotency-key layer) against the same endpoint in Express + pg + ioredis
# (bench/compare_checkout/server.js, the usual Redis-lock recipe), on this machine.
#
# Usage: bench/compare_checkout.sh [rounds] [seconds] [connections]     (defaults 3, 10, 32)
# Environment: EXPRESS_WORKERS (node:cluster processes, default 1; the 32 pg connections are
# split between them), PG (server URL), REDIS_URL, and the ports below.
#
# Both charge the SAME provider stub: the one the Rust checkout runs in its own process (fixed
# port through PROVIDER_LISTEN), so the provider's work per payment is the same for both; its
# CPU counts in both rounds. Every request is a first payment (a fresh Idempotency-Key), and
# only 201s count.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}
SECS=${2:-10}
CONNS=${3:-32}
EXPRESS_WORKERS=${EXPRESS_WORKERS:-1}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/}
CHECKOUT_PORT=${CHECKOUT_PORT:-18281}
PROVIDER_PORT=${PROVIDER_PORT:-18282}
EXPRESS_PORT=${EXPRESS_PORT:-18283}
ACCOUNTS=5
# One tag per run, with the time (a key of an earlier run under the same pid would be a replay,
# not a first payment): the Express Redis prefix and the start of every Idempotency-Key, so the
# Redis keys this run made (the Rust checkout's prefix is fixed, "checkout-example", and shared
# with anyone else running the example) can be found and deleted.
RUN=cmp$$t$(date +%s)
EXPRESS_PREFIX=$RUN-express

command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
bench_build -p idempotency-key-checkout
# npm ci: exactly the committed lock file.
[ -d bench/compare_checkout/node_modules ] || (cd bench/compare_checkout && npm ci --no-audit --no-fund --silent)

# The Redis keys of this run: the Express prefix, and the Rust checkout's and its provider
# layer's keys whose Idempotency-Key starts with this run's tag.
delete_redis_keys() {
  local pattern
  for pattern in "$EXPRESS_PREFIX:*" "checkout-example:*:$RUN-*"; do
    redis-cli -u "$REDIS_URL" --scan --pattern "$pattern" | xargs -r -n 500 redis-cli -u "$REDIS_URL" del >/dev/null
  done
}
bench_at_exit delete_redis_keys

bench_createdb "$TAG"
export DATABASE_URL=$PG/$TAG
sql() { psql "$DATABASE_URL" -tAc "$1"; }
# Waits up to 30 s for the server started last to answer `url` 2xx (the Bearer token of account 0).
wait_ready() { bench_wait_until "$1" 30 "$LAST" curl -sf -H 'Authorization: Bearer acct_0' "$1"; }

bench_calibrate

# The Rust checkout, and in its process the provider stub both implementations charge. Both
# are stopped by SIGTERM at the end: the Express primary stops its cluster workers; the Rust
# checkout drains and exits.
CHECKOUT_LISTEN=127.0.0.1:$CHECKOUT_PORT PROVIDER_LISTEN=127.0.0.1:$PROVIDER_PORT \
  REDIS_URL=$REDIS_URL RUST_LOG=warn bench_spawn "$WORK/rust.log" "$(bench_out_dir)/checkout"
wait_ready "http://127.0.0.1:$CHECKOUT_PORT/v1/payments"
LISTEN=127.0.0.1:$EXPRESS_PORT PROVIDER_URL=http://127.0.0.1:$PROVIDER_PORT REDIS_URL=$REDIS_URL \
  REDIS_PREFIX=$EXPRESS_PREFIX PG_SCHEMA=express_checkout WORKERS=$EXPRESS_WORKERS NODE_ENV=production \
  bench_spawn "$WORK/express.log" node bench/compare_checkout/server.js
wait_ready "http://127.0.0.1:$EXPRESS_PORT/healthz"
declare -A URL=([rust]=http://127.0.0.1:$CHECKOUT_PORT [express]=http://127.0.0.1:$EXPRESS_PORT)
# Where each one's payment rows are.
declare -A PAYMENTS=([rust]=checkout_payments [express]=express_checkout.payments)

# Drives first payments at `impl` for `secs` seconds under key tag `tag`; leaves wrk's output in
# $WORK/<tag>.out. --timeout 10s: a slow answer is counted late, not as an error.
drive() {
  local impl=$1 tag=$2 secs=$3
  wrk -t2 -c"$CONNS" -d"${secs}s" --timeout 10s -s bench/compare_checkout/first_payments.lua \
    "${URL[$impl]}" -- "$tag" "$ACCOUNTS" >"$WORK/$tag.out" 2>&1 || { cat "$WORK/$tag.out"; exit 1; }
}

# Warm-up, not counted: the connections of both pools, Node's JIT, the provider's keep-alive.
for impl in rust express; do drive "$impl" "$RUN-warm-$impl" 3; done
echo "$ROUNDS rounds of ${SECS}s, $CONNS connections, wrk -t2, $ACCOUNTS accounts, express workers $EXPRESS_WORKERS"

RATIOS=()
for round in $(seq 1 "$ROUNDS"); do
  declare -A RATE=()
  for impl in rust express; do
    tag=$RUN-$impl-$round
    drive "$impl" "$tag" "$SECS"
    read -r ok secs p50 p99 errs < <(sed -n 's/^RESULT ok201=\([0-9]*\) seconds=\([0-9.]*\) p50_ms=\([0-9.]*\) p99_ms=\([0-9.]*\) socket_errors=\([0-9]*\)/\1 \2 \3 \4 \5/p' "$WORK/$tag.out") || true
    [ -n "${ok:-}" ] || { echo "wrk gave no result:"; cat "$WORK/$tag.out"; exit 1; }
    RATE[$impl]=$(awk -v n="$ok" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
    non201=$(sed -n 's/^NON201 status=\([0-9]*\) count=\([0-9]*\)/\1×\2/p' "$WORK/$tag.out" | paste -sd' ')
    printf 'round %d %-7s %8s req/s of 201s (%d in %.1f s, p50 %s ms, p99 %s ms)%s%s\n' \
      "$round" "$impl" "${RATE[$impl]}" "$ok" "$secs" "$p50" "$p99" \
      "${non201:+, non-201: $non201}" "$( ((errs == 0)) || echo ", socket errors: $errs")"
    # Requests in flight when wrk stopped still finish (the Rust layer runs them to the end
    # whatever the client does): let them, then count. Rows may exceed the 201s counted by at
    # most the connections; a key with two payment rows is a double payment.
    sleep 1
    read -r rows dups charges < <(sql "SELECT
        (SELECT count(*) FROM ${PAYMENTS[$impl]} WHERE idempotency_key LIKE '$tag-%'),
        (SELECT count(*) FROM (SELECT 1 FROM ${PAYMENTS[$impl]} WHERE idempotency_key LIKE '$tag-%'
                               GROUP BY account, idempotency_key HAVING count(*) > 1) d),
        (SELECT count(*) FROM provider_charges WHERE idempotency_key LIKE '$tag-%')" | tr '|' ' ') || true
    extra=$((rows - ok))
    verdict=ok
    ((dups == 0 && extra >= 0 && extra <= CONNS)) || verdict=MISMATCH
    echo "        check: $rows payment rows for $ok 201s (+$extra in flight at the end), $dups keys with two rows, $charges provider charges: $verdict"
  done
  ratio=$(awk -v r="${RATE[rust]}" -v e="${RATE[express]}" 'BEGIN { printf "%.2f", (e > 0 ? r / e : 0) }')
  RATIOS+=("$ratio")
  echo "round $round rust/express $ratio"
done

median=$(printf '%s\n' "${RATIOS[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
echo "checkout first payments: rust/express median $median (rounds ${RATIOS[*]})"
