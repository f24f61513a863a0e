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
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-10}
CONNS=${3:-32}
EXPRESS_WORKERS=${EXPRESS_WORKERS:-1}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/}
CHECKOUT_PORT=${CHECKOUT_PORT:-18281}
PROVIDER_PORT=${PROVIDER_PORT:-18282}
EXPRESS_PORT=${EXPRESS_PORT:-18283}
ACCOUNTS=5
# One tag per run: the scratch database, the Express Redis prefix, and the start of every
# Idempotency-Key, so the Redis keys this run made (the Rust checkout's prefix is fixed,
# "checkout-example", and shared with anyone else running the example) can be found and deleted.
RUN=cmp$$t$(date +%s)
DB=${RUN}
EXPRESS_PREFIX=$RUN-express
WORK=$(mktemp -d)
PIDS=()

command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
cargo build --release --quiet -p idempotency-key-checkout
# npm ci: exactly the committed lock file.
[ -d bench/compare_checkout/node_modules ] || (cd bench/compare_checkout && npm ci --no-audit --no-fund --silent)

cleanup() {
  set +e
  # Only what this script started, by pid (the machine is shared). SIGTERM lets the Express
  # primary stop its cluster workers; the Rust checkout drains and exits.
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>/dev/null
  # The Redis keys of this run: the Express prefix, and the Rust checkout's and its provider
  # layer's keys whose Idempotency-Key starts with this run's tag.
  for pattern in "$EXPRESS_PREFIX:*" "checkout-example:*:$RUN-*"; do
    redis-cli -u "$REDIS_URL" --scan --pattern "$pattern" | xargs -r -n 500 redis-cli -u "$REDIS_URL" del >/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

psql "$PG/postgres" -qc "CREATE DATABASE $DB"
export DATABASE_URL=$PG/$DB
sql() { psql "$DATABASE_URL" -tAc "$1"; }

# Waits for `url` to answer 2xx (with `auth` as bearer), or fails if `pid` exited or 30 s passed.
wait_ready() {
  local url=$1 pid=$2 deadline=$((SECONDS + 30))
  until curl -sf -H 'Authorization: Bearer acct_0' "$url" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "server $pid exited:"; cat "$WORK"/*.log; exit 1; }
    ((SECONDS < deadline)) || { echo "$url not ready in 30 s"; exit 1; }
    sleep 0.2
  done
}

# Calibration: what this machine's PostgreSQL does right now (the same one-row insert as the
# other bench scripts), so figures from different days can be compared.
sql "CREATE TABLE cmp_calibration (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)" >/dev/null
echo 'INSERT INTO cmp_calibration (v) VALUES (1);' >"$WORK/calibration.sql"
TPS=$(pgbench -n -M prepared -c 16 -j 2 -T 8 -f "$WORK/calibration.sql" "$DATABASE_URL" 2>/dev/null |
  sed -n 's/^tps = \([0-9.]*\).*/\1/p')
echo "calibration: pgbench -n -M prepared -c 16 -j 2 -T 8, one-row insert: ${TPS%.*} tps ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"

# The Rust checkout, and in its process the provider stub both implementations charge.
CHECKOUT_LISTEN=127.0.0.1:$CHECKOUT_PORT PROVIDER_LISTEN=127.0.0.1:$PROVIDER_PORT \
  REDIS_URL=$REDIS_URL RUST_LOG=warn target/release/checkout >"$WORK/rust.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$CHECKOUT_PORT/v1/payments" "${PIDS[-1]}"
LISTEN=127.0.0.1:$EXPRESS_PORT PROVIDER_URL=http://127.0.0.1:$PROVIDER_PORT REDIS_URL=$REDIS_URL \
  REDIS_PREFIX=$EXPRESS_PREFIX PG_SCHEMA=express_checkout WORKERS=$EXPRESS_WORKERS NODE_ENV=production \
  node bench/compare_checkout/server.js >"$WORK/express.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$EXPRESS_PORT/healthz" "${PIDS[-1]}"
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
