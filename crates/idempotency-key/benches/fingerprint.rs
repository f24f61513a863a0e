//! Request fingerprints of JSON bodies (`Fingerprint::compute` under
//! `Content-Type: application/json`): a ~1 KB payment, a 1 MiB wide array of small objects, a
//! ~1 MB body nested 128 deep (the deepest that is canonicalised), and 500,000 nested arrays
//! (hostile; hashed as raw bytes once the depth limit is crossed).
//!
//! `cargo bench -p idempotency-key --bench fingerprint`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue, Method};
use idempotency_key::Fingerprint;

const PAYMENT: &str = r#"{
  "amount": 2000,
  "currency": "usd",
  "customer": "cus_NffrFeUfNV2Hib",
  "description": "Order #1047: 2 x Organic cotton t-shirt (M), 1 x Canvas tote",
  "automatic_payment_methods": {"enabled": true, "allow_redirects": "never"},
  "capture_method": "automatic",
  "confirm": true,
  "payment_method": "pm_1MqLiJLkdIwHu7ixUEgbFdYF",
  "receipt_email": "jenny.rosen@example.com",
  "statement_descriptor_suffix": "ORDER 1047",
  "metadata": {"order_id": "1047", "cart_id": "c_5f1e2d", "channel": "web", "coupon": "SPRING10"},
  "shipping": {
    "name": "Jenny Rosen",
    "phone": "+1 555 0100",
    "address": {
      "line1": "510 Townsend St",
      "line2": null,
      "city": "San Francisco",
      "state": "CA",
      "postal_code": "94103",
      "country": "US"
    }
  },
  "line_items": [
    {"sku": "tshirt-organic-m", "quantity": 2, "unit_amount": 750, "tax_rate": 0.0825},
    {"sku": "tote-canvas", "quantity": 1, "unit_amount": 500, "tax_rate": 0.0825}
  ],
  "payment_method_options": {"card": {"request_three_d_secure": "automatic", "capture_method": "manual"}}
}"#;

fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h
}

/// `[{"id":…,"amount":…,"currency":"usd","captured":true,"note":"n…"}, …]` up to 1 MiB.
fn wide_array() -> Vec<u8> {
    let mut body = String::from("[");
    let mut i = 0u64;
    while body.len() < (1 << 20) - 100 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"note":"n{i}","id":{i},"currency":"usd","captured":{},"amount":{}}}"#,
            i % 2 == 0,
            1000 + i * 7
        ));
        i += 1;
    }
    body.push(']');
    body.into_bytes()
}

/// 127 nested objects, each with an ~8 KB array of numbers (the innermost array at depth 128).
fn deep_but_allowed() -> Vec<u8> {
    let pad: Vec<String> = (0..1640).map(|n| (n * 37 % 10_000).to_string()).collect();
    let pad = pad.join(",");
    let levels = 127;
    let mut body = String::new();
    for level in 0..levels {
        body.push_str(&format!(r#"{{"pad":[{pad}],"level":{level},"child":"#));
    }
    body.push_str("null");
    body.push_str(&"}".repeat(levels));
    body.into_bytes()
}

fn nested_arrays(depth: usize) -> Vec<u8> {
    let mut body = vec![b'['; depth];
    body.resize(2 * depth, b']');
    body
}

fn max_depth(body: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in body {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth -= 1,
            _ => {}
        }
    }
    max
}

fn fingerprint(c: &mut Criterion) {
    let json = json_headers();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("payment ~1KB", PAYMENT.as_bytes().to_vec(), true),
        ("wide array 1MiB", wide_array(), true),
        ("nested 128 deep ~1MB", deep_but_allowed(), true),
        ("500k nested arrays (raw)", nested_arrays(500_000), false),
    ];
    let mut group = c.benchmark_group("fingerprint");
    for (name, body, canonicalised) in &cases {
        // Say which path each case measures: a canonicalised body hashes differently from its
        // raw bytes.
        let as_json = Fingerprint::compute(&Method::POST, "/p", None, &json, body);
        let as_raw = Fingerprint::compute(&Method::POST, "/p", None, &HeaderMap::new(), body);
        assert_eq!(as_json != as_raw, *canonicalised, "{name}");
        eprintln!(
            "{name}: {} bytes, depth {}, canonicalised: {canonicalised}",
            body.len(),
            max_depth(body)
        );
        if body.len() > 100_000 {
            group.sample_size(20);
        }
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(*name, |b| {
            b.iter(|| {
                Fingerprint::compute(&Method::POST, "/p", None, &json, black_box(body.as_slice()))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fingerprint);
criterion_main!(benches);
