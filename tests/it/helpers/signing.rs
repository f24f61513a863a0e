//! Stripe events for the tests, signed with our code (the test kit's) or with the official
//! `stripe` library;
//! Standard Webhooks deliveries checked with the official `standardwebhooks` library, and
//! `v1a` (ed25519) signatures made and checked by Python's `cryptography` package, independent
//! of ed25519-dalek.

use std::process::{Command, Stdio};

/// The current Unix time, as signatures carry it.
pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

pub use dedup_worker::testing::{post_signed, post_signed_until_not_503, stripe_event};

/// Signs with the official stripe-python library, one process for many payloads.
/// Returns one header per payload, in order.
pub fn stripe_python_sign(secret: &str, items: &[(Vec<u8>, i64)]) -> Vec<String> {
    let script = r#"
import json, sys, stripe
req = json.load(sys.stdin)
out = []
for item in req["items"]:
    payload = bytes(item["payload"]).decode("utf-8")
    out.append(stripe.WebhookSignature.generate_signature_header(payload, req["secret"], timestamp=item["t"]))
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({
        "secret": secret,
        "items": items.iter().map(|(p, t)| serde_json::json!({"payload": p, "t": t})).collect::<Vec<_>>(),
    });
    serde_json::from_slice(&run_python(script, &request, "stripe-python signing")).expect("headers")
}

/// Runs `script` with `request` as JSON on its stdin; its stdout. The test command installs the
/// packages the scripts import (`stripe`, `standardwebhooks`, `cryptography`).
pub(super) fn run_python(script: &str, request: &serde_json::Value, what: &str) -> Vec<u8> {
    let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(request.to_string().as_bytes())
            .expect("write");
    }
    let output = child.wait_with_output().expect("python");
    assert!(
        output.status.success(),
        "{what} failed (are the test command's Python packages installed?): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// How many of `deliveries` the official Standard Webhooks library (`standardwebhooks` on PyPI)
/// verifies under `secret` alone: one Python process, each delivery checked from its recorded
/// headers and raw body.
pub fn standard_python_verified(
    secret: &str,
    deliveries: &[crate::helpers::receiver::Received],
) -> usize {
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
req = json.load(sys.stdin)
hook = Webhook(req["secret"])
verified = 0
for d in req["deliveries"]:
    try:
        hook.verify(bytes(d["body"]), dict(d["headers"]))
        verified += 1
    except Exception as e:
        print(f"refused {d['headers']}: {e!r}", file=sys.stderr)
json.dump(verified, sys.stdout)
"#;
    let request = serde_json::json!({
        "secret": secret,
        "deliveries": deliveries
            .iter()
            .map(|d| serde_json::json!({"body": d.body.to_vec(), "headers": d.headers}))
            .collect::<Vec<_>>(),
    });
    let verified = run_python(script, &request, "standardwebhooks verification");
    serde_json::from_slice(&verified).expect("a count")
}

/// An ed25519 key pair that Python's `cryptography` generated (`Ed25519PrivateKey.generate()`),
/// serialised as Standard Webhooks keys, and its `v1a,<base64>` signatures of the items asked
/// for, each over the content Python builds itself: `{id}.{timestamp}.{body}`.
#[derive(Debug, Clone)]
pub struct PythonEd25519 {
    /// `whsk_` + the 32-byte seed.
    pub whsk_seed: String,
    /// `whsk_` + seed and public key, 64 bytes, as libsodium writes a secret key.
    pub whsk_pair: String,
    /// `whpk_` + the 32-byte public key.
    pub whpk: String,
    /// One `v1a,…` item per signed item, in order.
    pub signatures: Vec<String>,
}

/// A fresh key pair from Python's `cryptography`, signing each (webhook-id, timestamp, body).
pub fn ed25519_python_sign(items: &[(&str, i64, &[u8])]) -> PythonEd25519 {
    let script = r#"
import base64, json, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
req = json.load(sys.stdin)
key = Ed25519PrivateKey.generate()
seed = key.private_bytes_raw()
public = key.public_key().public_bytes_raw()
b64 = lambda b: base64.b64encode(b).decode()
out = {"whsk_seed": "whsk_" + b64(seed), "whsk_pair": "whsk_" + b64(seed + public),
       "whpk": "whpk_" + b64(public), "signatures": []}
for item in req["items"]:
    content = item["id"].encode() + b"." + str(item["t"]).encode() + b"." + bytes(item["body"])
    out["signatures"].append("v1a," + b64(key.sign(content)))
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({
        "items": items
            .iter()
            .map(|(id, t, body)| serde_json::json!({"id": id, "t": t, "body": body}))
            .collect::<Vec<_>>(),
    });
    let out: serde_json::Value = serde_json::from_slice(&run_python(
        script,
        &request,
        "cryptography ed25519 signing",
    ))
    .expect("JSON");
    let text = |name: &str| out[name].as_str().expect(name).to_owned();
    PythonEd25519 {
        whsk_seed: text("whsk_seed"),
        whsk_pair: text("whsk_pair"),
        whpk: text("whpk"),
        signatures: serde_json::from_value(out["signatures"].clone()).expect("signatures"),
    }
}

/// How many of `deliveries` carry a `v1a` item that Python's `cryptography` verifies under the
/// public key `whpk` alone (`Ed25519PublicKey.verify`), over the content rebuilt from the
/// recorded `webhook-id`, `webhook-timestamp` and raw body, with a timestamp within 5 minutes.
pub fn ed25519_python_verified(
    whpk: &str,
    deliveries: &[crate::helpers::receiver::Received],
) -> usize {
    let script = r#"
import base64, json, sys, time
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
req = json.load(sys.stdin)
assert req["whpk"].startswith("whpk_")
key = Ed25519PublicKey.from_public_bytes(base64.b64decode(req["whpk"][len("whpk_"):]))
verified = 0
for d in req["deliveries"]:
    h = dict(d["headers"])
    content = h["webhook-id"].encode() + b"." + h["webhook-timestamp"].encode() + b"." + bytes(d["body"])
    fresh = abs(time.time() - int(h["webhook-timestamp"])) <= 300
    for item in h["webhook-signature"].split(" "):
        version, _, signature = item.partition(",")
        if version != "v1a":
            continue
        try:
            key.verify(base64.b64decode(signature), content)
        except InvalidSignature:
            continue
        verified += fresh
        break
json.dump(verified, sys.stdout)
"#;
    let request = serde_json::json!({
        "whpk": whpk,
        "deliveries": deliveries
            .iter()
            .map(|d| serde_json::json!({"body": d.body.to_vec(), "headers": d.headers}))
            .collect::<Vec<_>>(),
    });
    let verified = run_python(script, &request, "cryptography ed25519 verification");
    serde_json::from_slice(&verified).expect("a count")
}
