'use strict';
// The HTTP behaviour table (test/examples/http/README.md, docs/node.md) on Express and Fastify,
// over real HTTP against a real server (test/http/app.js as a child process), with the
// database's rows to prove each business write happened once.
const { describe, test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { newPool, waitFor, newKey, one } = require('./helpers');
const { startProvider, request } = require('./provider');

let pool;
let provider;
let plain;          // a provider that does not deduplicate: a second call is a second charge
before(async () => {
  pool = newPool();
  await pool.query(`CREATE SCHEMA IF NOT EXISTS shop;
    CREATE TABLE IF NOT EXISTS shop.orders (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      customer text NOT NULL, sku text NOT NULL, qty integer NOT NULL CHECK (qty > 0));
    CREATE TABLE IF NOT EXISTS shop.payments (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      order_id integer NOT NULL, amount_cents integer NOT NULL, charge_id text NOT NULL UNIQUE)`);
  provider = await startProvider({ dedupe: true });
  plain = await startProvider();
});
after(async () => {
  provider.server.close();
  plain.server.close();
  await pool.end();
});

function startService(framework, prefix) {
  const child = spawn(process.execPath, [path.join(__dirname, 'http', 'app.js'), framework], {
    env: { ...process.env, PROVIDER_URL: provider.url, PLAIN_PROVIDER_URL: plain.url, SCOPE_PREFIX: prefix },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the service did not start')), 30000);
    child.on('exit', (code) => reject(new Error(`the service exited (${code})`)));
    child.stdout.setEncoding('utf8').on('data', (text) => {
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(text);
      if (m) { clearTimeout(timer); resolve({ child, url: m[1] }); }
    });
  });
}

for (const framework of ['express', 'fastify']) {
  describe(framework, () => {
    const prefix = `http.${framework}.${process.pid}`;
    let service;
    const post = (target, body, key, headers = {}) => request(service.url + target, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }), ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
    const ordersOf = (customer) => one(pool, 'SELECT count(*)::int FROM shop.orders WHERE customer = $1', [customer]);
    const statusOf = (scope, key) => one(pool, 'SELECT status::text FROM idempo.lookup($1, $2)', [scope, key]);
    const c = (name) => `${framework}-${name}-${process.pid}`;

    before(async () => {
      await pool.query(`SELECT idempo.create_scope($1, retention => '24 hours');
                        SELECT idempo.create_scope($2);
                        SELECT idempo.create_scope($3, lease => '5 seconds', on_lease_expiry => 'retry', max_attempts => 5);
                        SELECT idempo.create_scope($4, lease => '3 seconds');
                        SELECT idempo.create_scope($5, lease => '1 second');
                        SELECT idempo.create_scope($6, lease => '1 second', verify_settle => '1 millisecond');
                        SELECT idempo.create_scope($7, lease => '1 hour')`
        .replace(/\$1/, `'${prefix}.orders'`).replace(/\$2/, `'${prefix}.shipments'`).replace(/\$3/, `'${prefix}.payments'`)
        .replace(/\$4/, `'${prefix}.charges'`).replace(/\$5/, `'${prefix}.looked-up'`)
        .replace(/\$6/, `'${prefix}.looked-up-settled'`).replace(/\$7/, `'${prefix}.lookup-fails'`));
      service = await startService(framework, prefix);
    });
    after(() => { service.child.kill(); });

    const key = newKey();
    const order = { customer: c('ada'), sku: 'A-7', qty: 2 };
    let first;

    test('first request: the handler\'s reply (201), not marked as replayed', async () => {
      first = await post('/orders', order, key);
      assert.equal(first.status, 201, first.body);
      assert.equal(JSON.parse(first.body).customer, order.customer);
      assert.equal(first.headers['idempotent-replayed'], undefined);
    });

    test('the same request again (reordered, 2.0): the stored status, headers and body + Idempotent-Replayed: true', async () => {
      const again = await post('/orders', `{ "qty": 2.0, "sku": "A-7", "customer": "${order.customer}" }`, key);
      assert.equal(again.status, 201);
      assert.equal(again.body, first.body);
      assert.equal(again.headers['content-type'], first.headers['content-type']);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(await ordersOf(order.customer), 1);
      const quoted = await post('/orders', order, `"${key}"`);        // the draft's quoted form: the same key
      assert.equal(quoted.headers['idempotent-replayed'], 'true');
    });

    test('the same key with another body or path: 422, recorded in idempo.conflicts, nothing run', async () => {
      const changed = await post('/orders', { ...order, qty: 5 }, key);
      assert.equal(changed.status, 422);
      assert.match(changed.headers['content-type'], /^application\/problem\+json/);
      assert.equal((await post('/orders?coupon=x', order, key)).status, 422);
      assert.equal(await one(pool, 'SELECT count(*)::int FROM idempo.conflicts WHERE scope = $1 AND key = $2', [`${prefix}.orders`, `anonymous/${key}`]), 2);
      assert.equal(await ordersOf(order.customer), 1);
    });

    test('no key, or a malformed one (too long, empty, not visible ASCII, bad quoting, two headers): 400, no claim', async () => {
      const who = c('badkey');
      const missing = await post('/orders', { customer: who, sku: 'A-7', qty: 1 });
      assert.equal(missing.status, 400);
      assert.match(JSON.parse(missing.body).type, /#missing-key$/);
      // 'a, b': two values of a field that admits one (two headers joined by a proxy); 'a b': not visible ASCII
      for (const bad of ['k'.repeat(256), '', '""', 'kéy', '"unterminated', [newKey(), newKey()], 'a, b', 'a,b', 'a b', '"a b"']) {
        const answer = await post('/orders', { customer: who, sku: 'A-7', qty: 1 }, bad);
        assert.equal(answer.status, 400, `key ${JSON.stringify(bad).slice(0, 40)}`);
        assert.match(JSON.parse(answer.body).type, /#malformed-key$/);
      }
      assert.equal(await ordersOf(who), 0);
      assert.equal((await post('/orders', { customer: who, sku: 'A-7', qty: 1 }, 'k'.repeat(255))).status, 201);
    });

    test('a body that fails validation (bad JSON, XML, bad order, \\u0000): 400 / 415, the key stays unused', async () => {
      const k = newKey();
      const who = c('bo');
      assert.equal((await post('/orders', `{"customer": "${who}",`, k)).status, 400);
      assert.equal((await post('/orders', '<customer>bo</customer>', k, { 'content-type': 'application/xml' })).status, 415);
      assert.equal((await post('/orders', { customer: who, sku: 'A-7', qty: 0 }, k)).status, 400);
      assert.equal((await post('/orders', `{"customer": "${who}\\u0000", "sku": "A-7", "qty": 1}`, k)).status, 400);
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k}`), null);
      assert.equal((await post('/orders', { customer: who, sku: 'A-7', qty: 1 }, k)).status, 201);
    });

    test('a JSON body nested deeper than 64 levels: 400 json-too-deep, the key stays unused (the Python middleware\'s limit)', async () => {
      const MAX_JSON_DEPTH = 64;          // lib/http.js, and idempo.http.MAX_JSON_DEPTH
      const k = newKey();
      const order = { customer: c('deep'), sku: 'A-7', qty: 1 };
      // the order object is one level: 'x' holds depth - 1 more
      const nested = (depth) => `${JSON.stringify(order).slice(0, -1)},"x":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`;
      for (const depth of [5000, MAX_JSON_DEPTH + 1]) {
        const r = await post('/orders', nested(depth), k);
        assert.equal(r.status, 400, `${depth}: ${r.body}`);
        assert.match(r.headers['content-type'], /^application\/problem\+json/);
        assert.equal(JSON.parse(r.body).type, 'https://idempo.dev/problems#json-too-deep');
      }
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k}`), null);
      assert.equal((await post('/orders', nested(MAX_JSON_DEPTH), k)).status, 201);
      assert.equal(await ordersOf(order.customer), 1);
      assert.equal(require('../lib/http').MAX_JSON_DEPTH, MAX_JSON_DEPTH);
    });

    test('again while the first is still running: 409 + Retry-After, then the first commits once', async () => {
      const k = newKey();
      const body = { customer: c('cy'), sku: 'A-7', qty: 1 };
      const locker = await pool.connect();
      try {
        await locker.query('BEGIN');
        await locker.query('LOCK TABLE shop.orders IN SHARE MODE');       // the first request's INSERT waits
        const firstCall = post('/orders', body, k);
        firstCall.catch(() => {});
        await waitFor('the first request to wait in its transaction', async () => (await one(pool,
          `SELECT count(*)::int FROM pg_stat_activity WHERE application_name = $1
             AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO shop.orders%'`, [`idempo-http-${framework}`])) === 1);
        const retry = await post('/orders', body, k);
        assert.equal(retry.status, 409);
        assert.equal(retry.headers['retry-after'], '1');
        await locker.query('COMMIT');
        assert.equal((await firstCall).status, 201);
      } finally {
        locker.release();
      }
      assert.equal(await ordersOf(body.customer), 1);
    });

    test('the handler throws (one transaction): 500, nothing stored, the retry runs afresh', async () => {
      const k = newKey();
      const body = { customer: c('flaky'), sku: 'FLAKY', qty: 1 };
      const failed = await post('/orders', body, k);
      assert.equal(failed.status, 500);
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k}`), null);
      assert.equal(await ordersOf(body.customer), 0);
      const retry = await post('/orders', body, k);
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], undefined);
      assert.equal(await ordersOf(body.customer), 1);
    });

    test('the server ends the transaction\'s connection mid-request: 503 + Retry-After, nothing stored, the service lives and the retry runs', async () => {
      const k = newKey();
      const body = { customer: c('lost'), sku: 'LOST', qty: 1 };
      const failed = await post('/orders', body, k);
      assert.equal(failed.status, 503, failed.body);
      assert.equal(failed.headers['retry-after'], '1');
      assert.match(failed.headers['content-type'], /^application\/problem\+json/);
      assert.equal(JSON.parse(failed.body).type, 'https://idempo.dev/problems#database-unavailable');
      assert.equal(service.child.exitCode, null, 'the service is alive');
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k}`), null);
      assert.equal(await ordersOf(body.customer), 0);
      const retry = await post('/orders', body, k);
      assert.equal(retry.status, 201, retry.body);
      assert.equal(await ordersOf(body.customer), 1);
    });

    test('the store rule: a 4xx the handler decided (404) is stored and replayed by default, a 409 is not; with store: 2xx only the 404 is not', async () => {
      const k = newKey();
      const gone = { customer: c('gone'), sku: 'GONE', qty: 1 };
      assert.equal((await post('/orders', gone, k)).status, 404);
      const again = await post('/orders', gone, k);
      assert.equal(again.status, 404);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      // a 4xx that refuses the request (409, 422, 429...) is not stored by default: the retry runs again
      const k3 = newKey();
      const held = { customer: c('held'), sku: 'HELD', qty: 1 };
      assert.equal((await post('/orders', held, k3)).status, 409);
      const heldAgain = await post('/orders', held, k3);
      assert.equal(heldAgain.status, 409);
      assert.equal(heldAgain.headers['idempotent-replayed'], undefined);
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k3}`), null);
      const k2 = newKey();
      assert.equal((await post('/orders-strict', gone, k2)).status, 404);
      assert.equal(await statusOf(`${prefix}.orders`, `anonymous/${k2}`), null);
      const again2 = await post('/orders-strict', gone, k2);
      assert.equal(again2.headers['idempotent-replayed'], undefined);
    });

    test('keys are per tenant: the same key from two tenants is two operations', async () => {
      const k = newKey();
      const body = { customer: c('tenant'), sku: 'A-7', qty: 1 };
      const a = await post('/orders', body, k, { 'x-tenant': 'acme' });
      const b = await post('/orders', body, k, { 'x-tenant': 'globex' });
      const a2 = await post('/orders', body, k, { 'x-tenant': 'acme' });
      assert.equal(a.status, 201);
      assert.equal(b.status, 201);
      assert.equal(b.headers['idempotent-replayed'], undefined);
      assert.equal(a2.headers['idempotent-replayed'], 'true');
      assert.equal(await ordersOf(body.customer), 2);
      assert.equal(await statusOf(`${prefix}.orders`, `acme/${k}`), 'succeeded');
    });

    test('a key from payload fields: the same fields replay, missing fields are 400', async () => {
      const orderId = Math.floor(Math.random() * 1e9);
      const s1 = await post('/shipments', { order_id: orderId, line: 1, note: 'x' });
      assert.equal(s1.status, 201);
      const s2 = await post('/shipments', { order_id: orderId, line: 1, note: 'x' });
      assert.equal(s2.headers['idempotent-replayed'], 'true');
      assert.equal(await statusOf(`${prefix}.shipments`, `${orderId}/1`), 'succeeded');
      assert.equal((await post('/shipments', { order_id: orderId, line: 1, note: 'changed' })).status, 422);
      assert.equal((await post('/shipments', { order_id: orderId })).status, 400);
    });

    test('unknown, in_review, stale, expired: 409, a person decides', async () => {
      const k = newKey();
      const body = { customer: c('review'), sku: 'A-7', qty: 1 };
      assert.equal((await post('/orders', body, k)).status, 201);
      await pool.query('SELECT idempo.request_review($1, $2)', [`${prefix}.orders`, `anonymous/${k}`]);
      const answer = await post('/orders', body, k);
      assert.equal(answer.status, 409);
      assert.match(JSON.parse(answer.body).type, /#key-in-review$/);
    });

    test('a key settled by a person without a stored reply (resolve with a target_ref): 409 settled-without-reply with what is known', async () => {
      // the same answer as the Python middleware (whose replay raised: a 500 on every retry)
      for (const [n, status, ref] of [[0, 'succeeded', `ch_manual_${framework}`], [1, 'failed', null]]) {
        const k = newKey();
        const body = { order_id: 70 + n, amount_cents: 300 };
        const scope = `${prefix}.payments`;
        provider.state.failNext = 1;
        assert.equal((await post('/payments', body, k)).status, 502);       // failed retryable: no result
        await pool.query('SELECT idempo.request_review($1, $2)', [scope, k]);
        await pool.query("SELECT idempo.resolve($1, $2, $3, 'ops@example.com', $4)", [scope, k, status, ref]);
        for (let i = 0; i < 2; i += 1) {
          const answer = await post('/payments', body, k);
          assert.equal(answer.status, 409, answer.body);
          const problem = JSON.parse(answer.body);
          assert.equal(problem.type, 'https://idempo.dev/problems#settled-without-reply');
          assert.deepEqual([problem.operation_status, problem.target_ref], [status, ref]);
        }
      }
    });

    test('50 concurrent duplicates of one request: one execution', async () => {
      const k = newKey();
      const body = { customer: c('fifty'), sku: 'A-7', qty: 1 };
      const answers = await Promise.all(Array.from({ length: 50 }, () => post('/orders', body, k)));
      assert.equal(await ordersOf(body.customer), 1);
      assert.equal(answers.filter((a) => a.status === 201 && !a.headers['idempotent-replayed']).length, 1);
      assert.ok(answers.every((a) => a.status === 201 || (a.status === 409 && a.headers['retry-after'])),
        answers.map((a) => a.status).join(','));
      const after = await post('/orders', body, k);
      assert.equal(after.headers['idempotent-replayed'], 'true');
    });

    test('two transactions (lease): the provider call fails -> 502 and the retry runs as the next attempt', async () => {
      const k = newKey();
      const body = { order_id: 1, amount_cents: 1500 };
      provider.state.failNext = 1;
      const failed = await post('/payments', body, k);
      assert.equal(failed.status, 502);
      assert.equal(await statusOf(`${prefix}.payments`, k), 'retryable');
      const ok = await post('/payments', body, k);
      assert.equal(ok.status, 201, ok.body);
      assert.equal((await pool.query('SELECT attempt FROM idempo.lookup($1, $2)', [`${prefix}.payments`, k])).rows[0].attempt, 2);
      const again = await post('/payments', body, k);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.body, ok.body);
      assert.equal(await one(pool, 'SELECT count(*)::int FROM shop.payments WHERE charge_id = $1', [JSON.parse(ok.body).charge_id]), 1);
    });

    test('lease with the default onError (\'doubt\'): a reply lost after the provider charged is left to its lease, never charged again', async () => {
      const k = newKey();
      const scope = `${prefix}.charges`;
      const body = { amount_cents: 700, fault: 'drop-reply' };     // the provider charges, then the connection is cut
      const lost = await post('/charges', body, k);
      assert.equal(lost.status, 502);                                // not stored...
      assert.equal(await statusOf(scope, k), 'in_progress');        // ...and not failed retryable
      const during = await post('/charges', body, k);               // within the 3 s lease: busy, no second call
      assert.equal(during.status, 409, during.body);
      assert.match(JSON.parse(during.body).type, /#key-in-use$/);
      assert.ok(Number(during.headers['retry-after']) >= 1);
      await waitFor('the lease to run out', async () => (await one(pool,
        // or already swept to unknown (lease_expires_at NULL): the sweeper may come first
        "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)", [scope, k])) === true);
      const after = await post('/charges', body, k);                // unknown: a person or a verifier decides
      assert.equal(after.status, 409, after.body);
      assert.match(JSON.parse(after.body).type, /#key-in-review$/);
      assert.match(JSON.parse(after.body).detail, /unknown/);
      assert.equal(await statusOf(scope, k), 'unknown');
      assert.equal(plain.state.actions.get(`${scope}/${k}`), 1);     // the provider was called once
    });

    test('retries of an unknown key (no lookup) leave the verification lease to the verifier', async () => {
      const k = newKey();
      const scope = `${prefix}.charges`;
      const body = { amount_cents: 800, fault: 'drop-reply' };
      assert.equal((await post('/charges', body, k)).status, 502);
      await waitFor('the lease to run out', async () => (await one(pool,
        "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)", [scope, k])) === true);
      for (let i = 0; i < 3; i += 1) {
        const retry = await post('/charges', body, k);
        assert.equal(retry.status, 409, retry.body);
        assert.match(JSON.parse(retry.body).type, /#key-in-review$/);
      }
      assert.equal(await one(pool, 'SELECT lease_expires_at IS NULL OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)',
        [scope, k]), true, 'a retry took the verification lease');
      const { rows: [verifier] } = await pool.query(
        'SELECT outcome::text, lease_expires_at > idempo.now() AS leased FROM idempo.claim($1, $2)', [scope, k]);
      assert.deepEqual({ ...verifier }, { outcome: 'unknown', leased: true });
    });

    test('options.lookup: a retry of an unknown key looks the charge up and verifies: found, its reply; not found, 409 key-in-doubt', async () => {
      const scope = `${prefix}.looked-up`;
      const unknown = async (k) => waitFor('the lease to run out', async () => (await one(pool,
        "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)", [scope, k])) === true);
      const k = newKey();
      const body = { amount_cents: 900, fault: 'drop-reply' };      // charged, the reply lost
      assert.equal((await post('/charges-looked-up', body, k)).status, 502);
      await unknown(k);
      const found = await post('/charges-looked-up', body, k);
      assert.equal(found.status, 201, found.body);
      assert.equal(JSON.parse(found.body).key, `${scope}/${k}`);
      assert.equal(await statusOf(scope, k), 'succeeded');
      const again = await post('/charges-looked-up', body, k);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.body, found.body);
      assert.equal(plain.state.actions.get(`${scope}/${k}`), 1);     // charged once

      const n = newKey();                                            // never sent: nothing to find
      assert.equal((await post('/charges-looked-up', { amount_cents: 900, fault: 'drop-request' }, n)).status, 502);
      await unknown(n);
      const doubt = await post('/charges-looked-up', { amount_cents: 900, fault: 'drop-request' }, n);
      assert.equal(doubt.status, 409, doubt.body);
      assert.match(JSON.parse(doubt.body).type, /#key-in-doubt$/);  // verify_settle (1 minute) has not passed
      assert.equal(doubt.headers['retry-after'], '7');               // the route's retryAfter
      // one format in both middlewares: ISO 8601, UTC, milliseconds, 'Z'
      assert.match(JSON.parse(doubt.body).settles_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.equal(await statusOf(scope, n), 'unknown');
      assert.equal(await one(pool, 'SELECT lease_expires_at IS NULL FROM idempo.lookup($1, $2)', [scope, n]), true);
      assert.equal(plain.state.actions.get(`${scope}/${n}`), undefined);
    });

    test('options.lookup: nothing found once verify_settle has passed, the retry runs as the next attempt', async () => {
      const scope = `${prefix}.looked-up-settled`;
      const k = newKey();
      plain.state.failNext = 1;                                      // a 503 before anything is charged
      assert.equal((await post('/charges-looked-up-settled', { amount_cents: 900 }, k)).status, 502);
      await waitFor('the lease to run out', async () => (await one(pool,
        "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)", [scope, k])) === true);
      const retry = await post('/charges-looked-up-settled', { amount_cents: 900 }, k);
      assert.equal(retry.status, 201, retry.body);
      assert.equal(await one(pool, 'SELECT attempt FROM idempo.lookup($1, $2)', [scope, k]), 2);
      assert.equal(plain.state.actions.get(`${scope}/${k}`), 1);
    });

    test('options.lookup that fails: 503 lookup-failed, nothing decided, the key held only for the lookupLease', async () => {
      const scope = `${prefix}.lookup-fails`;
      const k = newKey();
      const body = { amount_cents: 900, fault: 'drop-reply' };      // charged, the reply lost
      assert.equal((await post('/charges-lookup-fails', body, k)).status, 502);
      const leaseOver = async () => waitFor('the lease to run out', async () => (await one(pool,
        'SELECT lease_expires_at IS NULL OR lease_expires_at <= idempo.now() FROM idempo.lookup($1, $2)', [scope, k])) === true);
      await leaseOver();
      const failed = await post('/charges-lookup-fails', body, k);
      assert.equal(failed.status, 503, failed.body);
      assert.equal(failed.headers['content-type'], 'application/problem+json');
      assert.equal(JSON.parse(failed.body).code, 'lookup-failed');
      assert.equal(failed.headers['retry-after'], '1');
      assert.equal(await statusOf(scope, k), 'unknown');
      // the verification lease it took is the lookupLease (500 ms), not the attempt's 2 s nor the scope's hour
      assert.equal(await one(pool, "SELECT lease_expires_at <= idempo.now() + interval '0.5 seconds' FROM idempo.lookup($1, $2)",
        [scope, k]), true, 'the verification lease is not the lookupLease');
      await leaseOver();
      const { rows: [verifier] } = await pool.query('SELECT outcome::text FROM idempo.claim($1, $2)', [scope, k]);
      assert.equal(verifier.outcome, 'unknown');                     // the verifier job gets it, not busy
      assert.equal(plain.state.actions.get(`${scope}/${k}`), 1);
    });

    test('the service killed (kill -9) mid-call: 409 until the lease runs out, then the retry runs as the next attempt', async () => {
      const k = newKey();
      const body = { order_id: 2, amount_cents: 2500 };
      let open;
      provider.state.gate = new Promise((resolve) => { open = resolve; });
      const other = await startService(framework, prefix);          // a second instance of the service
      const doomed = post('/payments', body, k);
      doomed.catch(() => {});
      await waitFor('the call to reach the provider', async () => provider.state.waiting === 1);
      const exited = new Promise((resolve) => service.child.once('exit', resolve));
      service.child.kill('SIGKILL');
      await exited;
      provider.state.gate = null;
      open();
      await assert.rejects(doomed);
      service = other;
      const during = await post('/payments', body, k);             // within the 5 s lease
      assert.equal(during.status, 409);
      assert.ok(Number(during.headers['retry-after']) >= 1);
      await waitFor('the lease to run out', async () => (await post('/payments', body, k)).status !== 409, 20000);
      const op = (await pool.query('SELECT status::text, attempt FROM idempo.lookup($1, $2)', [`${prefix}.payments`, k])).rows[0];
      assert.deepEqual(op, { status: 'succeeded', attempt: 2 });
      const chargeId = provider.state.charges.get(`${prefix}.payments/${k}`).id;
      assert.equal(await one(pool, 'SELECT count(*)::int FROM shop.payments WHERE charge_id = $1', [chargeId]), 1);
      assert.equal(provider.state.actions.get(`${prefix}.payments/${k}`), 1);
    });
  });
}
