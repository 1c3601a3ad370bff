'use strict';
// A connection the server ends while the library holds it (a restart, pg_terminate_backend):
// the process lives, the call fails with ConnectionLostError, the client is discarded and the
// next call works.  The HTTP side (503, then the retry runs) is in http.test.js.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const idempo = require('..');

test('once(): its connection ended by the server while the function awaits: typed error, the process lives, the next call works', () => {
  const r = spawnSync(process.execPath, [path.join(__dirname, 'lost', 'once.js')], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 0, `the process died (exit ${r.status}, signal ${r.signal}):\n${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  assert.equal(out.error, 'ConnectionLostError');
  assert.equal(out.typed, true);
  assert.equal(out.idempo, true);
  assert.match(out.cause, /terminating connection due to administrator command|Connection terminated/);
  assert.equal(out.sameClient, true, 'the client an earlier once() used');
  assert.equal(out.storedAfterLoss, null, 'nothing was claimed');
  assert.deepEqual(out.next, { n: 2 });
  assert.equal(out.replayed, false);
});

test("the application's own checkout of a client once() used: its connection ended, the process ends as without idempo", () => {
  // the guard once() leaves on a pool client must not swallow the error of a client the
  // application holds without a listener (node-postgres: the process ends, and the bug shows)
  const r = spawnSync(process.execPath, [path.join(__dirname, 'lost', 'own.js')], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(r.stdout.trim(), 'lived', 'the error was swallowed');
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /Unhandled 'error' event/);
  assert.match(r.stderr, /terminating connection due to administrator command/);
});

test("a pool client whose 'error' listeners the application removed: once() guards it again (ConnectionLostError, the process lives)", () => {
  for (const how of ['error', 'all']) {
    const r = spawnSync(process.execPath, [path.join(__dirname, 'lost', 'removed.js'), how], { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 0, `removeAllListeners(${how === 'all' ? '' : "'error'"}): ${r.stderr}`);
    assert.deepEqual(JSON.parse(r.stdout.trim()), { error: 'ConnectionLostError', next: 2 });
  }
});

test("once() leaves one 'error' guard on a pool client, however many transactions ran on it", async () => {
  const { newPool, newScope } = require('./helpers');
  const pool = newPool({ max: 1 });
  pool.on('error', () => {});
  try {
    const idem = new idempo.Idempo(pool);
    const scope = await newScope(pool, 'guard');
    for (let i = 0; i < 12; i += 1) await idem.once(scope, `k-${i}`, async () => ({ i }));
    const client = await pool.connect();       // the one client those transactions ran on
    try {
      assert.ok(client.listenerCount('error') <= 1, `${client.listenerCount('error')} 'error' listeners on the client`);
    } finally {
      client.release();
    }
  } finally {
    await pool.end();
  }
});

test('connection errors are told apart from refusals', () => {
  const sql = (code) => Object.assign(new Error(`sqlstate ${code}`), { code });
  for (const err of [sql('57P01'), sql('57P03'), sql('08006'), Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }),
    new Error('Connection terminated unexpectedly'), new Error('Client has encountered a connection error and is not queryable')]) {
    assert.ok(idempo.isConnectionError(err), err.message);
    const typed = idempo.fromDatabaseError(err, 's', 'k');
    assert.ok(typed instanceof idempo.ConnectionLostError && typed.cause === err && typed.scope === 's', err.message);
  }
  for (const err of [sql('55000'), sql('23505'), new Error('boom'), null]) assert.equal(idempo.isConnectionError(err), false);
});

test('middleware: a claim that cannot reach the database answers 503 + Retry-After (both modes), nothing claimed', async () => {
  const { beginRequest } = require('../lib/http');
  const refused = Object.assign(new Error('connect ECONNREFUSED /run/postgresql/.s.PGSQL.5432'), { code: 'ECONNREFUSED' });
  const fail = async () => { throw refused; };
  const adapter = { kind: 'pg', handle: null, inTransaction: false, query: fail, transaction: fail, bind() { return this; } };
  const idem = new idempo.Idempo(adapter);
  const view = {
    headerValues: (name) => (name === 'idempotency-key' ? ['k-1'] : undefined), body: { a: 1 }, method: 'POST',
    path: '/orders', contentType: 'application/json',
  };
  for (const mode of ['transaction', 'lease']) {
    const begun = await beginRequest(idem, { scope: 'shop.orders', mode }, {}, view);
    assert.equal(begun.answer && begun.answer.status, 503, mode);
    assert.equal(begun.answer.headers['retry-after'], '1');
    assert.equal(JSON.parse(begun.answer.body).type, 'https://idempo.dev/problems#database-unavailable');
  }
  // once the version is known, the claim's own failure answers the same
  idem.root.versionOk = true;
  idem.root.versionChecked = Promise.resolve('0.3.0');
  for (const mode of ['transaction', 'lease']) {
    const begun = await beginRequest(idem, { scope: 'shop.orders', mode }, {}, view);
    assert.equal(begun.answer && begun.answer.status, 503, mode);
  }
});
