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
