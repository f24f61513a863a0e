#!/usr/bin/env python3
"""examples/bench_fill_bodies.rs's fill without a release build: the same days, templates, ids,
Zipf-drawn customers and steps (standalone day table, COPY, the parent's three indexes, a CHECK
of the bounds, ATTACH, VACUUM ANALYZE, a row in public.bench_history_meta), the bodies
compressed by the system's libzstd at level 3 through ctypes: the C function the product's codec
(zstd::bulk::compress, level 3) calls, so the stored bytes are the same kind and size. The search
columns are what event/search_keys.rs takes from these templates: /data/object/id, and
/data/object/customer or, for a customer object, its id.

Usage: fill_libzstd.py DB_URL DAYS PER_DAY WORKER WORKERS [POOL]  (WORKER in 0..WORKERS: its share
of days; POOL: see below)
Needs: python3, psql, libzstd.so.1.
"""
import bisect
import ctypes
import functools
import hashlib
import datetime
import subprocess
import sys
import time

URL, DAYS, PER_DAY, WORKER, WORKERS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
CUSTOMERS, ZIPF_EXPONENT = 100_000, 0.45
ZSTD = ctypes.CDLL("libzstd.so.1")
ZSTD.ZSTD_compress.restype = ctypes.c_size_t
ZSTD.ZSTD_compress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
ZSTD.ZSTD_isError.argtypes = [ctypes.c_size_t]
OUT = ctypes.create_string_buffer(1 << 20)
M64 = (1 << 64) - 1
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def psql(sql, stdin=None):
    return subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", "SET search_path = dedup_worker, public",
                           "-c", sql, URL], input=stdin, check=True, capture_output=True).stdout.decode()


def mix(x):  # splitmix64, as the Rust fill
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=300_000)
def stripe_id(prefix, seed):
    a, b, out = mix(seed), mix(seed ^ 0x55555555), []
    for n in range(24):
        if n < 12:
            out.append(ALPHABET[a % 62]); a //= 62
        else:
            out.append(ALPHABET[b % 62]); b //= 62
    return prefix + "_" + "".join(out)


total, cumulative = 0.0, []
for rank in range(1, CUSTOMERS + 1):
    total += rank ** -ZIPF_EXPONENT
    cumulative.append(total)
cumulative = [c / total for c in cumulative]


def compress(raw):
    n = ZSTD.ZSTD_compress(OUT, len(OUT), raw, len(raw), 3)
    if ZSTD.ZSTD_isError(n) or n >= len(raw):
        return 0, raw
    return 1, ctypes.string_at(OUT, n)


def event(n, with_body=True):
    obj, later = n // 2, n % 2 == 1
    seed = mix(obj)
    customer = stripe_id("cus", (bisect.bisect_left(cumulative, (seed >> 11) / float(1 << 53)) + 1) << 32)
    eid = stripe_id("evt", n | 1 << 63)
    if not with_body:
        kind = seed % 10
        prefix, kinds = ("in", ("invoice.created", "invoice.paid")) if kind <= 4 else (
            ("ch", ("charge.pending", "charge.succeeded")) if kind <= 8 else (None, ("customer.created", "customer.updated")))
        return eid, kinds[int(later)], stripe_id(prefix, obj) if prefix else customer, customer, None
    created = 1_790_000_000 + n // 12
    amount = 500 + mix(seed) % 250_000
    kind = seed % 10
    if kind <= 4:
        oid = stripe_id("in", obj)
        etype = "invoice.paid" if later else "invoice.created"
        data = ('{"id":"%s","object":"invoice","account_country":"DE","account_name":"Example GmbH","amount_due":%d,"amount_paid":%d,'
                '"amount_remaining":%d,"attempt_count":%d,"attempted":%s,"auto_advance":false,"billing_reason":"subscription_cycle",'
                '"collection_method":"charge_automatically","created":%d,"currency":"eur","customer":"%s","customer_email":"billing+%d@example.com",'
                '"customer_name":"Customer %d","default_payment_method":null,"description":null,"hosted_invoice_url":"https://invoice.stripe.com/i/acct_1Example/test_%s",'
                '"invoice_pdf":"https://pay.stripe.com/invoice/acct_1Example/test_%s/pdf","lines":{"object":"list","data":[{"id":"%s","object":"line_item",'
                '"amount":%d,"currency":"eur","description":"1 × Plan (at €%d.00 / month)","period":{"end":%d,"start":%d},"price":{"id":"%s",'
                '"object":"price","product":"%s","unit_amount":%d,"recurring":{"interval":"month","interval_count":1}},"quantity":1,'
                '"subscription":"%s","type":"subscription"}],"has_more":false,"total_count":1,"url":"/v1/invoices/%s/lines"},"number":"EX-%06d",'
                '"paid":%s,"period_end":%d,"period_start":%d,"status":"%s","subscription":"%s","subtotal":%d,"tax":null,"total":%d}') % (
            oid, amount, amount if later else 0, 0 if later else amount, int(later), str(later).lower(), created, customer, amount, amount,
            oid, oid, stripe_id("il", created), amount, amount // 100, created + 2_592_000, created, stripe_id("price", amount),
            stripe_id("prod", amount // 100), amount, stripe_id("sub", created // 7), oid, created % 1_000_000, str(later).lower(),
            created, created - 2_592_000, "paid" if later else "open", stripe_id("sub", created // 7), amount, amount)
    elif kind <= 8:
        oid = stripe_id("ch", obj)
        etype = "charge.succeeded" if later else "charge.pending"
        data = ('{"id":"%s","object":"charge","amount":%d,"amount_captured":%d,"amount_refunded":0,"balance_transaction":"txn_%x",'
                '"billing_details":{"address":{"city":"Berlin","country":"DE","line1":"Street %d","postal_code":"10%03d"},"email":"pay+%d@example.com",'
                '"name":"Customer %d"},"captured":%s,"created":%d,"currency":"eur","customer":"%s","description":"Subscription update","livemode":true,'
                '"outcome":{"network_status":"approved_by_network","risk_level":"normal","risk_score":%d,"seller_message":"Payment complete.",'
                '"type":"authorized"},"paid":%s,"payment_intent":"%s","payment_method":"%s","payment_method_details":{"card":{"brand":"visa",'
                '"country":"DE","exp_month":%d,"exp_year":2029,"fingerprint":"%x","funding":"credit","last4":"%04d","network":"visa"},"type":"card"},'
                '"receipt_url":"https://pay.stripe.com/receipts/%s","refunded":false,"status":"%s"}') % (
            oid, amount, amount if later else 0, created, amount, amount % 1000, amount, amount, str(later).lower(), created, customer,
            amount % 90, str(later).lower(), stripe_id("pi", created), stripe_id("pm", amount), amount % 12 + 1, mix(amount),
            amount % 10_000, oid, "succeeded" if later else "pending")
    else:
        oid = customer
        etype = "customer.updated" if later else "customer.created"
        k = seed % 10_000_000
        data = ('{"id":"%s","object":"customer","address":{"city":"Hamburg","country":"DE","line1":"Weg %d","postal_code":"20%03d"},"balance":0,'
                '"created":%d,"currency":"eur","default_source":null,"delinquent":false,"description":"Customer %d","email":"someone+%d@example.com",'
                '"invoice_prefix":"%X","invoice_settings":{"default_payment_method":"pm_%x"},"livemode":true,"metadata":{"account":"%d"},'
                '"name":"Some One %d","phone":"+4940%07d","preferred_locales":["de"],"tax_exempt":"none"}') % (
            customer, k, seed % 1000, created, k, k, seed % 0xFFFFFFFF, seed, k, k, k)
    body = ('{"id":"%s","object":"event","api_version":"2024-06-20","created":%d,"data":{"object":%s},"livemode":true,"pending_webhooks":1,'
            '"request":{"id":"req_%x","idempotency_key":"%x-%x"},"type":"%s"}') % (eid, created, data, mix(n), mix(n + 1), mix(n + 2), etype)
    return eid, etype, oid, customer, body.encode()


def dedup_key(event_id):  # store/dedup: sha256(len(source) BE u32, source, id)[:16] as a UUID
    digest = hashlib.sha256(b"\x00\x00\x00\x06stripe" + event_id.encode()).hexdigest()
    return "%s-%s-%s-%s-%s" % (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])


def fill_day(n, day):
    part = "event_bodies_p" + day.strftime("%Y%m%d")
    lo, hi = f"{day} 00:00:00+00", f"{day + datetime.timedelta(days=1)} 00:00:00+00"
    psql(f"DROP TABLE IF EXISTS {part}; CREATE TABLE {part} (LIKE event_bodies INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)")
    started = time.time()
    copy = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", "SET search_path = dedup_worker, public",
                             "-c", f"COPY {part} FROM STDIN", URL], stdin=subprocess.PIPE)
    midnight = datetime.datetime.combine(day, datetime.time(), datetime.timezone.utc)
    raw_bytes = stored_bytes = 0
    lines = []
    for i in range(PER_DAY):
        if POOL:
            # The ids and search columns are this row's; the body one of POOL made the same way.
            eid, etype, oid, customer, _ = event(n * PER_DAY + i, with_body=False)
            raw, encoding, stored, hexed = pool[i % POOL]
        else:
            eid, etype, oid, customer, raw = event(n * PER_DAY + i)
            encoding, stored = compress(raw)
            hexed = stored.hex()
        raw_bytes += len(raw); stored_bytes += len(stored)
        kept = midnight + datetime.timedelta(microseconds=i * 86_400_000_000 // PER_DAY)
        received = kept - datetime.timedelta(milliseconds=150)
        lines.append(f"{kept:%Y-%m-%d %H:%M:%S.%f}+00\t{dedup_key(eid)}\tstripe\t{eid}\t{etype}\t{oid}\t{customer}\t\\N\t"
                     f"{received:%Y-%m-%d %H:%M:%S.%f}+00\t{encoding}\t\\\\x{hexed}\n")
        if len(lines) == 2000:
            copy.stdin.write("".join(lines).encode()); lines = []
    copy.stdin.write("".join(lines).encode())
    copy.stdin.close()
    if copy.wait() != 0:
        raise SystemExit(f"COPY into {part} failed")
    copy_s = time.time() - started
    started = time.time()
    psql("SET maintenance_work_mem = '256MB'; "
         f"CREATE INDEX ON {part} (event_id text_pattern_ops, kept_at); "
         f"CREATE INDEX ON {part} (customer, kept_at) WHERE customer IS NOT NULL; "
         f"CREATE INDEX ON {part} (object_id text_pattern_ops, kept_at) WHERE object_id IS NOT NULL")
    index_s = time.time() - started
    psql(f"ALTER TABLE {part} ADD CONSTRAINT {part}_bounds CHECK (kept_at >= '{lo}' AND kept_at < '{hi}'); "
         f"ALTER TABLE event_bodies ATTACH PARTITION {part} FOR VALUES FROM ('{lo}') TO ('{hi}'); "
         f"ALTER TABLE {part} DROP CONSTRAINT {part}_bounds")
    psql(f"VACUUM ANALYZE {part}")
    psql(f"INSERT INTO public.bench_history_meta VALUES ('{day}', {PER_DAY}, {CUSTOMERS}, {copy_s + index_s}) "
         f"ON CONFLICT (day) DO UPDATE SET bodies = EXCLUDED.bodies, customers = EXCLUDED.customers, seconds = EXCLUDED.seconds")
    print(f"{day}: COPY {copy_s:.0f} s ({raw_bytes // PER_DAY} B raw -> {stored_bytes // PER_DAY} B stored per body), "
          f"indexes {index_s:.0f} s", flush=True)


# POOL > 0: bodies drawn from POOL made once (so the fill's CPU goes to rows, not to zstd),
# every row's ids and search columns its own; 0: every body made for its row.
POOL = int(sys.argv[6]) if len(sys.argv) > 6 else 0
pool = []
for k in range(POOL):
    raw = event(7_919 * k)[4]
    encoding, stored = compress(raw)
    pool.append((raw, encoding, stored, stored.hex()))
psql("CREATE TABLE IF NOT EXISTS public.bench_history_meta (day DATE PRIMARY KEY, bodies BIGINT NOT NULL, "
     "customers INT NOT NULL, seconds DOUBLE PRECISION NOT NULL)")
today = datetime.datetime.now(datetime.timezone.utc).date()
first = today - datetime.timedelta(days=DAYS)
# A day is done when its row says so and its partition is still there (a drop removes it).
done = set(psql(f"SELECT day FROM public.bench_history_meta WHERE bodies = {PER_DAY} AND "
                "to_regclass('dedup_worker.event_bodies_p' || to_char(day, 'YYYYMMDD')) IS NOT NULL").split())
# Newest days first: a fill stopped early still leaves the days a search reads first.
for n in reversed(range(DAYS)):
    day = first + datetime.timedelta(days=n)
    if n % WORKERS == WORKER and str(day) not in done:
        fill_day(n, day)
