"""Prints a psql script that EXPLAINs (ANALYZE, BUFFERS) one `/events` listing the way the
console runs it: the SQL of crates/dedup-worker-core/src/store/event_list.rs (one statement per outcome; outcome `any`
is all of them, run concurrently by the console), as a prepared statement executed 6 times
first, as sqlx's per-connection statement cache does, so the plan shown is the one PostgreSQL's
plan cache settled on (custom or generic) for the 7th and later executions.

Usage: explain.py KIND TYPE_PREFIX SINCE_US UNTIL_US [AFTER_US AFTER_KEY_HEX]
KIND: handled | duplicate | dead_letter | stale | pending. Limit 51 (a page of 50, plus one).
"""
import sys

RING = 5
LIMIT = 51
kind, prefix, since_us, until_us = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
after = (int(sys.argv[5]), sys.argv[6]) if len(sys.argv) > 6 else None


class Q:
    def __init__(self):
        self.types, self.values = [], []

    def bind(self, typ, value):
        self.types.append(typ)
        self.values.append(value)
        return f"${len(self.types)}"

    def time(self, us):
        return f"('epoch'::timestamptz + {self.bind('int8', str(us))} * interval '1 microsecond')"

    @staticmethod
    def at_us(col):
        return f"(extract(epoch FROM {col}) * 1000000)::int8"

    def conditions(self, time, tie, type_col, is_key):
        conds = [f"{time} >= {self.time(since_us)}", f"{time} < {self.time(until_us)}"]
        if prefix:
            low = self.bind("text", "'" + prefix + "'")
            conds.append(f"{type_col} ~>=~ {low}")
            high = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            conds.append(f"{type_col} ~<~ {self.bind('text', chr(39) + high + chr(39))}")
        if after:  # the cursor is a handled row (same kind as a handled listing)
            at = self.time(after[0])
            tv = self.bind("uuid", f"'{after[1]}'") if is_key else self.bind("int8", after[1])
            conds.append(f"({time}, {tie}) < ({at}, {tv})")
        return conds


q = Q()
where = lambda c: ("WHERE " + " AND ".join(c)) if c else ""
if kind == "handled":
    branches = []
    for s in range(RING):
        c = q.conditions("processed_at", "key", "event_type", True)
        branches.append(f"SELECT * FROM (SELECT source, event_id, event_type, {q.at_us('processed_at')} AS at_us, key\n"
                        f"   FROM processed_events_{s} {where(c)} ORDER BY processed_at DESC, key DESC LIMIT {LIMIT}) b{s}")
    sql = f"SELECT * FROM ({' UNION ALL '.join(branches)}) u ORDER BY at_us DESC, key DESC LIMIT {LIMIT}"
elif kind == "duplicate":
    c = q.conditions("d.seen_at", "d.key", "p.event_type", True)
    cols = "key, source, event_id, event_type"
    lookups = " UNION ALL ".join(f"SELECT {cols} FROM processed_events_{s} WHERE key = d.key" for s in range(RING))
    sql = (f"SELECT p.source, p.event_id, p.event_type, {q.at_us('d.seen_at')} AS at_us, d.key\n"
           f"   FROM duplicate_deliveries d CROSS JOIN LATERAL ({lookups} LIMIT 1) p\n"
           f" {where(c)} ORDER BY d.seen_at DESC, d.key DESC LIMIT {LIMIT}")
elif kind in ("dead_letter", "stale"):
    table, time = ("dead_letters", "created_at") if kind == "dead_letter" else ("stale_events", "recorded_at")
    c = q.conditions(time, "id", "event_type", False)
    sql = (f"SELECT source, event_id, event_type, {q.at_us(time)} AS at_us, id FROM {table}\n"
           f"   {where(c)} ORDER BY {time} DESC, id DESC LIMIT {LIMIT}")
elif kind == "pending":
    src = q.bind("text", "'stripe'")
    c = q.conditions("enqueued_at", "id", "coalesce(message_type, '')", False)
    sql = (f"SELECT coalesce(source, {src}) AS source, coalesce(message_id, '') AS event_id,\n"
           f"   coalesce(message_type, '') AS event_type, {q.at_us('enqueued_at')} AS at_us, id\n"
           f"   FROM queue_messages {where(c)} ORDER BY enqueued_at DESC, id DESC LIMIT {LIMIT}")
else:
    raise SystemExit(f"unknown kind {kind}")

name = f"console_{kind}"
print(f"DEALLOCATE ALL;")
print(f"PREPARE {name} ({', '.join(q.types)}) AS\n{sql};")
args = ", ".join(q.values)
print("\\o /dev/null")
for _ in range(6):
    print(f"EXECUTE {name} ({args});")
print("\\o")
print(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE {name} ({args});")
