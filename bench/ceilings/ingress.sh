#!/usr/bin/env bash
# The ingress on the database queue against its ceiling (issue 29): what `dedup-worker serve`
# with the consumer and relay off accepts from examples/loadgen (64 connections, as
# bench/pipeline.sh), against what PostgreSQL itself does for the same group commits.
#
# The statement per group (read with log_statement=all; src/queue/database.rs write_groups,
# src/store/queue_rows.rs enqueue): ONE autocommit statement on a pooled connection,
#   WITH inserted AS (INSERT INTO queue_messages … SELECT $1, * FROM UNNEST(…) RETURNING 1)
#   SELECT pg_notify($5, $1), (SELECT count(*) FROM inserted)
# sent by `transport.publish_writers` writer tasks (default 4), each group what was waiting
# (ingress_group.sql). GROUP_SQL=bench/ceilings/ingress_group_notify_after.sql measures the
# variant with the NOTIFY after the commit, in a transaction of its own without a flush.
#
# Each round, in this order:
#   path:    a fresh database, an ingress-only `serve`, loadgen --connections $CONNECTIONS
#            --seconds $SECONDS_LOAD: accepted requests/s; the group sizes from its /metrics
#            (dedup_queue_group_commit_size: median interpolated in its buckets, and mean);
#   ceiling: a fresh migrated database, pgbench -M prepared -c <writers> -j 2 -T $SECONDS_LOAD
#            of ingress_group.sql with that round's mean group size (rows per commit; GROUP=median
#            takes the median, GROUP=<n> a fixed size): rows/s = tps × group size.
#            The mean, not the median: at 64 connections the sizes are skewed (2026-12-04:
#            median 2–6.5, mean 9–12; many commits of one or two rows while a commit is in
#            flight, most rows in the large groups that gather behind it), so the median's
#            ceiling is a fraction of the rows the path actually commits per commit.
# Prints a calibration line first (pgbench -n -M prepared -c 16 -j 2 -T 8, one-row insert),
# a line per round, and the summary: rate/ceiling median.
# Every database is this run's own (names with the shell's pid) and dropped at the end; only
# processes this script started are stopped.
# Usage: bench/ceilings/ingress.sh [rounds]   (env: CONNECTIONS=64, SECONDS_LOAD=8, GROUP=mean|median|<n>, BIN, GROUP_SQL)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
CONNECTIONS=${CONNECTIONS:-64}
SECONDS_LOAD=${SECONDS_LOAD:-8}
GROUP=${GROUP:-mean}
# The statements of one group commit (ingress_group.sql: the ingress's own).
GROUP_SQL=${GROUP_SQL:-bench/ceilings/ingress_group.sql}
PG=postgres://postgres@127.0.0.1:5432
HERE=bench/ceilings
export PGOPTIONS='-c search_path=dedup_worker,public'
export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn
conf() { awk -v s="[$1]" -v k="$2" '$0 == s { c = 1; next } /^\[/ { c = 0 } c && $1 == k { print $3; exit }' config/default.toml; }
WRITERS=$(conf transport publish_writers)
TAG=dw_ceil_i_$$
WORK=$(mktemp -d)
# BIN: a dedup-worker built elsewhere to compare (A/B; then nothing is built here, and
# target/release/examples/loadgen must exist); else this tree's, built now.
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --bin dedup-worker --example loadgen
  BIN=target/release/dedup-worker
fi

PIDS=""
cleanup() {
  # Only the processes this script started: the machine is shared.
  [ -z "$PIDS" ] || kill $PIDS 2>/dev/null || true
  for db in $(psql -X "$PG/postgres" -tAc "SELECT datname FROM pg_database WHERE datname LIKE '${TAG}%'"); do
    psql -X "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
q() { psql -X -tA -v ON_ERROR_STOP=1 "$1" -c "$2"; }
start() { # as in consumer.sh: LAST = pid, URL = its address once /readyz answers
  local log=$1; shift
  DEDUP_LISTEN=127.0.0.1:0 "$@" >"$log" 2>&1 &
  LAST=$!; PIDS="$PIDS $LAST"
  URL=""
  for _ in $(seq 1 300); do
    URL=$(sed -n 's/^dedup-worker listening on \(http:[^ ]*\).*/\1/p' "$log" | head -1)
    if [ -n "$URL" ] && curl -sf "$URL/readyz" >/dev/null; then return 0; fi
    kill -0 "$LAST" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.1
  done
  echo "dedup-worker did not become ready" >&2; return 1
}
stop_last() { kill "$LAST" 2>/dev/null || true; wait "$LAST" 2>/dev/null || true; }

echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') ingress ceilings: $ROUNDS rounds, $CONNECTIONS connections, ${SECONDS_LOAD}s, writers $WRITERS, group $GROUP; binary $(sha256sum "$BIN" | cut -c1-12)"
q "$PG/postgres" "CREATE DATABASE ${TAG}_calib" >/dev/null
q "$PG/${TAG}_calib" "CREATE TABLE ceil_calibration (id BIGSERIAL PRIMARY KEY, v INTEGER NOT NULL)" >/dev/null
CALIB=$(pgbench -n -M prepared -c 16 -j 2 -T 8 -f "$HERE/calibration.sql" "$PG/${TAG}_calib" 2>/dev/null |
  awk '/^tps/ { printf "%d", $3 }')
q "$PG/postgres" "DROP DATABASE ${TAG}_calib" >/dev/null
echo "calibration: pgbench -n -M prepared -c 16 -j 2 -T 8 (one-row insert): $CALIB commits/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
q "$PG/postgres" "CREATE DATABASE ${TAG}_empty" >/dev/null
DATABASE_URL="$PG/${TAG}_empty" "$BIN" migrate >/dev/null

RATIOS=""
for round in $(seq 1 "$ROUNDS"); do
  db=${TAG}_r$round
  q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_empty" >/dev/null
  DATABASE_URL="$PG/$db" DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    start "$WORK/ingress.log" "$BIN" serve
  target/release/examples/loadgen --url "$URL/webhooks/stripe" --connections "$CONNECTIONS" \
    --seconds "$SECONDS_LOAD" --prefix "evt_ceil_$round" >"$WORK/load.log"
  curl -sf "$URL/metrics" | grep '^dedup_queue_group_commit_size' >"$WORK/groups.txt"
  stop_last
  q "$PG/postgres" "DROP DATABASE $db WITH (FORCE)" >/dev/null
  rate=$(sed -n 's/.*= \([0-9.]*\) req\/s.*/\1/p' "$WORK/load.log")
  non2xx=$(sed -n 's/.*non-2xx: \([0-9]*\).*/\1/p' "$WORK/load.log")
  # median (interpolated inside its power-of-two bucket) and mean of the group sizes
  read -r median mean commits < <(python3 - "$WORK/groups.txt" <<'EOF'
import re, sys
buckets, total, count = [], 0.0, 0.0
for line in open(sys.argv[1]):
    m = re.match(r'dedup_queue_group_commit_size_bucket\{le="([^"]+)"\} (\S+)', line)
    if m and m.group(1) != "+Inf":
        buckets.append((float(m.group(1)), float(m.group(2))))
    elif line.startswith("dedup_queue_group_commit_size_sum "):
        total = float(line.split()[1])
    elif line.startswith("dedup_queue_group_commit_size_count "):
        count = float(line.split()[1])
half, lo, below = count / 2, 0.0, 0.0
median = buckets[-1][0] if buckets else 1.0
for le, cum in buckets:
    if cum >= half:
        median = lo + (le - lo) * (half - below) / max(cum - below, 1e-9)
        break
    lo, below = le, cum
print(f"{median:.1f} {total / max(count, 1):.1f} {int(count)}")
EOF
  )
  case $GROUP in
    median) group=$(python3 -c "import sys; print(max(1, round(float(sys.argv[1]))))" "$median") ;;
    mean) group=$(python3 -c "import sys; print(max(1, round(float(sys.argv[1]))))" "$mean") ;;
    *) group=$GROUP ;;
  esac

  q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_empty" >/dev/null
  tps=$(pgbench -n -M prepared -c "$WRITERS" -j 2 -T "$SECONDS_LOAD" -D group="$group" -D queue=dedup.events \
    -f "$GROUP_SQL" "$PG/$db" 2>"$WORK/pgbench.err" | awk '/^tps/ { print $3 }')
  [ -n "$tps" ] || { cat "$WORK/pgbench.err" >&2; exit 1; }
  q "$PG/postgres" "DROP DATABASE $db WITH (FORCE)" >/dev/null
  ceil=$(python3 -c "import sys; print(round(float(sys.argv[1]) * int(sys.argv[2])))" "$tps" "$group")
  r=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$rate" "$ceil")
  RATIOS="$RATIOS $r"
  echo "$(date -u +%H:%M:%S) round $round: ingress $rate req/s (non-2xx $non2xx; $commits group commits, group size p50 $median, mean $mean), ceiling $ceil rows/s (pgbench -c $WRITERS, group $group: $tps commits/s), ratio $r"
done
python3 -c "
import statistics, sys
r = [float(x) for x in sys.argv[1].split()]
print(f'ingress (database queue): rate/ceiling median {statistics.median(r):.2f} (rounds: {sys.argv[1].strip()})')" "$RATIOS"
