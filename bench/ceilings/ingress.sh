#!/usr/bin/env bash
# The ingress on the database queue against its ceiling (issue 29): what `dedup-worker serve`
# with the consumer and relay off accepts from examples/loadgen (64 connections, as
# bench/pipeline.sh), against what PostgreSQL itself does for the same group commits.
#
# The statement per group (read with log_statement=all; crates/dedup-worker-core/src/queue/database.rs write_groups,
# crates/dedup-worker-core/src/store/queue_rows.rs enqueue): ONE autocommit statement on a pooled connection,
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
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/../lib.sh"
ROUNDS=${1:-3}
CONNECTIONS=${CONNECTIONS:-64}
SECONDS_LOAD=${SECONDS_LOAD:-8}
GROUP=${GROUP:-mean}
# The statements of one group commit (ingress_group.sql: the ingress's own).
GROUP_SQL=${GROUP_SQL:-bench/ceilings/ingress_group.sql}
bench_library_schema
bench_worker_env
WRITERS=$(bench_toml transport publish_writers)
# BIN: a dedup-worker built elsewhere to compare (A/B); else this tree's, built now.
bench_bin --example loadgen
LOADGEN=$OUT/examples/loadgen

echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') ingress ceilings: $ROUNDS rounds, $CONNECTIONS connections, ${SECONDS_LOAD}s, writers $WRITERS, group $GROUP; binary $(sha256sum "$BIN" | cut -c1-12)"
bench_calibrate
bench_createdb "${TAG}_empty"
DATABASE_URL="$PG/${TAG}_empty" "$BIN" migrate >/dev/null

RATIOS=""
for round in $(seq 1 "$ROUNDS"); do
  db=${TAG}_r$round
  bench_createdb "$db" "${TAG}_empty"
  DATABASE_URL="$PG/$db" DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    bench_start_worker "$WORK/ingress.log" "$BIN" serve
  "$LOADGEN" --url "$URL/webhooks/stripe" --connections "$CONNECTIONS" \
    --seconds "$SECONDS_LOAD" --prefix "evt_ceil_$round" >"$WORK/load.log"
  curl -sf "$URL/metrics" | grep '^dedup_queue_group_commit_size' >"$WORK/groups.txt"
  bench_stop_last
  bench_dropdb "$db"
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

  bench_createdb "$db" "${TAG}_empty"
  tps=$(pgbench -n -M prepared -c "$WRITERS" -j 2 -T "$SECONDS_LOAD" -D group="$group" -D queue=dedup.events \
    -f "$GROUP_SQL" "$PG/$db" 2>"$WORK/pgbench.err" | awk '/^tps/ { print $3 }')
  [ -n "$tps" ] || { cat "$WORK/pgbench.err" >&2; exit 1; }
  bench_dropdb "$db"
  ceil=$(python3 -c "import sys; print(round(float(sys.argv[1]) * int(sys.argv[2])))" "$tps" "$group")
  r=$(bench_ratio "$rate" "$ceil")
  RATIOS="$RATIOS $r"
  echo "$(date -u +%H:%M:%S) round $round: ingress $rate req/s (non-2xx $non2xx; $commits group commits, group size p50 $median, mean $mean), ceiling $ceil rows/s (pgbench -c $WRITERS, group $group: $tps commits/s), ratio $r"
done
echo "ingress (database queue): rate/ceiling median $(bench_median "$RATIOS") (rounds: ${RATIOS# })"
