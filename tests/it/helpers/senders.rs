//! Deliveries signed by the senders' own libraries, for `tests/it/sources/`: GitHub's
//! `@octokit/webhooks-methods` (`sign`), Shopify's `@shopify/shopify-api` (its test helper
//! `getHmac`, which Shopify's own tests sign webhooks with; the Python `ShopifyAPI` has no
//! webhook signer), Slack's `slack_sdk` (`SignatureVerifier.generate_signature`) and Paddle's
//! `paddle-python-sdk` (`PaddleSignature.calculate_hmac`). Linear's `@linear/sdk` only
//! verifies: its deliveries are signed by a plain HMAC and each one that is within its window
//! is checked by the SDK's `LinearWebhookClient.verify`; so are Zoom's, by `@zoom/rivet`'s
//! `AwsLambdaReceiver`, which also gives its answer to a url_validation; and Square's, by the
//! pip `squareup`'s `verify_signature`. PayPal signs on its servers with a key of its own, and no
//! maintained SDK of PayPal's signs or verifies offline: its deliveries are signed by a test key
//! and self-signed certificate (`cryptography`), over the string the deprecated `paypalrestsdk`'s
//! `WebhookEvent._get_expected_sig` builds. Twilio's deliveries are signed by the `twilio`
//! library's `RequestValidator.compute_signature`, Adyen's items by the `Adyen` library's
//! `generate_notification_sig`. One node or python process signs every item of a call.
//! scripts/test.sh installs them (the npm
//! packages under target/sender-sdks, found through `NODE_PATH`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::signing::run_python;

/// The `node_modules` folder holding the senders' npm packages: the first entry of `NODE_PATH`
/// that has them, else scripts/test.sh's folder under target/.
fn sender_modules() -> PathBuf {
    let has_them = |dir: &PathBuf| {
        ["@octokit/webhooks-methods", "@linear/sdk", "@zoom/rivet"]
            .iter()
            .all(|package| dir.join(package).is_dir())
    };
    let from_env = std::env::var_os("NODE_PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .find(has_them);
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sender-sdks/node_modules");
    let dir = from_env.unwrap_or(default);
    assert!(
        has_them(&dir),
        "the senders' npm packages are missing from {} (scripts/test.sh installs them, and \
         exports NODE_PATH)",
        dir.display()
    );
    dir
}

/// Runs the ES module `script` with `request` as JSON on its stdin; its stdout. Node runs from
/// the folder above [`sender_modules`]: an ES module's imports are resolved from where it is,
/// never through `NODE_PATH`.
fn run_node(script: &str, request: &serde_json::Value, what: &str) -> Vec<u8> {
    let modules = sender_modules();
    let mut child = Command::new("node")
        .args(["--input-type=module", "-e", script])
        .current_dir(modules.parent().expect("node_modules has a parent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node must be installed");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(request.to_string().as_bytes())
            .expect("write");
    }
    let output = child.wait_with_output().expect("node");
    assert!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The JSON request every signer reads: the secret and the payloads (UTF-8 text, as the
/// libraries take them).
fn request(secret: &str, bodies: &[&str]) -> serde_json::Value {
    serde_json::json!({ "secret": secret, "bodies": bodies })
}

/// Reads the stdin of a node script into `req`.
const READ_STDIN: &str = r#"
let input = "";
for await (const chunk of process.stdin) input += chunk;
const req = JSON.parse(input);
"#;

/// `X-Hub-Signature-256` values (`sha256=<hex>`) of each body under `secret`, from
/// `@octokit/webhooks-methods`'s `sign(secret, payload)`.
pub fn github_sign(secret: &str, bodies: &[&str]) -> Vec<String> {
    let script = format!(
        r#"import {{ sign }} from "@octokit/webhooks-methods";
{READ_STDIN}
const out = [];
for (const body of req.bodies) out.push(await sign(req.secret, body));
process.stdout.write(JSON.stringify(out));"#
    );
    let out = run_node(
        &script,
        &request(secret, bodies),
        "@octokit/webhooks-methods signing",
    );
    serde_json::from_slice(&out).expect("signatures")
}

/// `X-Shopify-Hmac-Sha256` values (base64) of each body under `secret`, from
/// `@shopify/shopify-api/test-helpers`'s `getHmac(body, secret)`.
pub fn shopify_sign(secret: &str, bodies: &[&str]) -> Vec<String> {
    let script = format!(
        r#"import {{ createRequire }} from "node:module";
const require = createRequire(process.cwd() + "/");
const {{ getHmac }} = require("@shopify/shopify-api/test-helpers");
{READ_STDIN}
process.stdout.write(JSON.stringify(req.bodies.map((body) => getHmac(body, req.secret))));"#
    );
    let out = run_node(
        &script,
        &request(secret, bodies),
        "@shopify/shopify-api signing",
    );
    serde_json::from_slice(&out).expect("signatures")
}

/// `X-Slack-Signature` values (`v0=<hex>`) of each (timestamp, body) under `secret`, from
/// `slack_sdk`'s `SignatureVerifier(secret).generate_signature(timestamp=, body=)`.
pub fn slack_sign(secret: &str, items: &[(i64, &str)]) -> Vec<String> {
    let script = r#"
import json, sys
from slack_sdk.signature import SignatureVerifier
req = json.load(sys.stdin)
verifier = SignatureVerifier(req["secret"])
json.dump([verifier.generate_signature(timestamp=str(t), body=body) for t, body in req["items"]], sys.stdout)
"#;
    let request = serde_json::json!({ "secret": secret, "items": items });
    serde_json::from_slice(&run_python(script, &request, "slack_sdk signing")).expect("signatures")
}

/// `Paddle-Signature` values (`ts=<t>;h1=<hex>`, one `h1` per secret of `secrets`, as during a
/// rotation) of each (timestamp, body), from `paddle-python-sdk`'s
/// `PaddleSignature.calculate_hmac(secret, b"{ts}:{body}")`; each is checked by the SDK's own
/// `PaddleSignature().verify(header, body, [Secret…])` before it is returned.
pub fn paddle_sign(secrets: &[&str], items: &[(i64, &str)]) -> Vec<String> {
    let script = r#"
import json, sys
from paddle_billing.Notifications.PaddleSignature import PaddleSignature
from paddle_billing.Notifications.Secret import Secret
req = json.load(sys.stdin)
out = []
for t, body in req["items"]:
    h1 = [PaddleSignature.calculate_hmac(s, f"{t}:{body}".encode()).hexdigest() for s in req["secrets"]]
    header = f"ts={t};" + ";".join(f"h1={h}" for h in h1)
    assert PaddleSignature().verify(header, body, [Secret(s) for s in req["secrets"]])
    out.append(header)
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({ "secrets": secrets, "items": items });
    serde_json::from_slice(&run_python(script, &request, "paddle-python-sdk signing"))
        .expect("signatures")
}

/// `Linear-Signature` values (hex HMAC-SHA256 of the raw body, as Linear signs) of each body
/// under `secret`; each body whose `webhookTimestamp` is within the SDK's 60 s of now must also
/// pass `@linear/sdk/webhooks`'s `new LinearWebhookClient(secret).verify(body, signature)`, so
/// the test sends what Linear's own verifier accepts.
pub fn linear_sign(secret: &str, bodies: &[&str]) -> Vec<String> {
    let script = format!(
        r#"import crypto from "node:crypto";
import {{ LinearWebhookClient }} from "@linear/sdk/webhooks";
{READ_STDIN}
const client = new LinearWebhookClient(req.secret);
const out = [];
for (const body of req.bodies) {{
  const signature = crypto.createHmac("sha256", req.secret).update(body).digest("hex");
  const ts = JSON.parse(body).webhookTimestamp;
  if (Math.abs(Date.now() - ts) < 50000 && client.verify(Buffer.from(body), signature) !== true)
    throw new Error("@linear/sdk refused " + body);
  out.push(signature);
}}
process.stdout.write(JSON.stringify(out));"#
    );
    let out = run_node(&script, &request(secret, bodies), "@linear/sdk checking");
    serde_json::from_slice(&out).expect("signatures")
}

/// `x-zm-signature` values (`v0=<hex>` of `v0:{timestamp}:{body}`, a plain HMAC, as Zoom signs)
/// of each (timestamp, body) under `secret`, each with what `@zoom/rivet`'s
/// `AwsLambdaReceiver({webhooksSecretToken})` answers it: every one must be a 200 (Rivet checks
/// no timestamp, so stale ones too), and the answer's body is returned (for a url_validation,
/// its `{plainToken, encryptedToken}`). Rivet signs `JSON.stringify(JSON.parse(body))`, so the
/// bodies must be compact JSON.
pub fn zoom_sign(secret: &str, items: &[(i64, &str)]) -> Vec<(String, serde_json::Value)> {
    let script = format!(
        r#"import crypto from "node:crypto";
import {{ createRequire }} from "node:module";
// Rivet logs each event on stdout (console.debug): to stderr, keeping stdout for the answer.
for (const level of ["log", "info", "debug"]) console[level] = (...args) => console.error(...args);
const require = createRequire(process.cwd() + "/");
const {{ AwsLambdaReceiver }} = require("@zoom/rivet/meetings");
{READ_STDIN}
const receiver = new AwsLambdaReceiver({{ webhooksSecretToken: req.secret }});
receiver.init({{ eventEmitter: {{ emit: async () => {{}} }} }});
const handle = receiver.start();
const out = [];
for (const [t, body] of req.items) {{
  const ts = String(t);
  const signature = "v0=" + crypto.createHmac("sha256", req.secret).update(`v0:${{ts}}:${{body}}`).digest("hex");
  const answer = await handle({{ body, headers: {{ "x-zm-signature": signature, "x-zm-request-timestamp": ts }} }}, {{}});
  if (answer.statusCode !== 200) throw new Error("@zoom/rivet refused " + body + ": " + JSON.stringify(answer));
  out.push([signature, JSON.parse(answer.body)]);
}}
process.stdout.write(JSON.stringify(out));"#
    );
    let request = serde_json::json!({ "secret": secret, "items": items });
    let out = run_node(&script, &request, "@zoom/rivet checking");
    serde_json::from_slice(&out).expect("signatures")
}

/// `x-square-hmacsha256-signature` values (base64 HMAC-SHA256 of `{url}{body}`, as Square signs;
/// its SDKs only verify) of each (notification URL, body) under `key`; each must pass the pip
/// `squareup`'s `square.utils.webhooks_helper.verify_signature` for that URL, and fail it for
/// another, before it is returned.
pub fn square_sign(key: &str, items: &[(&str, &str)]) -> Vec<String> {
    let script = r#"
import base64, hashlib, hmac, json, sys
from square.utils.webhooks_helper import verify_signature
req = json.load(sys.stdin)
out = []
for url, body in req["items"]:
    sig = base64.b64encode(hmac.new(req["key"].encode(), (url + body).encode(), hashlib.sha256).digest()).decode()
    assert verify_signature(request_body=body, signature_header=sig, signature_key=req["key"], notification_url=url)
    assert not verify_signature(request_body=body, signature_header=sig, signature_key=req["key"], notification_url=url + "x")
    out.append(sig)
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({ "key": key, "items": items });
    serde_json::from_slice(&run_python(script, &request, "squareup checking")).expect("signatures")
}

/// A PayPal signing key of the test's own: a fresh RSA 2048 key and its self-signed
/// certificate named as PayPal's (`messageverificationcerts.paypal.com`), valid from
/// `valid_days.0` to `valid_days.1` days from now; and the base64 `SHA256withRSA` signature of each (transmission
/// id, transmission time, webhook id, body), over the string `paypalrestsdk`'s
/// `WebhookEvent._get_expected_sig` builds (`{id}|{time}|{webhook id}|{crc32(body)}`), checked
/// by `cryptography` against the certificate before it is returned.
pub fn paypal_sign(
    items: &[(&str, &str, &str, &str)],
    valid_days: (i64, i64),
) -> (String, Vec<String>) {
    paypal_sign_as("messageverificationcerts.paypal.com", items, valid_days)
}

/// [`paypal_sign`] with a certificate whose common name is `common_name`.
pub fn paypal_sign_as(
    common_name: &str,
    items: &[(&str, &str, &str, &str)],
    valid_days: (i64, i64),
) -> (String, Vec<String>) {
    let script = r#"
import base64, datetime, json, sys
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa, padding
from paypalrestsdk.notifications import WebhookEvent
req = json.load(sys.stdin)
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, req["common_name"])])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(now + datetime.timedelta(days=req["valid"][0]))
    .not_valid_after(now + datetime.timedelta(days=req["valid"][1]))
    .sign(key, hashes.SHA256()))
out = []
for transmission_id, time, webhook_id, body in req["items"]:
    signed = WebhookEvent._get_expected_sig(transmission_id, time, webhook_id, body).encode()
    signature = key.sign(signed, padding.PKCS1v15(), hashes.SHA256())
    cert.public_key().verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
    out.append(base64.b64encode(signature).decode())
json.dump([cert.public_bytes(serialization.Encoding.PEM).decode(), out], sys.stdout)
"#;
    let request = serde_json::json!({
        "items": items,
        "valid": [valid_days.0, valid_days.1],
        "common_name": common_name,
    });
    serde_json::from_slice(&run_python(
        script,
        &request,
        "paypalrestsdk string, cryptography signing",
    ))
    .expect("certificate and signatures")
}

/// `webhook-signature` values (`v1,<base64>`) the official Standard Webhooks library
/// (`standardwebhooks` on PyPI, `Webhook.sign`) makes under `secret` for each (webhook-id, Unix
/// seconds, body).
pub fn standard_sign(secret: &str, items: &[(&str, i64, &str)]) -> Vec<String> {
    let script = r#"
import json, sys
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook
req = json.load(sys.stdin)
hook = Webhook(req["secret"])
json.dump([hook.sign(i, datetime.fromtimestamp(t, tz=timezone.utc), b) for i, t, b in req["items"]], sys.stdout)
"#;
    let request = serde_json::json!({ "secret": secret, "items": items });
    serde_json::from_slice(&run_python(script, &request, "standardwebhooks signing"))
        .expect("signatures")
}

/// `X-Twilio-Signature` values from the `twilio` library's
/// `RequestValidator(token).compute_signature(url, params)`, each checked by its `validate`
/// first. An item `{"url", "params": {name: value}}` is a form POST to `url`; an item
/// `{"url", "body"}` is the JSON variant: the SDK's `compute_hash(body)` is appended to `url`'s
/// query as `bodySHA256`, and the signature is over that URL alone. Returns each signature with
/// the query string the request must carry (the JSON variant's, with its `bodySHA256`).
pub fn twilio_sign(token: &str, items: &[serde_json::Value]) -> Vec<(String, String)> {
    let script = r#"
import json, sys
from urllib.parse import urlsplit
from twilio.request_validator import RequestValidator
req = json.load(sys.stdin)
rv = RequestValidator(req["token"])
out = []
for item in req["items"]:
    url = item["url"]
    if "body" in item:
        url += ("&" if "?" in url else "?") + "bodySHA256=" + rv.compute_hash(item["body"])
        sig = rv.compute_signature(url, {})
        assert rv.validate(url, item["body"], sig)
    else:
        sig = rv.compute_signature(url, item["params"])
        assert rv.validate(url, item["params"], sig)
    out.append([sig, urlsplit(url).query])
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({ "token": token, "items": items });
    serde_json::from_slice(&run_python(script, &request, "twilio signing")).expect("signatures")
}

/// Each item (a `NotificationRequestItem` object) with its `additionalData.hmacSignature` from
/// the `Adyen` library's `Adyen.util.generate_notification_sig(item, hex_key)`; each batch of one
/// is checked by its `is_valid_hmac_notification` first.
pub fn adyen_sign(hex_key: &str, items: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let script = r#"
import json, sys
from Adyen.util import generate_notification_sig, is_valid_hmac_notification
req = json.load(sys.stdin)
out = []
for item in req["items"]:
    signature = generate_notification_sig(item, req["key"]).decode()
    item.setdefault("additionalData", {})["hmacSignature"] = signature
    assert is_valid_hmac_notification({"notificationItems": [{"NotificationRequestItem": item}]}, req["key"])
    out.append(item)
json.dump(out, sys.stdout)
"#;
    let request = serde_json::json!({ "key": hex_key, "items": items });
    serde_json::from_slice(&run_python(script, &request, "Adyen signing")).expect("signed items")
}
