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
