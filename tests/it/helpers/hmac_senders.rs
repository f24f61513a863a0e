//! Deliveries signed as each preset's sender documents (`scheme = "hmac"`, `preset = …`), for
//! `tests/it/sources/hmac.rs`: by the sender's official library where one signs and installs
//! offline (HubSpot's `hubspot-api-client`, `Signature.get_signature(…, "v3", …)`; Clerk's and
//! Resend's Svix scheme by the `standardwebhooks` library's `Webhook.sign`, which Svix's is),
//! else computed from the documented recipe with Python's `hmac`, written apart from the Rust
//! rules it checks (scripts/test.sh installs the packages).

use super::signing::run_python;

/// One delivery to sign: the preset, the secret as configured, the body, the time it is signed
/// at (Unix seconds), its id (for the senders that put one in a header) and the URL it is sent
/// to (HubSpot signs it).
#[derive(serde::Serialize)]
pub struct PresetItem<'a> {
    pub preset: &'a str,
    pub secret: &'a str,
    pub body: &'a str,
    pub t: i64,
    pub id: &'a str,
    pub url: &'a str,
}

/// The headers each sender sends with `item`'s body, signed.
pub fn preset_sign(items: &[PresetItem<'_>]) -> Vec<Vec<(String, String)>> {
    let script = r#"
import base64, hashlib, hmac, json, sys
from datetime import datetime, timezone
from hubspot.utils.signature import Signature
from standardwebhooks import Webhook

def mac(secret, message, digest):
    return hmac.new(secret.encode(), message.encode(), digest)

def sign(it):
    p, s, body, t, i = it["preset"], it["secret"], it["body"], it["t"], it["id"]
    if p == "bitbucket":
        return [["X-Hub-Signature", "sha256=" + mac(s, body, hashlib.sha256).hexdigest()],
                ["X-Request-UUID", i], ["X-Event-Key", "repo:push"]]
    if p == "calendly":
        v1 = mac(s, f"{t}.{body}", hashlib.sha256).hexdigest()
        return [["Calendly-Webhook-Signature", f"t={t},v1={v1}"]]
    if p in ("clerk", "resend"):
        sig = Webhook(s).sign(i, datetime.fromtimestamp(t, tz=timezone.utc), body)
        return [["svix-id", i], ["svix-timestamp", str(t)], ["svix-signature", sig]]
    if p == "hubspot":
        ms = str(t * 1000)
        sig = Signature.get_signature(s, body, "v3", it["url"], "POST", ms)
        if abs(t - datetime.now().timestamp()) < 250:  # the library refuses stale ones itself
            assert Signature.is_valid(sig, s, body, it["url"], "POST", "v3", ms)
        return [["X-HubSpot-Signature-v3", sig], ["X-HubSpot-Request-Timestamp", ms]]
    if p == "intercom":
        return [["X-Hub-Signature", "sha1=" + mac(s, body, hashlib.sha1).hexdigest()]]
    if p == "sentry":
        return [["Sentry-Hook-Signature", mac(s, body, hashlib.sha256).hexdigest()],
                ["Request-ID", i], ["Sentry-Hook-Resource", "issue"]]
    if p == "twitch":
        ts = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.634234626Z")
        sig = "sha256=" + mac(s, i + ts + body, hashlib.sha256).hexdigest()
        return [["Twitch-Eventsub-Message-Id", i], ["Twitch-Eventsub-Message-Timestamp", ts],
                ["Twitch-Eventsub-Message-Signature", sig], ["Twitch-Eventsub-Message-Type", "notification"],
                ["Twitch-Eventsub-Subscription-Type", "channel.follow"]]
    if p == "typeform":
        sig = base64.b64encode(mac(s, body, hashlib.sha256).digest()).decode()
        return [["Typeform-Signature", "sha256=" + sig]]
    if p == "vercel":
        return [["x-vercel-signature", mac(s, body, hashlib.sha1).hexdigest()]]
    raise ValueError("no recipe for " + p)

json.dump([sign(it) for it in json.load(sys.stdin)], sys.stdout)
"#;
    let request = serde_json::to_value(items).expect("items");
    serde_json::from_slice(&run_python(script, &request, "preset signing")).expect("headers")
}
