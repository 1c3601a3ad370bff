'use strict';
// new Idempo(client) with one pg Client (not a Pool): its transactions and statements share one
// connection, so the library runs one of its operations at a time on it.  Without that, two
// concurrent once() calls interleave BEGIN/COMMIT on the connection (one transaction, and one
// caller's rollback takes the other's claim and work with it), and a callOnce claim sent while a
// once() transaction is open is not committed before the call.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const idempo = require('..');
const { newPool, newScope, sleep, newKey, Client } = require('./helpers');

let pool;
let client;
before(async () => {
  pool = newPool({ max: 2 });
  client = new Client();
  await client.connect();
});
after(async () => { await client.end(); await pool.end(); });

test('one pg Client: concurrent once() calls are separate transactions; a throw rolls back only its own', async () => {
  const scope = await newScope(pool, 'client.once');
  const idem = new idempo.Idempo(client);
  const [ka, kb] = [newKey(), newKey()];
  const a = idem.once(scope, ka, { params: { n: 1 } }, async () => { await sleep(300); return 'a'; });
  const b = idem.once(scope, kb, { params: { n: 2 } }, async () => { await sleep(50); throw new Error('b fails'); });
  const [ra, rb] = await Promise.allSettled([a, b]);
  assert.equal(rb.status, 'rejected');
  assert.equal(rb.reason.message, 'b fails');
  assert.equal(ra.status, 'fulfilled', ra.reason && ra.reason.message);
  assert.equal(ra.value.result, 'a');
  assert.equal((await idem.lookup(scope, ka)).status, 'succeeded');
  assert.equal(await idem.lookup(scope, kb), null);
});

test('one pg Client: the library called again inside once()\'s function runs in its turn (no wait for itself)', async () => {
  const scope = await newScope(pool, 'client.reenter');
  const idem = new idempo.Idempo(client);
  const key = newKey();
  const done = await idem.once(scope, key, {}, async () => (await idem.lookup(scope, key)).status);
  assert.equal(done.result, 'in_progress');
});
