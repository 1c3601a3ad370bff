'use strict';
// Express and Fastify: a client that goes away before the reply.  A handler that never replies (or an
// Express 4 async handler that threw, which Express 4 leaves hanging) must not keep the lease's
// heartbeat going forever, nor hold an open transaction and its pool client.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const idempo = require('..');
const { idempotency } = require('../express');
const { newPool, newScope, newKey, sleep, waitFor } = require('./helpers');

let pool;
before(async () => {
  pool = newPool({ max: 4 });
  await pool.query('CREATE TABLE IF NOT EXISTS disconnect_orders (key text PRIMARY KEY)');
});
after(async () => {
  await pool.end();
  // without the fix a heartbeat timer and a held pool client keep this process alive: end it
  // (the failures are reported by then) rather than wait for the runner's timeout
  setTimeout(() => process.exit(), 1000).unref();
});

// POST with the key, then close the connection once the handler has started
async function postAndHangUp(port, key, started) {
  const req = http.request({ port, method: 'POST', path: '/x', headers: { 'content-type': 'application/json', 'idempotency-key': key } });
  req.on('error', () => {});
  req.end('{}');
  await started;
  req.destroy();
}

async function serve(options, handler, framework = 'express') {
  const idemPool = newPool({ max: 2 });
  const idem = new idempo.Idempo(idemPool, { log: { error() {} } });
  if (framework === 'fastify') {
    const app = require('fastify')();
    await app.register(require('../fastify'), { idem });
    app.post('/x', { config: { idempotency: options } }, (req) => handler(req));
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { idemPool, port: app.server.address().port, close: async () => {
      app.server.closeAllConnections();
      await Promise.race([app.close(), sleep(1000)]);
      await Promise.race([idemPool.end(), sleep(1000)]);
    } };
  }
  const app = express();
  app.use(express.json());
  app.post('/x', idempotency(idem, options), handler);
  const server = app.listen(0);
  await new Promise((resolve) => server.once('listening', resolve));
  return { idemPool, port: server.address().port, close: async () => {
    server.close();
    await Promise.race([idemPool.end(), sleep(1000)]);   // a client still held: do not wait for it
  } };
}

const leaseOf = async (scope, key) => (await pool.query(
  'SELECT lease_expires_at::text AS t FROM idempo.lookup($1, $2)', [scope, key])).rows[0].t;

for (const framework of ['express', 'fastify']) {
test(`${framework}, lease mode: the client hangs up, the heartbeat stops and the transaction rolls back`, async () => {
  const scope = await newScope(pool, 'disconnect.lease', "lease => '1 second'");
  let started;
  const handlerStarted = new Promise((resolve) => { started = resolve; });
  let aborted = false;
  const svc = await serve({ scope, mode: 'lease' }, async (req) => {
    req.idempotency.signal.addEventListener('abort', () => { aborted = true; });
    const tx = await req.idempotency.transaction();
    await tx.query('INSERT INTO disconnect_orders (key) VALUES ($1)', [req.idempotency.key]);
    started();
    return new Promise(() => {});            // never replies
  }, framework);
  try {
    const key = newKey();
    await postAndHangUp(svc.port, key, handlerStarted);
    await waitFor('the signal to abort', () => aborted, 5000);
    await waitFor('the pool client released', () => svc.idemPool.idleCount === svc.idemPool.totalCount, 5000);
    const before = await leaseOf(scope, key);
    await sleep(1500);                        // the heartbeat (every third of 1 s) would have renewed it
    const now = await leaseOf(scope, key);     // null: the sweeper found the lease over
    assert.ok(now === before || now === null, `the lease is no longer extended: ${before} -> ${now}`);
    assert.equal((await pool.query('SELECT count(*)::int AS n FROM disconnect_orders WHERE key = $1', [key])).rows[0].n, 0);
  } finally {
    await svc.close();
  }
});

test(`${framework}, transaction mode: the client hangs up, the claim and the writes roll back, the key is free`, async () => {
  const scope = await newScope(pool, 'disconnect.tx');
  let started;
  const handlerStarted = new Promise((resolve) => { started = resolve; });
  const svc = await serve({ scope }, async (req) => {
    await req.idempotency.tx.query('INSERT INTO disconnect_orders (key) VALUES ($1)', [req.idempotency.key]);
    started();
    return new Promise(() => {});            // never replies
  }, framework);
  try {
    const key = newKey();
    await postAndHangUp(svc.port, key, handlerStarted);
    await waitFor('the pool client released', () => svc.idemPool.idleCount === svc.idemPool.totalCount, 5000);
    assert.equal((await pool.query('SELECT (idempo.lookup($1, $2)).status AS s', [scope, key])).rows[0].s, null);
    assert.equal((await pool.query('SELECT count(*)::int AS n FROM disconnect_orders WHERE key = $1', [key])).rows[0].n, 0);
  } finally {
    await svc.close();
  }
});
}
