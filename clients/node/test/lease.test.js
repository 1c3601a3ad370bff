'use strict';
// A lease given to the claim (callOnce's `lease`, the middleware's `lease`) is the lease the
// heartbeat keeps: idempo.heartbeat(extend => NULL) extends by the scope's lease and never
// shortens one, so a heartbeat without the claim's lease lets the attempt lose its key at the
// end of the claimed lease, mid-call.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const idempo = require('..');
const { Exchange } = require('../lib/http');
const { newPool, newScope, sleep, newKey } = require('./helpers');

let pool;
let idem;
before(() => {
  pool = newPool({ max: 5 });
  idem = new idempo.Idempo(pool, { log: { error() {} } });
});
after(() => pool.end());

// ms left of the key's lease by the database's clock
async function leftOf(scope, key) {
  const { rows: [r] } = await pool.query(
    'SELECT (extract(epoch FROM lease_expires_at - now()) * 1000)::float8 AS ms FROM idempo.lookup($1, $2)', [scope, key]);
  return Number(r.ms);
}

test('callOnce with lease longer than the scope\'s: the heartbeat keeps that lease past its first end', async () => {
  const scope = await newScope(pool, 'lease.co', "lease => '1 second'");
  const key = newKey();
  let seen;
  let left;
  let aborted = false;
  const done = await idem.callOnce(scope, key, {
    lease: '3 seconds',
    call: async ({ signal }) => {
      signal.addEventListener('abort', () => { aborted = true; });
      await sleep(4500);                                        // past the claimed lease's first end
      seen = await idem.claim(scope, key, { wait: false });     // another worker, mid-call
      left = await leftOf(scope, key);
      return 'charged';
    },
  });
  assert.equal(aborted, false);
  assert.equal(seen.outcome, 'busy');
  assert.equal(seen.status, 'in_progress');
  assert.ok(left > 1500, `the lease held is the claimed one (3 s, renewed at a third), not the scope's: ${left} ms left`);
  assert.equal(done.result, 'charged');
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('middleware lease mode with options.lease: the heartbeat keeps that lease past its first end', async () => {
  const scope = await newScope(pool, 'lease.http', "lease => '1 second'");
  const key = newKey();
  const ex = new Exchange(idem, { mode: 'lease', lease: '3 seconds' }, scope, key, idempo.rawJson('{"method":"POST"}'));
  const begun = await ex.begin();
  assert.ok(begun.acquired);
  let aborted = false;
  begun.acquired.signal.addEventListener('abort', () => { aborted = true; });
  await sleep(4500);
  const seen = await idem.claim(scope, key, { wait: false });
  const left = await leftOf(scope, key);
  await ex.finish(201, { 'content-type': 'text/plain' }, Buffer.from('ok'));
  assert.equal(aborted, false);
  assert.equal(seen.outcome, 'busy');
  assert.ok(left > 1500, `the lease held is options.lease (3 s), not the scope's: ${left} ms left`);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('a heartbeat extend shorter than the claimed lease: beats are timed from the lease held, so it is kept', async () => {
  const scope = await newScope(pool, 'lease.short', "lease => '1 second'");
  const key = newKey();
  let aborted = false;
  let seen;
  const done = await idem.callOnce(scope, key, {
    lease: '3 seconds',
    heartbeat: { extend: '1 second' },
    call: async ({ signal }) => {
      signal.addEventListener('abort', () => { aborted = true; });
      await sleep(4500);
      seen = await idem.claim(scope, key, { wait: false });
      return 'charged';
    },
  });
  assert.equal(aborted, false);
  assert.equal(seen.outcome, 'busy');
  assert.equal(done.result, 'charged');
});

// mode 'lease', a request that ends without a reply (abandon: a framework error, a stream that
// failed): the handler may have called the other system.  By default (onError 'doubt') the
// attempt is left to its lease, then unknown; onError 'retry' fails it retryable, as before.
test('middleware lease mode: abandon leaves the attempt to its lease by default, fails it retryable with onError \'retry\'', async () => {
  const scope = await newScope(pool, 'lease.abandon', "lease => '2 seconds'");
  const params = idempo.rawJson('{"method":"POST"}');
  const doubt = newKey();
  const ex = new Exchange(idem, { mode: 'lease' }, scope, doubt, params);
  assert.ok((await ex.begin()).acquired);
  await ex.abandon(new Error('the connection closed'));
  assert.equal((await idem.lookup(scope, doubt)).status, 'in_progress');
  assert.equal((await idem.claim(scope, doubt, { params, wait: false })).outcome, 'busy');
  await sleep(2100);                                     // the lease runs out, the heartbeat stopped
  assert.equal((await idem.claim(scope, doubt, { params, wait: false })).outcome, 'unknown');
  assert.equal((await idem.lookup(scope, doubt)).status, 'unknown');

  const retry = newKey();
  const ex2 = new Exchange(idem, { mode: 'lease', onError: 'retry' }, scope, retry, params);
  assert.ok((await ex2.begin()).acquired);
  await ex2.abandon(new Error('the connection closed'));
  assert.equal((await idem.lookup(scope, retry)).status, 'retryable');
  const ex3 = new Exchange(idem, { mode: 'lease', onError: 'retry' }, scope, retry, params);
  assert.ok((await ex3.begin()).acquired);
  await ex3.finish(502, {}, Buffer.from('no'));        // a reply not stored: retryable again
  assert.equal((await idem.lookup(scope, retry)).status, 'retryable');
});

test('onError neither \'doubt\' nor \'retry\': a TypeError when the middleware is made, not a guess', async () => {
  const { idempotency } = require('../express');
  const fastifyPlugin = require('../fastify');
  for (const bad of ['Retry', 'fail', null, true]) {
    assert.throws(() => idempotency(idem, { scope: 's', mode: 'lease', onError: bad }), (err) => err instanceof TypeError
      && /onError must be 'doubt'.* or 'retry'/.test(err.message) && err.message.includes(JSON.stringify(bad)));
    assert.throws(() => new Exchange(idem, { mode: 'lease', onError: bad }, 's', 'k', null), TypeError);
  }
  assert.equal(typeof idempotency(idem, { scope: 's', mode: 'lease', onError: 'retry' }), 'function');
  assert.equal(typeof idempotency(idem, { scope: 's', mode: 'lease', onError: 'doubt' }), 'function');
  const app = require('fastify')();
  await assert.rejects(async () => {
    await app.register(fastifyPlugin, { idem, onError: 'retyr' });
    await app.ready();
  }, TypeError);
  const app2 = require('fastify')();
  await app2.register(fastifyPlugin, { idem });
  await assert.rejects(async () => {
    app2.post('/pay', { config: { idempotency: { scope: 's', mode: 'lease', onError: 'again' } } }, async () => 'ok');
    await app2.ready();
  }, /idempo\/fastify \(POST \/pay\): options.onError must be/);
  const app3 = require('fastify')();
  await app3.register(fastifyPlugin, { idem, onError: 'retry' });
  app3.post('/pay', { config: { idempotency: { scope: 's', mode: 'lease' } } }, async () => 'ok');
  await app3.ready();
  await app3.close();
});

// mode 'lease' on Fastify: a route's own preHandler (an auth check) runs after the plugin's
// claim.  A refusal there comes before the handler, which is all that could have called the
// other system: the key is freed (failed retryable), so that the client's retry with its
// credentials mended runs, rather than 409 for the lease and then a key in review.  A refusal
// by the handler itself is still left to the lease (onError 'doubt'): it may have called out.
test('Fastify lease mode: a refusal before the handler frees the key; the handler\'s own is left to its lease', async () => {
  const fastifyPlugin = require('../fastify');
  const scope = await newScope(pool, 'lease.prehandler', "lease => '1 minute'");
  const app = require('fastify')();
  await app.register(fastifyPlugin, { idem });
  let calls = 0;
  const auth = async (request, reply) => {
    if (request.headers.authorization !== 'Bearer ok') return reply.code(401).send({ error: 'log in' });
    return undefined;
  };
  app.post('/pay', { config: { idempotency: { scope, mode: 'lease' } }, preHandler: auth }, async (request, reply) => {
    calls += 1;
    if (request.body && request.body.refuse) return reply.code(403).send({ error: 'the provider said no' });
    return reply.code(201).send({ charged: calls });
  });
  await app.ready();
  const pay = (key, headers, body = {}) => app.inject({
    method: 'POST', url: '/pay', payload: body, headers: { 'idempotency-key': key, ...headers },
  });
  try {
    const key = newKey();
    assert.equal((await pay(key, {})).statusCode, 401);
    assert.equal(calls, 0);
    const refused = await idem.lookup(scope, key);
    assert.equal(refused.status, 'retryable');
    assert.match(refused.error, /HTTP 401 before the handler ran/);
    const mended = await pay(key, { authorization: 'Bearer ok' });
    assert.equal(mended.statusCode, 201);
    assert.equal(calls, 1);
    const done = await idem.lookup(scope, key);
    assert.equal(done.status, 'succeeded');
    assert.equal(done.attempt, 2);

    const own = newKey();
    assert.equal((await pay(own, { authorization: 'Bearer ok' }, { refuse: true })).statusCode, 403);
    assert.equal(calls, 2);
    assert.equal((await idem.lookup(scope, own)).status, 'in_progress');
    assert.equal((await pay(own, { authorization: 'Bearer ok' }, { refuse: true })).statusCode, 409);
    assert.equal(calls, 2);
  } finally {
    await app.close();
  }
});

// The same plugin registered without await (as docs/node.md shows it) and the route added at
// once: Fastify runs onRoute hooks when the route is added, before the plugin has loaded, so the
// route's handler is not wrapped, yet the plugin's preHandler (taken at ready) claims for it.
// The handler ran and called the other system; its refusal must be left to the lease, not taken
// for a refusal before the handler (which frees the key: the retry charges again).
test('Fastify lease mode, plugin registered without await: a handler\'s refusal is left to its lease', async () => {
  const fastifyPlugin = require('../fastify');
  const scope = await newScope(pool, 'lease.noawait', "lease => '1 minute'");
  const app = require('fastify')();
  app.register(fastifyPlugin, { idem });
  let calls = 0;
  app.post('/pay', { config: { idempotency: { scope, mode: 'lease' } } }, async (request, reply) => {
    calls += 1;                                               // the provider charged, then failed
    return reply.code(502).send({ error: 'the provider timed out' });
  });
  await app.ready();
  try {
    const key = newKey();
    const pay = () => app.inject({ method: 'POST', url: '/pay', payload: {}, headers: { 'idempotency-key': key } });
    assert.equal((await pay()).statusCode, 502);
    assert.equal(calls, 1);
    assert.equal((await idem.lookup(scope, key)).status, 'in_progress');
    assert.equal((await pay()).statusCode, 409);
    assert.equal(calls, 1, 'the retry must not call the provider again');
  } finally {
    await app.close();
  }
});
