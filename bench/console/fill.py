"""Prints the SQL that fills the console benchmark's database (bench/console.sh runs it with psql).

Usage: fill.py IDS OUTBOX T0_EPOCH_SECONDS

The database must be migrated already (`dedup-worker migrate`): this only inserts rows into the
tables the migrations made, in schema dedup_worker, and records what it made in
public.bench_console_meta. Deterministic where the client needs it: id number g (1..IDS) is
event `evt_` + the first 24 hex digits of md5(g || ':bench'), processed at
T0 - 30 days + floor((g - 1) / 4) * (30 days * 4 / IDS): batches of four ids share one
processed_at (one transaction, one now()), the newest batch about a second before T0.

What goes where:
* dedup_generations: slot 0 sealed (T0-30d .. T0-23d), slot 1 sealed (T0-23d .. T0-13d),
  slot 2 sealed (T0-13d .. T0-3d), slot 3 current (since T0-3d). Each id goes into the slot whose
  span holds its processed_at: 7/30, 10/30, 10/30 and 3/30 of the ids.
* event types: 20 Stripe types, skewed (weights below), chosen per id by hashint8(g), so the
  same g always has the same type.
* received_at: 50 ms to 2 s before processed_at; delivery_attempt 1 (97.7 %), 2, 3.
* duplicate_deliveries: ids with g % 33 = 5 (3.03 %), one duplicate each, seen 1 s to 2 h after
  the id was processed, in the partition of the generation current at seen_at (none after T0).
* dead_letters: 1,000 events that were never processed (g = 50,000,001 ...), spread over the
  30 days, payload ~300 bytes.
* outbox: ids processed in the last 7 days (outbox.retention_hours = 168) with a hash of the id
  below a fraction chosen to make about OUTBOX rows; created_at = the id's processed_at exactly;
  idempotency_key = the event id; payload ~300 bytes; status 'dispatched' (dispatched_at 200 ms
  later, 1 attempt) except 1 in 2,000 'failed' (12 attempts, last_error).
Statements of at most 1,000,000 ids each.
"""
import sys

TYPES = [  # (type, weight in 1/100,000)
    ("invoice.paid", 14000),
    ("customer.subscription.updated", 12000),
    ("invoice.payment_succeeded", 12000),
    ("charge.succeeded", 11000),
    ("payment_intent.succeeded", 11000),
    ("invoice.created", 8000),
    ("invoice.finalized", 7000),
    ("customer.updated", 5000),
    ("payment_intent.created", 5000),
    ("checkout.session.completed", 4000),
    ("invoice.payment_failed", 2500),
    ("customer.subscription.created", 2000),
    ("customer.subscription.deleted", 1500),
    ("charge.refunded", 1200),
    ("charge.failed", 1000),
    ("payment_method.attached", 1000),
    ("invoice.upcoming", 800),
    ("customer.created", 700),
    ("payment_intent.payment_failed", 220),
    ("charge.dispute.created", 80),
]
assert sum(w for _, w in TYPES) == 100_000, sum(w for _, w in TYPES)

DAY_US = 86_400 * 1_000_000
CHUNK = 1_000_000
# slot, started (days before T0), sealed (days before T0, None: current)
GENERATIONS = [(0, 30, 23), (1, 23, 13), (2, 13, 3), (3, 3, None)]


def type_case(u: str) -> str:
    """A CASE choosing a type from u, uniform in [0, 100000)."""
    out, cum = ["CASE"], 0
    for name, w in TYPES[:-1]:
        cum += w
        out.append(f" WHEN {u} < {cum} THEN '{name}'")
    out.append(f" ELSE '{TYPES[-1][0]}' END")
    return "".join(out)


def key_sql(source: str, event_id: str) -> str:
    return (f"encode(substring(sha256(int4send(octet_length({source})) || convert_to({source}, 'UTF8')"
            f" || convert_to({event_id}, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid")


def payload_sql(event_id: str, event_type: str, at: str) -> str:
    # ~300 bytes of a Stripe-like event.
    return ("convert_to(json_build_object('id', " + event_id + ", 'object', 'event', "
            "'api_version', '2026-10-28.endive', 'created', extract(epoch FROM " + at + ")::int8, "
            "'type', " + event_type + ", 'livemode', true, 'pending_webhooks', 1, "
            "'data', json_build_object('object', json_build_object('id', 'in_' || substr(md5(" + event_id + "), 1, 24), "
            "'customer', 'cus_' || substr(md5(" + event_id + " || 'c'), 1, 14), 'amount', 4900, 'currency', 'eur', "
            "'status', 'paid')), 'request', json_build_object('id', 'req_' || substr(md5(" + event_id + " || 'r'), 1, 14), "
            "'idempotency_key', null))::text, 'UTF8')")


def main() -> None:
    ids, outbox, t0 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    step_us = 30 * DAY_US * 4 // ids  # per batch of four ids
    T0 = f"to_timestamp({t0})"
    at = lambda g: f"({T0} - interval '30 days' + ((({g}) - 1) / 4) * {step_us} * interval '1 microsecond')"
    p = print
    p("\\set ON_ERROR_STOP 1")
    p("SET search_path = dedup_worker, public;")
    p("SET maintenance_work_mem = '512MB';")
    p("DROP TABLE IF EXISTS public.bench_console_meta;")
    p("CREATE TABLE public.bench_console_meta (ids bigint, outbox_target bigint, t0 bigint, done boolean DEFAULT false, "
      "fill_seconds numeric, index_seconds numeric);")
    p(f"INSERT INTO public.bench_console_meta (ids, outbox_target, t0) VALUES ({ids}, {outbox}, {t0});")
    p("\\echo generations")
    p("BEGIN;")
    p("DELETE FROM dedup_generations;")
    for slot, start, sealed in GENERATIONS:
        sealed_sql = "NULL" if sealed is None else f"{T0} - interval '{sealed} days'"
        p(f"INSERT INTO dedup_generations (slot, started_at, sealed_at) VALUES ({slot}, {T0} - interval '{start} days', {sealed_sql});")
    p("COMMIT;")
    # the g range of each slot: batch b = (g-1)/4 is in the slot when its time >= start boundary
    for slot, start, sealed in GENERATIONS:
        end_days = sealed if sealed is not None else 0
        b_lo = -(-((30 - start) * DAY_US) // step_us)  # ceil
        b_hi = -(-((30 - end_days) * DAY_US) // step_us) if sealed is not None else ids // 4 + 1
        g_lo, g_hi = 4 * b_lo + 1, min(4 * b_hi, ids)  # inclusive
        lo = g_lo
        while lo <= g_hi:
            hi = min(lo + CHUNK - 1, g_hi)
            u = "(abs(hashint8(g)) % 100000)"
            attempt = "(CASE WHEN abs(hashint8(g + 7)) % 1000 < 977 THEN 1 WHEN abs(hashint8(g + 7)) % 1000 < 997 THEN 2 ELSE 3 END)"
            p(f"\\echo processed_events_{slot} {lo}..{hi}")
            p(f"INSERT INTO processed_events_{slot} (key, source, event_id, event_type, processed_at, received_at, delivery_attempt)\n"
              f"  SELECT {key_sql('source', 'event_id')}, source, event_id, event_type, processed_at,\n"
              f"         processed_at - (50 + abs(hashint8(g + 3)) % 1950) * interval '1 millisecond', attempt\n"
              f"    FROM (SELECT g, 'stripe'::text AS source, 'evt_' || substr(md5(g::text || ':bench'), 1, 24) AS event_id,\n"
              f"                 {type_case(u)} AS event_type, {at('g')} AS processed_at, {attempt} AS attempt\n"
              f"            FROM generate_series({lo}::int8, {hi}::int8) AS g) AS ids;")
            lo = hi + 1
    # duplicates: seen 1 s .. 2 h after processing, in the generation current then
    seen = f"({at('g')} + (1 + abs(hashint8(g + 11)) % 7200) * interval '1 second')"
    slot_of = ("(CASE " + " ".join(
        f"WHEN seen_at >= {T0} - interval '{start} days' THEN {slot}" for slot, start, _ in reversed(GENERATIONS)) + " END)")
    u = "(abs(hashint8(g)) % 100000)"  # the type of id g, as its processed row has it
    lo = 1
    while lo <= ids:
        hi = min(lo + 10 * CHUNK - 1, ids)
        p(f"\\echo duplicate_deliveries {lo}..{hi}")
        dup_key = key_sql("'stripe'", "event_id")
        p(f"INSERT INTO duplicate_deliveries (slot, key, seen_at, event_type)\n"
          f"  SELECT {slot_of}, {dup_key}, seen_at, event_type\n"
          f"    FROM (SELECT 'evt_' || substr(md5(g::text || ':bench'), 1, 24) AS event_id, {seen} AS seen_at,\n"
          f"                 {type_case(u)} AS event_type\n"
          f"            FROM generate_series({lo}::int8, {hi}::int8) AS g WHERE g % 33 = 5) AS d\n"
          f"   WHERE seen_at < {T0};")
        lo = hi + 1
    p("\\echo dead_letters")
    u = "(abs(hashint8(g)) % 100000)"
    p(f"INSERT INTO dead_letters (source, event_id, event_type, queue, payload, error, attempts, created_at)\n"
      f"  SELECT 'stripe', event_id, event_type, 'dedup.events', {payload_sql('event_id', 'event_type', 'created_at')},\n"
      f"         'handler failed: upstream returned 422 (invoice not found)', 8, created_at\n"
      f"    FROM (SELECT 'evt_' || substr(md5(g::text || ':bench'), 1, 24) AS event_id, {type_case(u)} AS event_type,\n"
      f"                 {T0} - interval '30 days' + (g - 50000000) * interval '2592 seconds' AS created_at\n"
      f"            FROM generate_series(50000001::int8, 50001000::int8) AS g) AS d;")
    # outbox: a share of the last 7 days' ids
    recent = 7 * ids // 30
    frac = min(1_000_000, outbox * 1_000_000 // max(recent, 1))
    for slot, start, sealed in GENERATIONS:
        if sealed is not None and sealed >= 7:
            continue
        p(f"\\echo outbox from processed_events_{slot}")
        p(f"INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload, status, attempts,\n"
          f"                    next_attempt_at, last_error, created_at, dispatched_at)\n"
          f"  SELECT source, event_id, NULL, event_id, event_type, {payload_sql('event_id', 'event_type', 'processed_at')},\n"
          f"         CASE WHEN failed THEN 'failed' ELSE 'dispatched' END, CASE WHEN failed THEN 12 ELSE 1 END,\n"
          f"         processed_at + CASE WHEN failed THEN interval '3 hours' ELSE interval '0' END,\n"
          f"         CASE WHEN failed THEN 'HTTP 503 Service Unavailable from the sink' END,\n"
          f"         processed_at, CASE WHEN failed THEN NULL ELSE processed_at + interval '200 milliseconds' END\n"
          f"    FROM (SELECT *, abs(hashtext(event_id || 'f')) % 2000 = 0 AS failed FROM processed_events_{slot}\n"
          f"           WHERE processed_at >= {T0} - interval '7 days' AND abs(hashtext(event_id)) % 1000000 < {frac}\n"
          f"           ORDER BY processed_at) AS p;")


if __name__ == "__main__":
    main()
