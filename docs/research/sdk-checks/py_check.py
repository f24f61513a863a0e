import hmac, hashlib, base64, json, time, datetime, binascii
S="shhh"; BODY='{"id":"evt_1","x":1}'
def ok(name, cond): print(("PASS " if cond else "FAIL ")+name)

# Slack
from slack_sdk.signature import SignatureVerifier
ts=str(int(time.time()))
sv=SignatureVerifier(S); sig=sv.generate_signature(timestamp=ts, body=BODY)
ref="v0="+hmac.new(S.encode(), f"v0:{ts}:{BODY}".encode(), hashlib.sha256).hexdigest()
ok("slack generate_signature == ref", sig==ref)
ok("slack is_valid_request", sv.is_valid_request(BODY, {"X-Slack-Request-Timestamp":ts,"X-Slack-Signature":sig}))

# Twilio form
from twilio.request_validator import RequestValidator
rv=RequestValidator(S); url="https://example.com/twilio/sms?x=1"
params={"From":"+15550001","Body":"hi","To":"+15550002"}
sig=rv.compute_signature(url, params)
s=url+"".join(k+params[k] for k in sorted(params))
ref=base64.b64encode(hmac.new(S.encode(), s.encode(), hashlib.sha1).digest()).decode()
ok("twilio compute_signature(form) == ref", sig==ref)
ok("twilio validate(form)", rv.validate(url, params, sig))
# Twilio JSON bodySHA256
bh=hashlib.sha256(BODY.encode()).hexdigest()
url2=f"https://example.com/twilio/json?bodySHA256={bh}"
sig2=rv.compute_signature(url2, {})
ok("twilio validate(json, bodySHA256)", rv.validate(url2, BODY, sig2))
ok("twilio HMAC_SHA256 variant", rv.validate(url, params, rv.compute_signature(url, params, "HMAC_SHA256"), "HMAC_SHA256"))

# Paddle
from paddle_billing.Notifications.PaddleSignature import PaddleSignature
from paddle_billing.Notifications.Secret import Secret
h1=PaddleSignature.calculate_hmac(S, f"{ts}:{BODY}".encode()).hexdigest()
hdr=f"ts={ts};h1={h1}"
ok("paddle verify", PaddleSignature().verify(hdr, BODY, Secret(S)))
ok("paddle verify rotation (2 h1, 2 secrets)", PaddleSignature().verify(f"ts={ts};h1={'0'*64};h1={h1}", BODY, [Secret("old"), Secret(S)]))

# Square
from square.utils.webhooks_helper import verify_signature
nurl="https://example.com/square"
sq=base64.b64encode(hmac.new(S.encode(), (nurl+BODY).encode(), hashlib.sha256).digest()).decode()
ok("square verify_signature", verify_signature(request_body=BODY, signature_header=sq, signature_key=S, notification_url=nurl))

# Adyen
from Adyen.util import generate_notification_sig, is_valid_hmac_notification
key="44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
item={"pspReference":"7914073381342284","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","amount":{"value":1130,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true"}
sig=generate_notification_sig(item, key).decode()
s="7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
ref=base64.b64encode(hmac.new(binascii.a2b_hex(key), s.encode(), hashlib.sha256).digest()).decode()
ok("adyen generate_notification_sig == ref", sig==ref); print("  adyen sig:", sig)
full={"live":"false","notificationItems":[{"NotificationRequestItem":dict(item, additionalData={"hmacSignature":sig})}]}
ok("adyen is_valid_hmac_notification", is_valid_hmac_notification(full, key))

# Standard Webhooks / Svix
from standardwebhooks.webhooks import Webhook as SW
from svix.webhooks import Webhook as SX
sec="whsec_"+base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
now=datetime.datetime.now(datetime.timezone.utc)
sig=SW(sec).sign("msg_1", now, BODY)
ref="v1,"+base64.b64encode(hmac.new(b"0123456789abcdef0123456789abcdef", f"msg_1.{int(now.timestamp())}.{BODY}".encode(), hashlib.sha256).digest()).decode()
ok("standardwebhooks sign == ref", sig==ref)
SX(sec).verify(BODY, {"svix-id":"msg_1","svix-timestamp":str(int(now.timestamp())),"svix-signature":"v1,bogus "+sig}); ok("svix verify (multi-sig)", True)

# PayPal (paypalrestsdk private helpers)
from paypalrestsdk.notifications import WebhookEvent
msg=WebhookEvent._get_expected_sig("tid-1","2024-01-01T00:00:00Z","WH123",BODY)
ok("paypal expected string", msg=="tid-1|2024-01-01T00:00:00Z|WH123|"+str(binascii.crc32(BODY.encode())&0xffffffff)); print("  paypal signed string:", msg)
try:
    from OpenSSL import crypto
    ok("pyOpenSSL crypto.verify exists", hasattr(crypto,"verify"))
except Exception as e: print("pyopenssl", e)
