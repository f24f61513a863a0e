"""Prints a SQL CASE choosing a Stripe event type from an integer expression uniform in
[0, 100000): the skewed mix of 20 types that bench/console/fill.py uses (issue 28).
Usage: python3 types.py '<sql expression>'"""
import sys

TYPES = [  # (type, weight in 1/100,000)
    ("invoice.paid", 14000), ("customer.subscription.updated", 12000),
    ("invoice.payment_succeeded", 12000), ("charge.succeeded", 11000),
    ("payment_intent.succeeded", 11000), ("invoice.created", 8000),
    ("invoice.finalized", 7000), ("customer.updated", 5000),
    ("payment_intent.created", 5000), ("checkout.session.completed", 4000),
    ("invoice.payment_failed", 2500), ("customer.subscription.created", 2000),
    ("customer.subscription.deleted", 1500), ("charge.refunded", 1200),
    ("charge.failed", 1000), ("payment_method.attached", 1000),
    ("invoice.upcoming", 800), ("customer.created", 700),
    ("payment_intent.payment_failed", 220), ("charge.dispute.created", 80),
]
assert sum(w for _, w in TYPES) == 100_000
u, out, cum = sys.argv[1], ["CASE"], 0
for name, w in TYPES[:-1]:
    cum += w
    out.append(f" WHEN {u} < {cum} THEN '{name}'")
out.append(f" ELSE '{TYPES[-1][0]}' END")
print("".join(out))
