'use strict';
// The checkout example's `POST /v1/payments` (crates/idempotency-key/examples/checkout) written
// the way a Node team would write the usual Idempotency-Key recipe with Express, pg and ioredis:
// a Redis lock per (account, key), PostgreSQL as the record of stored responses, Redis as a
// cache of them. It charges the very provider stub the Rust checkout charges (PROVIDER_URL), with
// the same key and bearer, so the provider's work is the same for both. bench/compare_checkout.sh
// runs it against the Rust checkout.
//
// Environment:
//   LISTEN        port or host:port (default 127.0.0.1:8082)
//   DATABASE_URL  PostgreSQL (required)
//   REDIS_URL     Redis (default redis://127.0.0.1:6379/)
//   REDIS_PREFIX  namespace of this server's Redis keys (default express-checkout)
//   PROVIDER_URL  base URL of the provider stub, e.g. http://127.0.0.1:18092 (required)
//   PG_SCHEMA     schema of this server's tables (default express_checkout)
//   WORKERS       processes (node:cluster); the pg pool's 32 connections are split between them
//
// Per first payment: Redis GET (cache) + SET NX PX (lock); PostgreSQL SELECT (stored response),
// INSERT (payment row, autocommit), then BEGIN / UPDATE / INSERT / COMMIT (the payment's outcome
// and the stored response, one commit); the provider call; one Redis pipeline (cache the
// response, release the lock). Replays: one Redis GET.

const cluster = require('node:cluster');
const crypto = require('node:crypto');
const express = require('express');
const { Pool } = require('pg');
const Redis = require('ioredis');
const { Agent, request } = require('undici');

const LISTEN = process.env.LISTEN || '127.0.0.1:8082';
const DATABASE_URL = process.env.DATABASE_URL;
const REDIS_URL = process.env.REDIS_URL || 'redis://127.0.0.1:6379/';
const REDIS_PREFIX = process.env.REDIS_PREFIX || 'express-checkout';
const PROVIDER_URL = process.env.PROVIDER_URL;
const SCHEMA = process.env.PG_SCHEMA || 'express_checkout';
const WORKERS = Math.max(1, parseInt(process.env.WORKERS || '1', 10));
// The Rust checkout's pool: 32 connections (checkout and provider share it).
const POOL_MAX = Math.max(1, Math.ceil(32 / WORKERS));
const LOCK_MS = 30_000; // longer than the provider timeout below: the lock outlives the request
const CACHE_S = 24 * 3600; // as the Rust layer's key lifetime
const PROVIDER_TIMEOUT_MS = 10_000; // as the Rust checkout's reqwest client

if (!DATABASE_URL || !PROVIDER_URL) {
  console.error('DATABASE_URL and PROVIDER_URL are required');
  process.exit(2);
}
if (!/^[a-z_][a-z0-9_]*$/.test(SCHEMA)) {
  console.error('PG_SCHEMA must be a plain identifier');
  process.exit(2);
}

const T_PAYMENTS = `${SCHEMA}.payments`;
const T_KEYS = `${SCHEMA}.idempotency_keys`;

async function migrate(pool) {
  // One statement per query: the schema, the payments, the stored responses. The unique
  // (account, idempotency_key) on payments lets a retry after a crash (payment row written, no
  // stored response) take up the same pending row instead of writing a second one.
  await pool.query(`CREATE SCHEMA IF NOT EXISTS ${SCHEMA}`);
  await pool.query(`CREATE TABLE IF NOT EXISTS ${T_PAYMENTS} (
      id BIGSERIAL PRIMARY KEY,
      account TEXT NOT NULL,
      idempotency_key TEXT NOT NULL,
      amount BIGINT NOT NULL,
      currency TEXT NOT NULL,
      charge_id TEXT,
      status TEXT NOT NULL DEFAULT 'pending',
      created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
      UNIQUE (account, idempotency_key))`);
  await pool.query(`CREATE TABLE IF NOT EXISTS ${T_KEYS} (
      account TEXT NOT NULL,
      idempotency_key TEXT NOT NULL,
      request_hash TEXT NOT NULL,
      status_code INT NOT NULL,
      headers JSONB NOT NULL,
      body TEXT NOT NULL,
      created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
      PRIMARY KEY (account, idempotency_key))`);
}

function bearer(req) {
  const h = req.get('authorization');
  if (!h || !h.startsWith('Bearer ')) return null;
  const t = h.slice(7).trim();
  return t || null;
}

function apiError(status, type, code, message) {
  return { status, headers: {}, body: JSON.stringify({ error: { code, message, type } }) };
}

function send(res, stored, replayed) {
  res.status(stored.status);
  for (const [k, v] of Object.entries(stored.headers)) res.set(k, v);
  if (replayed) res.set('Idempotent-Replayed', 'true');
  res.type('application/json').send(stored.body);
}

// A stored response is replayed only to the same request (Stripe answers a different body under
// a used key with an error, the Rust layer with 422).
function replayOrMismatch(res, stored, hash) {
  if (stored.hash !== hash) {
    res.status(422).type('application/problem+json').send(JSON.stringify({
      type: 'about:blank', title: 'Idempotency-Key is already used', status: 422,
      detail: 'this key was used with a different request',
    }));
    return;
  }
  send(res, stored, true);
}

async function main() {
  const pool = new Pool({ connectionString: DATABASE_URL, max: POOL_MAX });
  const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 2 });
  // Releases the lock only if it is still ours (it may have expired and been taken since).
  redis.defineCommand('unlock', {
    numberOfKeys: 1,
    lua: "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
  });
  // Keep-alive connections to the provider, as the Rust checkout's reqwest client keeps them.
  const provider = new Agent({ keepAliveTimeout: 30_000, connections: 128 });

  const rkey = (kind, account, key) => `${REDIS_PREFIX}:${kind}:${account.length}:${account}:${key}`;

  async function storedInPg(account, key) {
    const r = await pool.query(
      `SELECT request_hash, status_code, headers, body FROM ${T_KEYS}
        WHERE account = $1 AND idempotency_key = $2`, [account, key]);
    if (r.rowCount === 0) return null;
    const row = r.rows[0];
    return { hash: row.request_hash, status: row.status_code, headers: row.headers, body: row.body };
  }

  async function charge(account, key, p) {
    const r = await request(`${PROVIDER_URL}/v1/charges`, {
      method: 'POST',
      dispatcher: provider,
      headersTimeout: PROVIDER_TIMEOUT_MS,
      bodyTimeout: PROVIDER_TIMEOUT_MS,
      headers: {
        authorization: `Bearer ${account}`,
        'idempotency-key': key,
        'content-type': 'application/json',
      },
      body: JSON.stringify(p),
    });
    const text = await r.body.text();
    return { status: r.statusCode, body: text };
  }

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.use(express.json());

  app.post('/v1/payments', async (req, res, next) => {
    const account = bearer(req);
    const key = req.get('idempotency-key');
    if (!account) {
      return send(res, apiError(401, 'authentication_error', 'missing', 'send Authorization: Bearer <account>'));
    }
    if (!key || key.length > 255) {
      return send(res, apiError(400, 'invalid_request_error', 'missing', 'bearer and key required'));
    }
    const b = req.body || {};
    const p = { amount: b.amount, currency: b.currency, source: b.source ?? 'tok_visa' };
    if (!Number.isSafeInteger(p.amount) || p.amount <= 0 || typeof p.currency !== 'string' ||
        p.currency.length !== 3 || typeof p.source !== 'string') {
      return send(res, apiError(400, 'invalid_request_error', 'parameter_invalid',
        'amount must be positive and currency a 3-letter code'));
    }
    const hash = crypto.createHash('sha256').update(JSON.stringify(p)).digest('hex');
    const lockKey = rkey('lock', account, key);
    const respKey = rkey('resp', account, key);
    let token = null;
    try {
      // 1. A completed request is answered from the cache.
      const cached = await redis.get(respKey);
      if (cached) return replayOrMismatch(res, JSON.parse(cached), hash);

      // 2. The lock: one request per (account, key) at a time.
      token = crypto.randomUUID();
      const got = await redis.set(lockKey, token, 'PX', LOCK_MS, 'NX');
      if (got !== 'OK') {
        token = null;
        const done = await redis.get(respKey) || null;
        const stored = done ? JSON.parse(done) : await storedInPg(account, key);
        if (stored) return replayOrMismatch(res, stored, hash);
        res.set('Retry-After', '1');
        return send(res, apiError(409, 'idempotency_error', 'in_progress',
          'a request with this key is in progress; retry later'));
      }

      // 3. PostgreSQL is the record: the cache may have expired or been flushed.
      const stored = await storedInPg(account, key);
      if (stored) {
        await redis.set(respKey, JSON.stringify(stored), 'EX', CACHE_S);
        return replayOrMismatch(res, stored, hash);
      }

      // 4. The payment row, pending (a retry after a crash takes up the same row).
      const ins = await pool.query(
        `INSERT INTO ${T_PAYMENTS} (account, idempotency_key, amount, currency, status)
         VALUES ($1, $2, $3, $4, 'pending')
         ON CONFLICT (account, idempotency_key) DO UPDATE SET status = ${T_PAYMENTS}.status
         RETURNING id`, [account, key, p.amount, p.currency]);
      const paymentId = ins.rows[0].id;

      // 5. The provider, with the same key: running this again replays its charge.
      let c;
      try {
        c = await charge(account, key, p);
      } catch (e) {
        console.warn('provider unreachable:', e.message);
        return send(res, apiError(502, 'api_error', 'provider_unreachable',
          'payment provider unreachable; retry with the same key'));
      }
      let status, chargeId = null, out;
      if (c.status === 200) {
        status = 'succeeded';
        chargeId = JSON.parse(c.body).id;
        const id = `pay_${paymentId}`;
        out = {
          hash, status: 201, headers: { Location: `/v1/payments/${id}` },
          // Keys in the order the Rust checkout's serde_json writes them (sorted).
          body: JSON.stringify({ amount: p.amount, charge: chargeId, currency: p.currency, id, status }),
        };
      } else if (c.status === 402) {
        status = 'declined';
        out = { hash, ...apiError(402, 'card_error', 'card_declined', 'Your card was declined.') };
      } else {
        // Not final: nothing stored, the lock is released, a retry runs again.
        console.warn('provider refused:', c.status);
        return send(res, apiError(502, 'api_error', 'provider_error',
          'payment provider failed; retry with the same key'));
      }

      // 6. The payment's outcome and the stored response, one commit.
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await client.query(
          `UPDATE ${T_PAYMENTS} SET status = $2, charge_id = $3 WHERE id = $1`,
          [paymentId, status, chargeId]);
        await client.query(
          `INSERT INTO ${T_KEYS} (account, idempotency_key, request_hash, status_code, headers, body)
           VALUES ($1, $2, $3, $4, $5, $6)`,
          [account, key, hash, out.status, JSON.stringify(out.headers), out.body]);
        await client.query('COMMIT');
      } catch (e) {
        await client.query('ROLLBACK').catch(() => {});
        throw e;
      } finally {
        client.release();
      }

      // 7. Cache the response and release the lock, one round trip.
      await redis.pipeline()
        .set(respKey, JSON.stringify(out), 'EX', CACHE_S)
        .unlock(lockKey, token)
        .exec();
      token = null;
      return send(res, out, false);
    } catch (e) {
      next(e);
    } finally {
      // Any way out that stored nothing gives the key back, so the retry runs again.
      if (token) redis.unlock(lockKey, token).catch(() => {});
    }
  });

  app.get('/healthz', (_req, res) => res.send('ok'));

  // eslint-disable-next-line no-unused-vars
  app.use((err, _req, res, _next) => {
    console.error(err);
    res.set('Retry-After', '1');
    send(res, apiError(503, 'api_error', 'unavailable', 'try again'));
  });

  const [host, port] = LISTEN.includes(':') ? LISTEN.split(':') : ['127.0.0.1', LISTEN];
  const server = app.listen(Number(port), host, () => {
    console.log(`express checkout listening on ${host}:${port} (pid ${process.pid}, pool ${POOL_MAX})`);
  });
  server.keepAliveTimeout = 65_000;
  const stop = () => server.close(async () => {
    await pool.end().catch(() => {});
    redis.disconnect();
    process.exit(0);
  });
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (WORKERS > 1 && cluster.isPrimary) {
  // The tables once, then the workers (who share the listening socket).
  (async () => {
    const pool = new Pool({ connectionString: DATABASE_URL, max: 1 });
    await migrate(pool);
    await pool.end();
    for (let i = 0; i < WORKERS; i++) cluster.fork();
    const stop = () => { for (const w of Object.values(cluster.workers)) w.kill('SIGTERM'); };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
    cluster.on('exit', () => { if (Object.keys(cluster.workers).length === 0) process.exit(0); });
  })().catch((e) => { console.error(e); process.exit(1); });
} else if (WORKERS > 1) {
  main().catch((e) => { console.error(e); process.exit(1); });
} else {
  (async () => {
    const pool = new Pool({ connectionString: DATABASE_URL, max: 1 });
    await migrate(pool);
    await pool.end();
    await main();
  })().catch((e) => { console.error(e); process.exit(1); });
}
