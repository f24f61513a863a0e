import '@shopify/shopify-api/adapters/node';
import { shopifyApi, ApiVersion } from '@shopify/shopify-api';
import { getHmac } from '@shopify/shopify-api/test-helpers';
const shopify = shopifyApi({ apiKey:'k', apiSecretKey:'shhh', scopes:[], hostName:'localhost', apiVersion: ApiVersion.October24, isEmbeddedApp:false, logger:{level:0} });
const rawBody='{"id":1}';
const headers={'x-shopify-hmac-sha256':getHmac(rawBody,'shhh'),'x-shopify-topic':'orders/create','x-shopify-shop-domain':'t.myshopify.com','x-shopify-api-version':'2024-10','x-shopify-webhook-id':'w1','x-shopify-event-id':'e1'};
const r = await shopify.webhooks.validate({ rawBody, rawRequest:{ headers, method:'POST', url:'/webhooks' }, rawResponse:{} });
console.log(JSON.stringify(r));
