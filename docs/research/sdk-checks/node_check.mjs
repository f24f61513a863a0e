import crypto from 'node:crypto';
import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const ok=(n,c)=>console.log((c?'PASS ':'FAIL ')+n);
const S='shhh', BODY='{"id":"evt_1","x":1}';
// GitHub
const { sign, verify, verifyWithFallback } = await import('@octokit/webhooks-methods');
const gh = await sign(S, BODY);
ok('octokit sign == ref', gh === 'sha256='+crypto.createHmac('sha256',S).update(BODY).digest('hex'));
ok('octokit verifyWithFallback', await verifyWithFallback('old', BODY, gh, [S]));
// Shopify
const { getHmac } = require('@shopify/shopify-api/test-helpers');
ok('shopify getHmac == ref', getHmac(BODY,S) === crypto.createHmac('sha256',S).update(BODY,'utf8').digest('base64'));
// Paddle
const { Paddle, Environment } = require('@paddle/paddle-node-sdk');
const paddle = new Paddle('pdl_sdbx_apikey_dummy', { environment: Environment.sandbox }); // initialises the crypto runtime; no network
const ts = Math.floor(Date.now()/1000);
const h1 = crypto.createHmac('sha256',S).update(`${ts}:${BODY}`).digest('hex');
ok('paddle node isSignatureValid', await paddle.webhooks.isSignatureValid(BODY, S, `ts=${ts};h1=${h1}`));
ok('paddle node: 2 h1, valid one LAST (node SDK keeps only the last h1)', await paddle.webhooks.isSignatureValid(BODY, S, `ts=${ts};h1=${'0'.repeat(64)};h1=${h1}`));
// Square
const { WebhooksHelper } = require('square');
const nurl='https://example.com/square';
const sq = crypto.createHmac('sha256',S).update(nurl+BODY).digest('base64');
ok('square verifySignature', await WebhooksHelper.verifySignature({requestBody:BODY, signatureHeader:sq, signatureKey:S, notificationUrl:nurl}));
// Adyen
const HmacValidator = require('@adyen/api-library/lib/src/utils/hmacValidator').default;
const key='44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056';
const item={pspReference:'7914073381342284',merchantAccountCode:'TestMerchant',merchantReference:'TestPayment-1407325143704',amount:{value:1130,currency:'EUR'},eventCode:'AUTHORISATION',success:'true'};
const hv=new HmacValidator(); const asig=hv.calculateHmac(item,key);
ok('adyen calculateHmac == doc example', asig==='coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=');
ok('adyen validateHMAC', hv.validateHMAC({...item, additionalData:{hmacSignature:asig}}, key));
// Linear
const { LinearWebhookClient } = await import('@linear/sdk/webhooks');
const lbody = JSON.stringify({action:'create',type:'Issue',webhookTimestamp:Date.now(),data:{id:'i1'}});
const lsig = crypto.createHmac('sha256',S).update(lbody).digest('hex');
ok('linear verify', new LinearWebhookClient(S).verify(Buffer.from(lbody), lsig));
// Twilio
const twilio = require('twilio');
const url='https://example.com/twilio/sms?x=1', params={From:'+15550001',Body:'hi',To:'+15550002'};
const tsig = twilio.getExpectedTwilioSignature(S, url, params);
ok('twilio validateRequest', twilio.validateRequest(S, tsig, url, params));
const bh = crypto.createHash('sha256').update(BODY).digest('hex');
const url2=`https://example.com/twilio/json?bodySHA256=${bh}`;
ok('twilio validateRequestWithBody', twilio.validateRequestWithBody(S, twilio.getExpectedTwilioSignature(S,url2,{}), url2, BODY));
// Zoom rivet
const { AwsLambdaReceiver } = require('@zoom/rivet/meetings');
const zts = String(Math.floor(Date.now()/1000));
const zbody = JSON.stringify({event:'endpoint.url_validation',payload:{plainToken:'qgg8vlvZRS6UYooatFL8Aw'},event_ts:1654503849680});
const zsig = 'v0='+crypto.createHmac('sha256',S).update(`v0:${zts}:${zbody}`).digest('hex');
const r = new AwsLambdaReceiver({webhooksSecretToken:S}); r.init({eventEmitter:null});
const resp = await r.start()({body:zbody, headers:{'x-zm-signature':zsig,'x-zm-request-timestamp':zts}}, {});
const rb = JSON.parse(resp.body);
ok('zoom rivet url_validation 200', resp.statusCode===200 && rb.encryptedToken===crypto.createHmac('sha256',S).update('qgg8vlvZRS6UYooatFL8Aw').digest('hex'));
console.log('  zoom response:', resp.body);
// Standard webhooks / svix
const { Webhook: SW } = require('standardwebhooks');
const secB64 = Buffer.from('0123456789abcdef0123456789abcdef').toString('base64');
const now = new Date(); const sws = new SW(secB64).sign('msg_1', now, BODY);
ok('standardwebhooks sign == ref', sws === 'v1,'+crypto.createHmac('sha256',Buffer.from('0123456789abcdef0123456789abcdef')).update(`msg_1.${Math.floor(now/1000)}.${BODY}`).digest('base64'));
const { Webhook: SX } = require('svix');
new SX('whsec_'+secB64).verify(BODY, {'svix-id':'msg_1','svix-timestamp':String(Math.floor(now/1000)),'svix-signature':'v1,bogus '+sws}); ok('svix node verify', true);
