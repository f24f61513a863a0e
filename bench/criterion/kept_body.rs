//! The consumer's CPU work per kept body (issue 40): `NewEventBody::of`, its search keys and
//! its compression, over three bodies: the one `examples/loadgen` sends (what
//! `bench/history_ab.sh` measures end to end), the published 569-byte Stripe vector, and a
//! ~2.5 KB `invoice.paid` of the shape Stripe sends (a customer, lines, a status history).
//!
//! Beside each, what the consumer did before (issue 40's cost fix): `whole parse` (the body
//! parsed into a `serde_json::Value`, where search keys now build only what the pointers name)
//! and `fresh context` (`zstd::bulk::compress`, a zstd context made and freed per body, where
//! `codec::encode` now reuses its thread's), so one build compares the two.
//!
//! `cargo bench --bench kept_body`. For an instruction count that the machine's noise does not
//! move: `valgrind --tool=callgrind --toggle-collect='*NewEventBody*of*'` on the bench binary
//! with `--bench --profile-time 2`, then Ir / calls.

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use dedup_worker_core::event::search_keys::{SearchKeys, SearchPointers};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::bodies::{codec, NewEventBody};

/// The body `examples/loadgen` sends.
fn loadgen_body() -> Vec<u8> {
    let id = "evt_00000000deadbeef00000000cafef00d";
    format!(
        r#"{{"id":"{id}","object":"event","type":"invoice.paid","created":1765000000,"data":{{"object":{{"id":"in_{id}","amount_paid":1999,"currency":"usd"}}}}}}"#
    )
    .into_bytes()
}

/// An `invoice.paid` as Stripe sends it, trimmed to ~2.5 KB: the size most webhook bodies have.
fn invoice_body() -> Vec<u8> {
    let line = |n: u32| {
        serde_json::json!({
            "id": format!("il_1PqR{n:04}abcdEFGH"), "object": "line_item", "amount": 1999,
            "currency": "usd", "description": format!("1 × Pro plan (at $19.99 / month) #{n}"),
            "period": {"end": 1767600000, "start": 1765000000},
            "price": {"id": "price_1PqRstUvWxYz", "object": "price", "product": "prod_Q1w2e3r4",
                      "unit_amount": 1999, "recurring": {"interval": "month", "interval_count": 1}},
            "proration": false, "quantity": 1, "type": "subscription"
        })
    };
    serde_json::json!({
        "id": "evt_1PqRstUvWxYzAbCdEfGhIjKl", "object": "event", "api_version": "2024-06-20",
        "created": 1765000000, "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null}, "type": "invoice.paid",
        "data": {"object": {
            "id": "in_1PqRstUvWxYzAbCd", "object": "invoice", "account_country": "US",
            "account_name": "Example Inc.", "amount_due": 5997, "amount_paid": 5997,
            "amount_remaining": 0, "attempt_count": 1, "attempted": true, "billing_reason":
            "subscription_cycle", "charge": "ch_3PqRstUvWxYzAbCd0", "collection_method":
            "charge_automatically", "created": 1765000000, "currency": "usd",
            "customer": "cus_QwErTyUiOpAsDf", "customer_email": "jenny.rosen@example.com",
            "customer_name": "Jenny Rosen", "hosted_invoice_url": "https://invoice.stripe.com/i/acct_1Pq/test_YWNjdF8xUHE",
            "lines": {"object": "list", "data": [line(1), line(2), line(3)], "has_more": false,
                      "total_count": 3, "url": "/v1/invoices/in_1PqRstUvWxYzAbCd/lines"},
            "metadata": {"order": "6735"}, "number": "A1B2C3D4-0042", "paid": true,
            "payment_intent": "pi_3PqRstUvWxYzAbCd0", "status": "paid",
            "status_transitions": {"finalized_at": 1765000100, "paid_at": 1765000200},
            "subscription": "sub_1PqRstUvWxYzAbCd", "subtotal": 5997, "total": 5997
        }}
    })
    .to_string()
    .into_bytes()
}

/// The search keys as the consumer took them before: the whole body parsed into a `Value`.
fn whole_parse(payload: &[u8], pointers: &SearchPointers) -> (Option<String>, Option<String>) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return (None, None);
    };
    let text = |pointer: &str| body.pointer(pointer)?.as_str().map(str::to_owned);
    (text(&pointers.object), text(&pointers.customer))
}

fn event(payload: Vec<u8>) -> Event {
    Event {
        source: "stripe".into(),
        id: "evt_1PqRstUvWxYzAbCdEfGhIjKl".into(),
        event_type: "invoice.paid".into(),
        payload: Bytes::from(payload),
        delivery_attempt: 1,
        alias: None,
        headers: Default::default(),
    }
}

fn kept_body(c: &mut Criterion) {
    let pointers = SearchPointers {
        object: "/data/object/id".into(),
        customer: "/data/object/customer".into(),
    };
    let vector = include_bytes!("../../tests/vectors/stripe_invoiceitem_created.json").to_vec();
    let bodies = [
        ("loadgen", loadgen_body()),
        ("569B vector", vector),
        ("invoice", invoice_body()),
    ];
    let mut group = c.benchmark_group("kept_body");
    for (name, body) in bodies {
        let size = body.len();
        let event = event(body);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("{name} ({size} B)/of"), |b| {
            b.iter(|| NewEventBody::of(black_box(&event), Some(1), &pointers))
        });
        group.bench_function(format!("{name} ({size} B)/search keys"), |b| {
            b.iter(|| SearchKeys::extract(black_box(&event.payload), &pointers))
        });
        group.bench_function(format!("{name} ({size} B)/search keys, whole parse"), |b| {
            b.iter(|| whole_parse(black_box(&event.payload), &pointers))
        });
        group.bench_function(format!("{name} ({size} B)/encode"), |b| {
            b.iter(|| codec::encode(black_box(&event.payload)))
        });
        group.bench_function(format!("{name} ({size} B)/encode, fresh context"), |b| {
            b.iter(|| zstd::bulk::compress(black_box(&event.payload), 3))
        });
        for level in [1, -1] {
            let mut compressor = zstd::bulk::Compressor::new(level).expect("zstd");
            let stored = compressor.compress(&event.payload).expect("zstd").len();
            let at3 = codec::encode(&event.payload).1.len();
            println!("{name}: {size} B; zstd level 3: {at3} B, level {level}: {stored} B");
            group.bench_function(format!("{name} ({size} B)/encode, level {level}"), |b| {
                b.iter(|| compressor.compress(black_box(&event.payload)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, kept_body);
criterion_main!(benches);
