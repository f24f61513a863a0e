# shellcheck shell=bash
# bench/history.sh's step 4, sourced by it (its variables, bench/lib.sh's functions): a day's
# partition dropped by `dedup-worker retention run` while `dedup-worker serve` consumes at full
# rate: a backlog queued first (ingress only, BACKLOG_SECONDS), then serve (ingress + consumer)
# with loadgen still sending, so the consumer never waits for work. Holds /tmp/bench.lock throughout: the whole step is the measurement.

# One line per half second: time, handled events, failed consumer steps, bodies not kept.
sample_metrics() {
  local m
  while :; do
    m=$(curl -sf "$URL/metrics" || true)
    printf '%s %s %s %s\n' "$(date +%s.%N)" \
      "$(awk '$1 == "dedup_events_handled_total" { print int($2) }' <<<"$m")" \
      "$(awk '$1 == "dedup_consumer_step_failures_total" { v = int($2) } END { print v + 0 }' <<<"$m")" \
      "$(awk '/^dedup_history_not_kept_total\{.*event_bodies/ { v = int($2) } END { print v + 0 }' <<<"$m")"
    sleep 0.5
  done
}

exec 9>"$LOCK"
flock 9
echo "== drop under load: serve + loadgen ($CONNECTIONS connections, ${LOAD_SECONDS}s), retention run at ${DROP_AT}s ($(date -u +%H:%M:%S), load $(load))"
oldest=$(q "SELECT min(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'event_bodies'::regclass")
echo "oldest partition: $oldest ($(q "SELECT to_char(reltuples, 'FM999,999,999') || ' bodies, ' || pg_size_pretty(pg_total_relation_size(oid))
                                        FROM pg_class WHERE relname = '$oldest'"))"
bench_worker_env
# A backlog first (ingress only), so the consumer never waits for work even while loadgen's
# requests take CPU from it: the queue must stay non-empty to the end (printed below).
DATABASE_URL=$URL_DB DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  bench_start_worker "$WORK/ingress.log" "$BIN" serve
"$OUT/examples/loadgen" --url "$URL/webhooks/stripe" --connections "$CONNECTIONS" \
  --seconds "$BACKLOG_SECONDS" >"$WORK/backlog.log"
bench_stop_last
queued_before=$(q "SELECT count(*) FROM queue_messages")
DATABASE_URL=$URL_DB DEDUP_ROLES__RELAY=false DEDUP_SINK=log \
  bench_start_worker "$WORK/serve.log" "$BIN" serve
SERVE=$LAST
bench_spawn "$WORK/samples" sample_metrics
SAMPLER=$LAST
bench_spawn "$WORK/loadgen.log" "$OUT/examples/loadgen" --url "$URL/webhooks/stripe" \
  --connections "$CONNECTIONS" --seconds "$LOAD_SECONDS"
LOADGEN=$LAST
sleep "$DROP_AT"
drop_start=$(date +%s.%N)
DATABASE_URL=$URL_DB RUST_LOG=info DEDUP_RETENTION__PAYLOAD_DAYS=$((DAYS - 1)) \
  "$BIN" retention run >"$WORK/retention.json" 2>"$WORK/retention.log"
drop_end=$(date +%s.%N)
while kill -0 "$LOADGEN" 2>/dev/null; do sleep 0.5; done
bench_stop "$LOADGEN" "$SAMPLER"
tail -2 "$WORK/loadgen.log"
queued_after=$(q "SELECT count(*) FROM queue_messages")
bench_stop "$SERVE"
# What is left queued would make the next run's backlog bigger than this one's.
q "TRUNCATE queue_messages" >/dev/null
flock -u 9
echo "retention run: $(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$drop_start" "$drop_end") s wall (the CLI's start and every step of the pass)"
python3 - "$WORK/retention.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for table, d in p["partitions"]:
    if "timings" not in d:  # a binary from before the JSON said it: its log line does
        print(f"{table}: dropped {d['dropped']} (see the log's seconds below)")
    for name, t in zip(d["dropped"], d.get("timings", [])):
        print(f"{table}: {name} DETACH CONCURRENTLY {t['detach_micros'] / 1e3:.1f} ms + DROP {t['drop_micros'] / 1e3:.1f} ms"
              f" = {(t['detach_micros'] + t['drop_micros']) / 1e3:.1f} ms")
print("errors:", p["errors"])
PY
grep 'partition dropped' "$WORK/retention.log" | sed 's/\x1b\[[0-9;]*m//g' || true
python3 - "$WORK/samples" "$drop_start" "$drop_end" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 4 and l.split()[1]]
t = [float(r[0]) for r in rows]; h = [int(r[1]) for r in rows]
fails = [int(r[2]) for r in rows]; not_kept = [int(r[3]) for r in rows]
s, e = float(sys.argv[2]), float(sys.argv[3])
def at(x, ys):  # ys interpolated at time x
    for i in range(1, len(t)):
        if t[i] >= x:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - t[i - 1]) / (t[i] - t[i - 1])
    return ys[-1]
def rate(a, b):
    return (at(b, h) - at(a, h)) / (b - a)
# "during" is at least one second: the pass may take less than the sampling step.
d_end = max(e, s + 1)
print(f"consumer handled/s: 10 s before {rate(s - 10, s):.0f}, during ({e - s:.2f} s, measured over "
      f"{d_end - s:.2f} s) {rate(s, d_end):.0f}, 10 s after {rate(d_end, d_end + 10):.0f}")
print("per second around the pass:", " ".join(f"{rate(x, x + 1):.0f}" for x in [s - 5 + i for i in range(12)]))
print(f"dedup_consumer_step_failures_total: {fails[0]} at start, {round(at(s, fails))} before the pass, {fails[-1]} at end")
print(f"dedup_history_not_kept_total{{table=event_bodies}}: {not_kept[0]} at start, {not_kept[-1]} at end")
PY
if ((queued_after > 0)); then
  echo "queue backlog: $queued_before before, $queued_after after: never empty, the consumer ran at its full rate"
else
  echo "queue backlog: $queued_before before, 0 after: it ran dry at some point (raise BACKLOG_SECONDS); read the per-second rates"
fi
grep -iE 'warn|error' "$WORK/serve.log" | head -5 || true
