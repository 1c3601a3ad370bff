'use strict';
// Tests for server.js over real HTTP on loopback, against a real database (PGHOST, PGPORT,
// PGDATABASE, PGUSER; schema.sql loaded).  Starts the service as a child process and a stand-in
// payment provider (a small HTTP server that honours Idempotency-Key, as real ones do).
// Prints "ok - ..." / "not ok - ..." per case and, last, "N passed, N failed".
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const http = require('node:http');
const path = require('node:path');
const { Client } = require('pg');
const { request } = require('./client');
const { paramsOf } = require('idempo/http');

let passed = 0;
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed += 1;
    console.log(`ok - ${name}`);
  } catch (err) {
    failed += 1;
    console.log(`not ok - ${name}\n  ${String(err.stack).replace(/\n/g, '\n  ')}`);
  }
}

// Polls a condition instead of sleeping and hoping.
async function waitFor(what, condition, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// The outside system of POST /payments.  gate holds calls; failNext answers 503.
function startProvider() {
  const state = { charges: new Map(), callsByKey: new Map(), waiting: 0, failNext: 0, gate: null };
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', async () => {
      const key = req.headers['idempotency-key'];
      state.callsByKey.set(key, (state.callsByKey.get(key) ?? 0) + 1);
      if (state.gate) {
        state.waiting += 1;
        await state.gate.opened;
        state.waiting -= 1;
      }
      if (state.failNext > 0) {
        state.failNext -= 1;
        res.writeHead(503).end();
        return;
      }
      if (!state.charges.has(key)) state.charges.set(key, { id: `ch_${crypto.randomUUID()}` });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(state.charges.get(key)));
    });
  });
  const closeGate = () => {
    let open;
    state.gate = { opened: new Promise((resolve) => { open = resolve; }) };
    return () => { state.gate = null; open(); };
  };
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, state, closeGate })));
}

// Starts server.js and resolves with its base URL once it prints "listening on ...".
function startService(providerUrl) {
  const child = spawn(process.execPath, [path.join(__dirname, 'server.js')], {
    env: { ...process.env, PROVIDER_URL: providerUrl, HTTP_PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the service did not start')), 15000);
    child.on('exit', (code) => reject(new Error(`the service exited (${code})`)));
    child.stdout.setEncoding('utf8').on('data', (text) => {
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(text);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1] });
      }
    });
  });
}

// Starts server.js with the environment changed by env; resolves with its exit code and stderr.
function startBroken(env) {
  const child = spawn(process.execPath, [path.join(__dirname, 'server.js')], {
    env: { ...process.env, HTTP_PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stderr.setEncoding('utf8').on('data', (text) => { stderr += text; });
  child.stdout.setEncoding('utf8').on('data', (text) => { stdout += text; });
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill(), 15000);
    child.on('exit', (code) => { clearTimeout(timer); resolve({ code, stderr, stdout }); });
  });
}

async function main() {
  await check('start-up with no database at PGHOST: exits 1 at once, saying where it tried', async () => {
    const r = await startBroken({ PGHOST: '/nonexistent-socket-dir' });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /cannot use the database \(host=\/nonexistent-socket-dir /);
    assert.doesNotMatch(r.stdout, /listening/);
  });

  await check('start-up against a database without schema.sql: exits 1, naming what is missing', async () => {
    const r = await startBroken({ PGDATABASE: 'postgres' });
    assert.equal(r.code, 1);
    // PostgreSQL 15 names the missing schema, 17 and later the relation
    assert.match(r.stderr, /(schema "shop"|relation "shop\.orders") does not exist[\s\S]*load schema\.sql/);
  });

  const db = new Client();
  await db.connect();
  const provider = await startProvider();
  const providerUrl = `http://127.0.0.1:${provider.server.address().port}`;
  let service = await startService(providerUrl);
  process.on('exit', () => service.child.kill());     // never leave the service behind
  const one = async (sql, args = []) => Object.values((await db.query(sql, args)).rows[0] ?? {})[0];
  const post = (target, body, key, headers = {}) => request(service.url + target, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const ordersOf = (customer) => one('SELECT count(*)::int FROM shop.orders WHERE customer = $1', [customer]);
  const statusOf = (scope, key) => one('SELECT status::text FROM idempo.lookup($1, $2)', [scope, key]);
  const newKey = () => crypto.randomUUID();

  try {
    const key = newKey();
    const order = { customer: 'ada', sku: 'A-7', qty: 2 };
    let first;

    await check('first POST /orders: 201 with the order, not marked as replayed', async () => {
      first = await post('/orders', order, key);
      assert.equal(first.status, 201);
      assert.deepEqual({ ...JSON.parse(first.body), id: undefined }, { ...order, id: undefined });
      assert.equal(typeof JSON.parse(first.body).id, 'number');     // as in the docs and the Python service
      assert.equal(first.headers.location, undefined);               // there is no GET /orders/{id}
      assert.equal(first.headers['idempotent-replayed'], undefined);
    });

    await check('retry, same body reordered and reformatted: same status and body, Idempotent-Replayed, one order', async () => {
      const again = await post('/orders', '{ "qty": 2.0, "sku": "A-7",\n  "customer": "ada" }', key);
      assert.equal(again.status, 201);
      assert.equal(again.body, first.body);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(await ordersOf('ada'), 1);
    });

    await check('the draft\'s quoted form "key" names the same key as the bare form', async () => {
      const again = await post('/orders', order, `"${key}"`);
      assert.equal(again.status, 201);
      assert.equal(again.headers['idempotent-replayed'], 'true');
    });

    await check('same key, different body: 422, conflict recorded, still one order', async () => {
      const changed = await post('/orders', { ...order, qty: 5 }, key);
      assert.equal(changed.status, 422);
      assert.equal(changed.headers['content-type'], 'application/problem+json');
      assert.equal(await one("SELECT count(*)::int FROM idempo.conflicts WHERE scope = 'http.orders' AND key = $1", [key]), 1);
      assert.equal(await ordersOf('ada'), 1);
    });

    await check('same key and body on another path (a query string): 422', async () => {
      assert.equal((await post('/orders?coupon=x', order, key)).status, 422);
    });

    await check('missing key: 400, nothing written', async () => {
      const missing = await post('/orders', { customer: 'nokey', sku: 'A-7', qty: 1 });
      assert.equal(missing.status, 400);
      assert.match(JSON.parse(missing.body).type, /#missing-key$/);
      assert.equal(await ordersOf('nokey'), 0);
    });

    await check('malformed keys (too long, empty, non-ASCII, bad quoting, two headers): 400', async () => {
      for (const bad of ['k'.repeat(256), '', '""', 'kéy', '"unterminated', [newKey(), newKey()]]) {
        const answer = await post('/orders', { customer: 'badkey', sku: 'A-7', qty: 1 }, bad);
        assert.equal(answer.status, 400, `key ${JSON.stringify(bad).slice(0, 40)}`);
      }
      assert.equal((await post('/orders', { customer: 'badkey', sku: 'A-7', qty: 1 }, 'k'.repeat(255))).status, 201);
    });

    await check('invalid requests (bad JSON, \\u0000, text/plain, bad order) are refused before the claim: the key stays unused', async () => {
      const k = newKey();
      assert.equal((await post('/orders', '{"customer": "bo",', k)).status, 400);
      assert.equal((await post('/orders', 'customer=bo', k, { 'content-type': 'text/plain' })).status, 415);
      assert.equal((await post('/orders', { customer: 'bo', sku: 'A-7', qty: 0 }, k)).status, 400);
      assert.equal((await post('/orders', '{"customer": "bo\\u0000", "sku": "A-7", "qty": 1}', k)).status, 400);
      assert.equal(await statusOf('http.orders', k), null);
      assert.equal((await post('/orders', { customer: 'bo', sku: 'A-7', qty: 1 }, k)).status, 201);
    });

    await check('a retry while the first request is still in its transaction: 409, then the first commits once', async () => {
      const k = newKey();
      const body = { customer: 'cy', sku: 'A-7', qty: 1 };
      const locker = new Client();
      await locker.connect();
      try {
        await locker.query('BEGIN');
        await locker.query('LOCK TABLE shop.orders IN SHARE MODE');      // the first request's INSERT waits
        const firstCall = post('/orders', body, k);
        firstCall.catch(() => {});         // awaited below; do not crash if it fails meanwhile
        await waitFor('the first request to wait inside its transaction', async () => await one(
          `SELECT count(*)::int FROM pg_stat_activity WHERE application_name = 'idempo-http-node'
             AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO shop.orders%'`) === 1);
        const retry = await post('/orders', body, k);
        assert.equal(retry.status, 409);
        assert.equal(retry.headers['retry-after'], '1');
        await locker.query('COMMIT');
        assert.equal((await firstCall).status, 201);
      } finally {
        await locker.end();
      }
      const later = await post('/orders', body, k);
      assert.equal(later.status, 201);
      assert.equal(later.headers['idempotent-replayed'], 'true');
      assert.equal(await ordersOf('cy'), 1);
    });

    await check('a handler error rolls the claim back with the transaction: 500, key free, the retry creates one order', async () => {
      const k = newKey();
      const body = { customer: 'dee', sku: 'A-7', qty: 1 };
      await db.query(`CREATE FUNCTION shop.simulated_failure() RETURNS trigger LANGUAGE plpgsql
                      AS $$BEGIN RAISE EXCEPTION 'simulated failure'; END$$`);
      await db.query(`CREATE TRIGGER simulated_failure BEFORE INSERT ON shop.orders FOR EACH ROW
                      WHEN (NEW.customer = 'dee') EXECUTE FUNCTION shop.simulated_failure()`);
      try {
        assert.equal((await post('/orders', body, k)).status, 500);
        assert.equal(await statusOf('http.orders', k), null);
      } finally {
        await db.query('DROP FUNCTION shop.simulated_failure() CASCADE');
      }
      const retry = await post('/orders', body, k);
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], undefined);
      assert.equal(await ordersOf('dee'), 1);
    });

    const payments = (orderId) => one('SELECT count(*)::int FROM shop.payments WHERE order_id = $1', [orderId]);
    const providerKey = (k) => `http.payments/${k}`;

    await check('two transactions, POST /payments: 201, a retry replays, one charge and one payment', async () => {
      const k = newKey();
      const body = { order_id: 101, amount_cents: 1250 };
      const paid = await post('/payments', body, k);
      assert.equal(paid.status, 201);
      assert.deepEqual({ ...JSON.parse(paid.body), id: 0, charge_id: '' }, { ...body, id: 0, charge_id: '' });
      assert.equal(typeof JSON.parse(paid.body).id, 'number');
      assert.equal(paid.headers.location, undefined);
      const again = await post('/payments', body, k);
      assert.equal(again.status, 201);
      assert.equal(again.body, paid.body);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(provider.state.callsByKey.get(providerKey(k)), 1);
      assert.equal(await payments(101), 1);
    });

    await check('a retry while the provider call is in flight (committed claim, live lease): 409', async () => {
      const k = newKey();
      const body = { order_id: 102, amount_cents: 990 };
      const open = provider.closeGate();
      let firstCall;
      try {
        firstCall = post('/payments', body, k);
        firstCall.catch(() => {});         // awaited below; do not crash if it fails meanwhile
        await waitFor('the provider call to be in flight', () => provider.state.waiting === 1);
        assert.equal(await statusOf('http.payments', k), 'in_progress');
        assert.equal((await post('/payments', body, k)).status, 409);
        assert.equal((await post('/payments', { ...body, amount_cents: 1 }, k)).status, 422);
      } finally {
        open();
      }
      assert.equal((await firstCall).status, 201);
      assert.equal((await post('/payments', body, k)).headers['idempotent-replayed'], 'true');
      assert.equal(await payments(102), 1);
    });

    await check('the provider fails: 502, fail(retryable) frees the key, the retry succeeds as attempt 2', async () => {
      const k = newKey();
      const body = { order_id: 103, amount_cents: 500 };
      provider.state.failNext = 1;
      assert.equal((await post('/payments', body, k)).status, 502);
      assert.equal(await statusOf('http.payments', k), 'retryable');
      assert.equal(await payments(103), 0);
      const retry = await post('/payments', body, k);
      assert.equal(retry.status, 201);
      assert.equal(await one("SELECT attempt FROM idempo.lookup('http.payments', $1)", [k]), 2);
      assert.equal(await payments(103), 1);
    });

    await check('the provider fails max_attempts (5) times: the key goes to review, 409 from then on', async () => {
      const k = newKey();
      const body = { order_id: 106, amount_cents: 300 };
      provider.state.failNext = 5;
      for (let i = 1; i <= 5; i += 1) assert.equal((await post('/payments', body, k)).status, 502, `attempt ${i}`);
      const stuck = await post('/payments', body, k);
      assert.equal(stuck.status, 409);
      assert.match(JSON.parse(stuck.body).type, /#key-in-review$/);
      assert.equal(await statusOf('http.payments', k), 'in_review');
      assert.equal(await payments(106), 0);
    });

    await check('an error after the provider call: 500, fail(retryable); the retry gets the same charge, one payment', async () => {
      const k = newKey();
      const body = { order_id: 104, amount_cents: 4242 };
      await db.query(`CREATE FUNCTION shop.simulated_failure() RETURNS trigger LANGUAGE plpgsql
                      AS $$BEGIN RAISE EXCEPTION 'simulated failure'; END$$`);
      await db.query(`CREATE TRIGGER simulated_failure BEFORE INSERT ON shop.payments FOR EACH ROW
                      WHEN (NEW.order_id = 104) EXECUTE FUNCTION shop.simulated_failure()`);
      try {
        assert.equal((await post('/payments', body, k)).status, 500);
        assert.equal(await statusOf('http.payments', k), 'retryable');
      } finally {
        await db.query('DROP FUNCTION shop.simulated_failure() CASCADE');
      }
      const retry = await post('/payments', body, k);
      assert.equal(retry.status, 201);
      assert.equal(JSON.parse(retry.body).charge_id, provider.state.charges.get(providerKey(k)).id);
      assert.equal(provider.state.callsByKey.get(providerKey(k)), 2);
      assert.equal(await payments(104), 1);
    });

    await check('the service dies during the provider call: after the lease the retry takes over as attempt 2, one payment', async () => {
      const k = newKey();
      const body = { order_id: 105, amount_cents: 700 };
      await db.query("SELECT idempo.alter_scope('http.payments', lease => '1 second')");   // for this claim
      const open = provider.closeGate();
      try {
        post('/payments', body, k).catch(() => {});       // its connection dies with the service
        await waitFor('the provider call to be in flight', () => provider.state.waiting === 1);
        service.child.kill('SIGKILL');
        service = await startService(providerUrl);
      } finally {
        open();                                           // the provider charges: the reply is lost
        await db.query("SELECT idempo.alter_scope('http.payments', lease => '30 seconds')");
      }
      // (the background worker may already have taken the expired lease: retryable, no lease)
      await waitFor('the lease to run out', async () => await one(
        "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() " +
        "FROM idempo.lookup('http.payments', $1)", [k]));
      // A client retries a 409 "in use" after its Retry-After: the background worker may hold the
      // record for a moment while it moves the expired lease on (the claim does not wait).
      let retry;
      for (let i = 0; i < 10; i++) {
        retry = await post('/payments', body, k);
        if (retry.status !== 409 || !JSON.parse(retry.body).type.endsWith('#key-in-use')) break;
        await new Promise((resolve) => setTimeout(resolve, 1000 * Number(retry.headers['retry-after'])));
      }
      assert.equal(retry.status, 201, retry.body);
      assert.equal(await one("SELECT attempt FROM idempo.lookup('http.payments', $1)", [k]), 2);
      assert.equal(JSON.parse(retry.body).charge_id, provider.state.charges.get(providerKey(k)).id);
      assert.equal(provider.state.callsByKey.get(providerKey(k)), 2);
      assert.equal(await payments(105), 1);
    });

    await check('fingerprint: a JSON body by value, any other body by its media type and bytes', async () => {
      // the middleware's fingerprint input (idempo/http), as the library passes it to claim()
      const fingerprint = (body, mediaType) => one("SELECT encode(idempo.fingerprint($1::jsonb), 'hex')",
        [paramsOf({ method: 'POST', path: '/x', contentType: mediaType, rawBody: Buffer.from(body),
          body: mediaType === 'application/json' ? JSON.parse(body) : Buffer.from(body) }).text]);
      assert.equal(await fingerprint('{"a":1,"b":[1,2]}', 'application/json'),
        await fingerprint('{ "b": [1, 2.0], "a": 1.00 }', 'application/json'));
      assert.notEqual(await fingerprint('{"n":12345678901234567890}', 'application/json'),
        await fingerprint('{"n":12345678901234567891}', 'application/json'));
      assert.notEqual(await fingerprint('a=1', 'text/plain'), await fingerprint('a=2', 'text/plain'));
      assert.notEqual(await fingerprint('a=1', 'text/plain'), await fingerprint('a=1', 'text/csv'));
    });
  } finally {
    service.child.kill('SIGTERM');
    provider.server.close();
    await db.end();
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);     // do not wait for the provider's keep-alive sockets
}

main().catch((err) => {
  console.log(`not ok - the test setup\n  ${err.stack}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
