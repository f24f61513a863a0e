#!/usr/bin/env python3
"""examples/bench_history_reads.rs's measurement without a release build: the same shapes and
parameters, run by one psql session (one connection) as prepared statements (PREPARE, then
WARMUP untimed and N timed EXECUTEs per shape: after five executions PostgreSQL may switch to a
generic plan, as it does for sqlx's statements), timed by psql's \\timing (the server's work and
the loopback round trip, not a driver's decoding); p50 / p95 / max per shape, then, with
--explain, EXPLAIN (ANALYZE, BUFFERS) EXECUTE of each (the plan the prepared statement runs).

Usage: measure_psql.py DB_URL N WARMUP [--explain]      Needs: python3, psql.
"""
import re
import subprocess
import sys

URL, N, WARMUP = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
EXPLAIN = "--explain" in sys.argv

# The statements, in one place (the store's search may swap them): newest first, a page of 50
# and one more, the second page by keyset below the first page's last (kept_at, key).
COLUMNS = "kept_at, key, source, event_id, event_type, object_id, customer"
CUSTOMER_FIRST = f"SELECT {COLUMNS} FROM event_bodies WHERE customer = $1 ORDER BY kept_at DESC, key DESC LIMIT 51"
CUSTOMER_NEXT = (f"SELECT {COLUMNS} FROM event_bodies WHERE customer = $1 AND (kept_at, key) < ($2, $3) "
                 "ORDER BY kept_at DESC, key DESC LIMIT 51")
OBJECT_FIRST = f"SELECT {COLUMNS} FROM event_bodies WHERE object_id = $1 ORDER BY kept_at DESC, key DESC LIMIT 51"
EVENT_ID = f"SELECT {COLUMNS} FROM event_bodies WHERE event_id = $1 ORDER BY kept_at DESC, key DESC LIMIT 51"
EVENT_PAGE = ("SELECT kept_at, event_type, object_id, customer, headers, encoding, body FROM event_bodies "
              "WHERE event_id = $1 AND source = 'stripe' AND kept_at = $2")


def psql(script):
    return subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", URL], input=script.encode(),
                          check=True, capture_output=True).stdout.decode()


def rows(sql):
    return [line.split("|") for line in psql("SET search_path = dedup_worker, public;\n" + sql + ";\n").splitlines() if line]


def lit(value):
    return "'" + value.replace("'", "''") + "'"


# Parameters, untimed: the newest filled day's heaviest customers and light ones (5-10 events
# that day, ~70 in all), a sample of object and event ids from every filled day.
day = rows("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = "
           "'event_bodies'::regclass AND c.reltuples > 0 ORDER BY c.relname DESC LIMIT 1")[0][0]
per_customer = rows(f"SELECT customer, count(*) FROM {day} WHERE customer IS NOT NULL GROUP BY customer ORDER BY 2 DESC")
heavy = [c for c, _ in per_customer[:3]]
light = [c for c, n in per_customer if 5 <= int(n) <= 10][:200] or [c for c, _ in per_customer[-200:]]
sample = rows("SELECT object_id, event_id, kept_at FROM event_bodies TABLESAMPLE SYSTEM (0.05) "
              "WHERE object_id IS NOT NULL AND kept_at < date_trunc('day', now()) LIMIT 200")
totals = rows("SELECT count(*) FROM event_bodies WHERE customer IN (%s) GROUP BY customer ORDER BY 1 DESC"
              % ",".join(map(lit, heavy)))
light_totals = sorted(int(r[0]) for r in rows("SELECT count(*) FROM event_bodies WHERE customer IN (%s) GROUP BY customer"
                                                % ",".join(map(lit, light[:50] or ["-"]))))
print(f"heavy customers: {[int(t[0]) for t in totals]} events; light: {len(light)} "
      f"(of 50, median {light_totals[len(light_totals) // 2] if light_totals else '-'} events)")


def cursors(customers):
    out = []
    for c in customers:
        page = rows(CUSTOMER_FIRST.replace("$1", lit(c)))
        if len(page) > 50:
            out.append((c, page[49][0], page[49][1]))
    return out


SHAPES = [
    ("customer heavy, first page", CUSTOMER_FIRST, "text", [(c,) for c in heavy]),
    ("customer heavy, second page", CUSTOMER_NEXT, "text, timestamptz, uuid", cursors(heavy)),
    ("customer light, first page", CUSTOMER_FIRST, "text", [(c,) for c in light]),
    ("customer light, second page", CUSTOMER_NEXT, "text, timestamptz, uuid", cursors(light)),
    ("object id", OBJECT_FIRST, "text", [(s[0],) for s in sample]),
    ("event id (any day)", EVENT_ID, "text", [(s[1],) for s in sample]),
    ("event page (id + kept_at, body)", EVENT_PAGE, "text, timestamptz", [(s[1], s[2]) for s in sample]),
]
script = ["SET search_path = dedup_worker, public;", "\\o /dev/null"]
for i, (name, sql, types, binds) in enumerate(SHAPES):
    if not binds:
        continue
    script.append(f"PREPARE s{i} ({types}) AS {sql};")
    script.append(f"\\echo 'shape {i}'")
    for k in range(WARMUP + N):
        if k == WARMUP:
            script.append("\\timing on")
        script.append(f"EXECUTE s{i} (%s);" % ", ".join(map(lit, binds[k % len(binds)])))
    script.append("\\timing off")
if EXPLAIN:
    script.append("\\o")
    for i, (name, sql, types, binds) in enumerate(SHAPES):
        if binds:
            script.append(f"\\echo '-- EXPLAIN (ANALYZE, BUFFERS) EXECUTE: {name}'")
            script.append(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE s{i} (%s);" % ", ".join(map(lit, binds[0])))
out = psql("\n".join(script) + "\n")
times, shape, explain = {}, None, []
for line in out.splitlines():
    if line.startswith("shape "):
        shape = int(line.split()[1])
    elif (m := re.match(r"Time: ([0-9.]+) ms", line)) and shape is not None:
        times.setdefault(shape, []).append(float(m.group(1)))
    else:
        explain.append(line)
print(f"{'shape':<34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
for i, ts in sorted(times.items()):
    ts.sort()
    print(f"{SHAPES[i][0]:<34} {ts[len(ts) // 2]:>8.2f} {ts[-(-len(ts) * 95 // 100) - 1]:>8.2f} {ts[-1]:>8.2f}  (n={len(ts)})")
for line in explain:
    print("   " + line if not line.startswith("--") else line)
