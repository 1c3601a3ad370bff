'use strict';
// A streamed reply (Fastify: reply.send(stream)) in mode 'transaction': the handler's writes
// and the reply must commit together, as for any other reply.  The middleware reads the stream
// into the stored reply (as the Express middleware does with res.write) rather than roll the
// handler's writes back while the client is told they were made.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Readable } = require('node:stream');
const Fastify = require('fastify');
const idempo = require('..');
const { newPool, newScope, newKey } = require('./helpers');

let pool;
let idem;
before(async () => {
  pool = newPool({ max: 4 });
  idem = new idempo.Idempo(pool, { log: { error() {} } });
  await pool.query('CREATE TABLE IF NOT EXISTS stream_orders (key text PRIMARY KEY)');
});
after(() => pool.end());

test('Fastify: a streamed reply is stored with the handler\'s writes, and replayed', async () => {
  const scope = await newScope(pool, 'stream.fastify');
  const app = Fastify();
  await app.register(require('../fastify'), { idem });
  app.post('/export', { config: { idempotency: { scope } } }, async (req, reply) => {
    await req.idempotency.tx.query('INSERT INTO stream_orders (key) VALUES ($1)', [req.idempotency.key]);
    reply.code(201).header('content-type', 'text/csv');
    return reply.send(Readable.from(['a,b\n', '1,2\n']));
  });
  const key = newKey();
  const ask = () => app.inject({ method: 'POST', url: '/export', headers: { 'idempotency-key': key }, payload: {} });
  const first = await ask();
  assert.equal(first.statusCode, 201);
  assert.equal(first.body, 'a,b\n1,2\n');
  assert.equal((await pool.query('SELECT count(*)::int AS n FROM stream_orders WHERE key = $1', [key])).rows[0].n, 1);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
  const again = await ask();
  assert.equal(again.statusCode, 201);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.body, 'a,b\n1,2\n');
  await app.close();
});

// Express: a handler that replies and then throws (Express 5 passes the rejection to the error
// handler, which replies again while the first reply is being stored).  The client must get the
// reply that was stored, the one a retry replays; sending the error handler's 500 in its place
// told the client of a failure that was in fact committed, and the stored reply's own send then
// threw ERR_HTTP_HEADERS_SENT outside any handler: an unhandled rejection, which ends the process
// (and with it every request in flight, their attempts left to their leases).
for (const mode of ['transaction', 'lease']) {
  test(`Express, mode '${mode}': a handler that throws after replying gets the stored reply sent, not the error handler's`, async () => {
    const express = require('express');
    const { idempotency } = require('../express');
    const scope = await newScope(pool, 'stream.express-late-throw', "lease => '5 seconds'");
    const unhandled = [];
    const onUnhandled = (err) => unhandled.push(err);
    process.on('unhandledRejection', onUnhandled);
    const app = express();
    app.use(express.json());
    app.post('/pay', idempotency(idem, { scope, mode }), async (req, res) => {
      res.status(201).set('x-charge', 'ch_1').json({ charged: true });
      await new Promise((resolve) => setImmediate(resolve));
      throw new Error('after the reply');
    });
    app.use((err, req, res, next) => {     // eslint-disable-line no-unused-vars
      res.status(500).set('x-charge', 'none').json({ title: 'error' });
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.on('listening', resolve));
    try {
      const key = newKey();
      const ask = () => fetch(`http://127.0.0.1:${server.address().port}/pay`, {
        method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{}',
      });
      const first = await ask();
      assert.equal(first.status, 201, 'the reply stored is the reply sent');
      assert.equal(first.headers.get('x-charge'), 'ch_1');
      assert.deepEqual(await first.json(), { charged: true });
      assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
      const again = await ask();
      assert.equal(again.status, 201);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      await new Promise((resolve) => setTimeout(resolve, 50));
      assert.deepEqual(unhandled.map((e) => e.message), []);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      server.close();
    }
  });
}
