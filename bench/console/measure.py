"""The console benchmark's client (bench/console.sh runs it): sequential GETs on one keep-alive
connection to the admin listener, per query shape a warm-up then N timed requests, each with a
random existing id or a random one-day window; prints p50 / p95 / max per shape.

Usage: measure.py PORT TOKEN IDS T0 [N] [WARMUP] [SEED]

Ids are those bench/console/fill.py made: g in 1..IDS is `evt_` + md5(g || ':bench')[:24].
Windows: a one-day [since, until) starting at a random second of the 29 days before T0 - 1 day.
Every response is checked (200, and: the searched id listed as handled; the event page's
outcome `handled`; a listing's rows); a failed check is counted in the table's last column.
Latency: from sending the request to having read the whole body (time.perf_counter).
"""
import hashlib
import html
import http.client
import json
import math
import random
import re
import sys
import time
import urllib.parse
from datetime import datetime, timezone

PORT, TOKEN, IDS, T0 = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
N = int(sys.argv[5]) if len(sys.argv) > 5 else 200
WARMUP = int(sys.argv[6]) if len(sys.argv) > 6 else 20
rng = random.Random(int(sys.argv[7]) if len(sys.argv) > 7 else 28)
DAY = 86_400

COMMON, RARE, PREFIX = "invoice.paid", "charge.dispute.created", "invoice."

conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Connection": "keep-alive"}


def get(path: str):
    start = time.perf_counter()
    conn.request("GET", path, headers=HEADERS)
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")
    return time.perf_counter() - start, resp.status, body


def event_id(g: int) -> str:
    return "evt_" + hashlib.md5(f"{g}:bench".encode()).hexdigest()[:24]


def random_id() -> str:
    return event_id(rng.randint(1, IDS))


def window() -> tuple[str, str]:
    since = T0 - 30 * DAY + rng.randrange(29 * DAY)
    fmt = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return fmt(since), fmt(since + DAY)


ROW = re.compile(r'<td class="outcome ([a-z_]+)"')
NEXT = re.compile(r'<a id="next" href="([^"]+)"')
OUTCOME = re.compile(r'<strong[^>]*id="outcome"[^>]*>([a-z_]+)<')


def listing(type_prefix: str, outcome: str = ""):
    def make():
        since, until = window()
        q = {"type": type_prefix, "since": since, "until": until}
        if outcome:
            q["outcome"] = outcome
        return "/events?" + urllib.parse.urlencode(q), None
    return make


class NoSecondPage(Exception):
    pass


def second_page(type_prefix: str, outcome: str = ""):
    first = listing(type_prefix, outcome)

    def make():
        for _ in range(20):  # a window whose first page has a next one
            path, _ = first()
            _, status, body = get(path)
            m = NEXT.search(body)
            if status == 200 and m:
                return html.unescape(m.group(1)), None
        raise NoSecondPage(f"no second page for {type_prefix!r} in 20 windows")
    return make


def by_id():
    i = random_id()
    return "/events?" + urllib.parse.urlencode({"id": i}), i


def page():
    i = random_id()
    return "/events/stripe/" + i, i


def check_listing(body: str, expect, rows_seen: list) -> bool:
    rows = ROW.findall(body)
    rows_seen.append(len(rows))
    if expect is not None:  # an id search: the id listed, as handled
        return f">{expect}</a>" in body and "handled" in rows
    return True


def check_page(body: str, expect, rows_seen: list) -> bool:
    m = OUTCOME.search(body)
    rows_seen.append(body.count("<li class=\"outbox\""))
    return bool(m) and m.group(1) == "handled" and expect in body


SHAPES = [
    ("/events?id=<random id>", by_id, check_listing),
    (f"/events?type={COMMON} (1 day, outcome any)", listing(COMMON), check_listing),
    (f"/events?type={RARE} (1 day, any)", listing(RARE), check_listing),
    (f"/events?type={PREFIX} (1 day, any)", listing(PREFIX), check_listing),
    (f"/events?type={COMMON} (1 day, handled)", listing(COMMON, "handled"), check_listing),
    (f"/events?type={RARE} (1 day, handled)", listing(RARE, "handled"), check_listing),
    (f"/events?type={PREFIX} (1 day, handled)", listing(PREFIX, "handled"), check_listing),
    (f"  second page, type={COMMON} (any)", lambda: second_page(COMMON)(), check_listing),
    (f"  second page, type={RARE} (any)", lambda: second_page(RARE)(), check_listing),
    (f"  second page, type={PREFIX} (any)", lambda: second_page(PREFIX)(), check_listing),
    ("/events/stripe/<random id> (event page)", page, check_page),
]


def pct(sorted_ms, q):  # nearest rank: the smallest value with at least q of them at or below it
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


results = []
print(f"{'shape':<52} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'rows/pg':>7} {'bad':>4}", flush=True)
for name, make, check in SHAPES:
    times, bad, rows = [], 0, []
    try:
        for _ in range(WARMUP):
            path, expect = make()
            get(path)
        for _ in range(N):
            path, expect = make()
            t, status, body = get(path)
            times.append(t * 1000)
            if status != 200 or not check(body, expect, rows):
                bad += 1
                if bad <= 3:
                    print(f"  check failed: {status} {path} {body[:300]!r}", file=sys.stderr)
    except NoSecondPage as e:
        print(f"{name:<52} {e}", flush=True)
        continue
    s = sorted(times)
    row = {"shape": name.strip(), "n": N, "p50": pct(s, 0.50), "p95": pct(s, 0.95), "max": s[-1],
           "rows": sum(rows) / max(len(rows), 1), "bad": bad}
    results.append(row)
    print(f"{name:<52} {N:>4} {row['p50']:>8.1f} {row['p95']:>8.1f} {row['max']:>8.1f} {row['rows']:>7.1f} {bad:>4}", flush=True)
print("JSON " + json.dumps(results))
