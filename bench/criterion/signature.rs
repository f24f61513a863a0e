//! Hot functions of the ingress path: verifying a `Stripe-Signature` header (one and three
//! secrets) over the published 569-byte vector and over a 64 KiB payload.
//!
//! `cargo bench --bench signature`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use dedup_worker_core::signature::stripe::{signature_header, verify_stripe_signature};

fn verify(c: &mut Criterion) {
    let vector = include_bytes!("../../tests/vectors/stripe_invoiceitem_created.json");
    let large = vec![b'x'; 64 * 1024];
    let mut group = c.benchmark_group("verify_stripe_signature");
    for (name, payload) in [("569B", &vector[..]), ("64KiB", &large[..])] {
        let header = signature_header("whsec_current", 1_700_000_000, payload);
        group.throughput(Throughput::Bytes(payload.len() as u64));
        group.bench_function(format!("{name}/1 secret"), |b| {
            b.iter(|| {
                verify_stripe_signature(
                    Some(black_box(&header)),
                    black_box(payload),
                    &["whsec_current"],
                    300,
                    1_700_000_000,
                )
            })
        });
        // Rotation: the matching secret is tried last.
        group.bench_function(format!("{name}/3 secrets"), |b| {
            b.iter(|| {
                verify_stripe_signature(
                    Some(black_box(&header)),
                    black_box(payload),
                    &["whsec_old1", "whsec_old2", "whsec_current"],
                    300,
                    1_700_000_000,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
