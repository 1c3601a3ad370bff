'use strict';
// The core library against a real database: version check, typed errors, claim and the
// one-transaction helper once() in every outcome, within() a caller's transaction.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const idempo = require('..');
const { newPool, newScope, waitFor, newKey, one, Client } = require('./helpers');

let pool;
let idem;
before(async () => {
  pool = newPool();
  idem = new idempo.Idempo(pool);
  await pool.query('CREATE TABLE IF NOT EXISTS core_orders (id serial PRIMARY KEY, k text, qty int)');
});
after(() => pool.end());

// An adapter that counts and can fake what idempo.version() answers.
function countingAdapter(inner, fakeVersion) {
  const a = { ...inner, versionQueries: 0, queries: 0 };
  a.query = async (text, values) => {
    a.queries += 1;
    if (text.includes('idempo.version()')) {
      a.versionQueries += 1;
      if (fakeVersion !== undefined) return [{ version: fakeVersion }];
    }
    return inner.query(text, values);
  };
  return a;
}

test('version: checked once per Idempo at first use, then never again', async () => {
  const a = countingAdapter(idempo.pg(pool));
  const lib = new idempo.Idempo(a);
  const scope = await newScope(pool, 'core.version');
  await lib.claim(scope, newKey(), { completeOnCommit: true });
  await lib.claim(scope, newKey(), { completeOnCommit: true });
  await lib.within(pool).lookup(scope, 'x');
  assert.equal(a.versionQueries, 1);
});

test('version: an unsupported version is refused, naming the one found and the one needed', async () => {
  const lib = new idempo.Idempo(countingAdapter(idempo.pg(pool), '0.4.0'));
  await assert.rejects(lib.claim('any', 'k'), (err) => {
    assert.ok(err instanceof idempo.UnsupportedVersionError);
    assert.ok(err instanceof idempo.IdempoError);
    // the library's version as package.json names it (one source)
    const own = require('../package.json').version.replace(/\./g, '\\.');
    assert.match(err.message, new RegExp(`^idempo 0\\.4\\.0 is installed in this database; idempo for Node\\.js ${own} needs idempo 0\\.3\\.x or 1\\.x`));
    return true;
  });
  const older = new idempo.Idempo(countingAdapter(idempo.pg(pool), '0.2.0'));
  await assert.rejects(older.once('any', 'k', async () => 1), idempo.UnsupportedVersionError);
  // 1.x keeps 0.3.0's API (docs/upgrading.md): 2.0 and 10.0 are refused
  for (const v of ['2.0.0', '10.0.0']) {
    const newer = new idempo.Idempo(countingAdapter(idempo.pg(pool), v));
    await assert.rejects(newer.claim('any', 'k'), idempo.UnsupportedVersionError);
  }
});

// The same strings the Python library's test refuses (clients/python/tests/test_flows.py): one rule
const VERSIONS_REFUSED = ['1', '1.0', '1.0.0-beta', '1.foo', '1.', '1..0', '0.3', '0.3.0-beta', '1.0.0.1',
  '10.0.0', '0.30.0', '2.0.0', '0.2.0', '1.0.0\n', '\u0661.0.0', ''];

test('version: exactly 0.3.x and 1.x are spoken; every other string is refused', async () => {
  for (const v of VERSIONS_REFUSED) {
    const lib = new idempo.Idempo(countingAdapter(idempo.pg(pool), v));
    await assert.rejects(lib.claim('any', 'k'), idempo.UnsupportedVersionError, JSON.stringify(v));
  }
  for (const v of ['0.3.0', '0.3.7', '1.0.0', '1.4.2', '1.10.12']) {
    const lib = new idempo.Idempo(countingAdapter(idempo.pg(pool), v));
    const scope = await newScope(pool, 'core.version');
    assert.equal((await lib.claim(scope, newKey(), { completeOnCommit: true })).outcome, 'acquired', v);
  }
});

test('version: a database without idempo.version() (no idempo, or older than 0.3.0) is refused clearly', async () => {
  const other = new Client({ database: 'postgres' });
  await other.connect();
  try {
    const lib = new idempo.Idempo(other);
    await assert.rejects(lib.claim('any', 'k'), (err) => {
      assert.ok(err instanceof idempo.UnsupportedVersionError, err.stack);
      assert.match(err.message, /no function idempo\.version\(\).*needs idempo 0\.3\.x/);
      return true;
    });
  } finally {
    await other.end();
  }
});

test('errors: SQLSTATEs become classes carrying code, hint, scope and key', async () => {
  await assert.rejects(idem.claim('no.such.scope', 'k1'), (err) => {
    assert.ok(err instanceof idempo.NotFoundError, err.stack);
    assert.equal(err.code, '42704');
    assert.match(err.message, /scope "no\.such\.scope" does not exist/);
    assert.match(err.hint, /create_scope/);
    assert.equal(err.scope, 'no.such.scope');
    assert.equal(err.key, 'k1');
    return true;
  });
  const scope = await newScope(pool, 'core.errors');
  await assert.rejects(idem.claim(scope, ''), (err) => err instanceof idempo.InvalidArgumentError && err.code === '22023');
  await assert.rejects(idem.complete(scope, 'never-claimed', { attempt: 1 }), idempo.NotFoundError);
  await assert.rejects(idem.once(scope, newKey(), { params: { a: 1 }, fingerprint: Buffer.alloc(32) }, async () => 1),
    idempo.InvalidArgumentError);
  // an error of the user's own function is not touched
  const mine = new Error('mine');
  await assert.rejects(idem.once(scope, newKey(), async () => { throw mine; }), (err) => err === mine);
  // the mapping, one entry per SQLSTATE of docs/errors.md
  for (const [code, Class] of [['22004', idempo.InvalidArgumentError], ['55000', idempo.StateError],
    ['55P03', idempo.LockNotAvailableError], ['40001', idempo.SerializationError], ['25006', idempo.ReadOnlyError],
    ['ID001', idempo.NotReplicatedError], ['42501', idempo.PermissionDeniedError], ['42710', idempo.AlreadyExistsError],
    ['42883', idempo.UndefinedFunctionError], ['0A000', idempo.FeatureNotSupportedError], ['2BP01', idempo.DependentObjectsError]]) {
    const mapped = idempo.fromDatabaseError(Object.assign(new Error('m'), { code }));
    assert.ok(mapped instanceof Class, code);
  }
  // Prisma's raw queries: its code P2010 ("raw query failed") on the error, the SQLSTATE in .meta
  // (its query engine, Prisma 5 and 6) or in .meta.driverAdapterError.cause (a driver adapter, 7)
  const viaEngine = idempo.fromDatabaseError(Object.assign(new Error('Raw query failed'),
    { code: 'P2010', meta: { code: '42704', message: 'scope "s" does not exist' } }));
  assert.ok(viaEngine instanceof idempo.NotFoundError, String(viaEngine));
  assert.equal(viaEngine.code, '42704');
  assert.equal(viaEngine.message, 'scope "s" does not exist');
  const viaAdapter = idempo.fromDatabaseError(Object.assign(new Error('Raw query failed'), { code: 'P2010',
    meta: { driverAdapterError: { cause: { originalCode: '55000', originalMessage: 'scope "s" is disabled', hint: 'h' } } } }));
  assert.ok(viaAdapter instanceof idempo.StateError, String(viaAdapter));
  assert.deepEqual([viaAdapter.code, viaAdapter.message, viaAdapter.hint], ['55000', 'scope "s" is disabled', 'h']);
  const other = Object.assign(new Error('other'), { code: '23505' });
  assert.equal(idempo.fromDatabaseError(other), other);
});

test('claim: outcomes and statuses as constants, dates as Date, ids as numbers', async () => {
  const scope = await newScope(pool, 'core.claim');
  const key = newKey();
  const c = await idem.claim(scope, key, { params: { qty: 1 }, completeOnCommit: true, runId: 'r1' });
  assert.ok(c instanceof idempo.Claim);
  assert.equal(c.outcome, idempo.Outcome.ACQUIRED);
  assert.equal(c.attempt, 1);
  assert.ok(c.firstSeenAt instanceof Date);
  assert.ok(Math.abs(c.firstSeenAt.getTime() - Date.now()) < 60000, String(c.firstSeenAt));
  assert.equal(c.completedAt, null);
  const again = await idem.claim(scope, key, { params: { qty: 1.0 } });
  assert.equal(again.outcome, idempo.Outcome.REPLAY);
  assert.equal(again.status, idempo.Status.SUCCEEDED);
  assert.equal(again.firstSeenAt.getTime(), c.firstSeenAt.getTime());
  assert.ok(again.completedAt >= again.firstSeenAt);
  const changed = await idem.claim(scope, key, { params: { qty: 2 } });
  assert.equal(changed.outcome, 'conflict');
  assert.equal(typeof changed.conflictId, 'number');
  const op = await idem.lookup(scope, key);
  assert.equal(op.status, 'succeeded');
  assert.equal(op.runId, 'r1');
  assert.equal(await idem.lookup(scope, 'absent'), null);
});

test('once: acquired runs the function once in the transaction and stores its value; replay returns it without running', async () => {
  const scope = await newScope(pool, 'core.once');
  const key = newKey();
  let runs = 0;
  const work = async (tx, claim) => {
    runs += 1;
    assert.equal(claim.outcome, 'acquired');
    const { rows: [row] } = await tx.query('INSERT INTO core_orders (k, qty) VALUES ($1, 2) RETURNING id', [key]);
    return { orderId: row.id };
  };
  const first = await idem.once(scope, key, { params: { qty: 2 } }, work);
  assert.equal(first.replayed, false);
  assert.equal(first.status, 'succeeded');
  const second = await idem.once(scope, key, { params: { qty: 2 } }, work);
  assert.equal(second.replayed, true);
  assert.deepEqual(second.result, first.result);
  assert.equal(runs, 1);
  assert.equal(await one(pool, 'SELECT count(*)::int FROM core_orders WHERE k = $1', [key]), 1);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('once: a throw rolls back the claim with the work: the key is free and the retry runs afresh', async () => {
  const scope = await newScope(pool, 'core.throw');
  const key = newKey();
  await assert.rejects(idem.once(scope, key, async (tx) => {
    await tx.query('INSERT INTO core_orders (k, qty) VALUES ($1, 1)', [key]);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await one(pool, 'SELECT count(*)::int FROM core_orders WHERE k = $1', [key]), 0);
  const done = await idem.once(scope, key, async () => 'ok');
  assert.equal(done.result, 'ok');
  assert.equal(done.replayed, false);
});

test('once: conflict is a ConflictError with conflict_id and the changed fields', async () => {
  const scope = await newScope(pool, 'core.conflict', 'store_params => true');
  const key = newKey();
  await idem.once(scope, key, { params: { sku: 'A-7', qty: 2 } }, async () => 1);
  let ran = false;
  await assert.rejects(idem.once(scope, key, { params: { sku: 'A-7', qty: 5 } }, async () => { ran = true; }), (err) => {
    assert.ok(err instanceof idempo.ConflictError, err.stack);
    assert.ok(err instanceof idempo.OutcomeError);
    assert.equal(err.outcome, 'conflict');
    assert.equal(typeof err.conflictId, 'number');
    assert.deepEqual(err.changedFields, [{ field: 'qty', stored: 2, incoming: 5 }]);
    return true;
  });
  assert.equal(ran, false);
  assert.equal(await one(pool, 'SELECT count(*)::int FROM idempo.conflicts WHERE scope = $1', [scope]), 1);
});

test("once: busy with onBusy 'raise' (the default) throws BusyError at once; 'wait' waits for the holder and replays", async () => {
  const scope = await newScope(pool, 'core.busy');
  const key = newKey();
  const holder = await pool.connect();
  try {
    await holder.query('BEGIN');
    await holder.query("SELECT idempo.claim($1, $2, complete_on_commit => true)", [scope, key]);
    let ran = false;
    // wait: false: a claim in a transaction still open is busy at once
    await assert.rejects(idem.once(scope, key, { wait: false }, async () => { ran = true; }), (err) => {
      assert.ok(err instanceof idempo.BusyError, err.stack);
      assert.equal(err.retryAfterMs, 1000);
      return true;
    });
    const waiting = idem.once(scope, key, { onBusy: 'wait' }, async () => { ran = true; });
    await waitFor('the second once() to wait for the holder', async () => (await one(pool,
      "SELECT count(*)::int FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idempo.claim%'")) === 1);
    await holder.query("SELECT idempo.complete($1, $2, result => '\"held\"')", [scope, key]);
    await holder.query('COMMIT');
    const done = await waiting;
    assert.equal(done.replayed, true);
    assert.equal(done.result, 'held');
    assert.equal(ran, false);
  } finally {
    holder.release();
  }
});

test("once: a committed holder (a lease) is busy: BusyError with the lease's time left (onBusy 'raise', the default)", async () => {
  const scope = await newScope(pool, 'core.lease');
  const key = newKey();
  await idem.claim(scope, key);                      // committed, in_progress, the scope's 5-minute lease
  let ran = false;
  await assert.rejects(idem.once(scope, key, async () => { ran = true; }), (err) => {
    assert.ok(err instanceof idempo.BusyError, err.stack);
    assert.equal(err.status, 'in_progress');
    assert.ok(err.retryAfterMs > 250000 && err.retryAfterMs <= 300000, String(err.retryAfterMs));
    return true;
  });
  assert.equal(ran, false);
});

test('once: in_review and expired-like outcomes are errors of their own class', async () => {
  const scope = await newScope(pool, 'core.review');
  const key = newKey();
  await idem.once(scope, key, async () => 1);
  await pool.query('SELECT idempo.request_review($1, $2)', [scope, key]);
  await assert.rejects(idem.once(scope, key, async () => 2), (err) => {
    assert.ok(err instanceof idempo.InReviewError, err.stack);
    assert.equal(err.outcome, 'in_review');
    return true;
  });
  await assert.rejects(idem.once(scope, newKey(), { intentAt: new Date(Date.now() - 3 * 86400e3) }, async () => 2),
    (err) => err instanceof idempo.StaleError && err instanceof idempo.InReviewError && err.outcome === 'stale');
});

test("within: once() in the caller's transaction commits and rolls back with it", async () => {
  const scope = await newScope(pool, 'core.within');
  const key = newKey();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const done = await idem.within(client).once(scope, key, async (tx) => {
      assert.equal(tx, client);
      await tx.query('INSERT INTO core_orders (k, qty) VALUES ($1, 3)', [key]);
      return 'in-caller-tx';
    });
    assert.equal(done.result, 'in-caller-tx');
    assert.equal(await idem.lookup(scope, key), null);        // not committed yet: other sessions see nothing
    await client.query('ROLLBACK');
    assert.equal(await idem.lookup(scope, key), null);
    assert.equal(await one(pool, 'SELECT count(*)::int FROM core_orders WHERE k = $1', [key]), 0);
    await client.query('BEGIN');
    await idem.within(client).once(scope, key, async () => 'second');
    await client.query('COMMIT');
    assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
  } finally {
    client.release();
  }
});

test('once: 50 concurrent duplicates run the work once; the others replay it', async () => {
  const scope = await newScope(pool, 'core.fifty');
  const key = newKey();
  let runs = 0;
  const all = await Promise.all(Array.from({ length: 50 }, () => idem.once(scope, key, { params: { n: 1 }, onBusy: 'wait' }, async (tx) => {
    runs += 1;
    await tx.query('INSERT INTO core_orders (k, qty) VALUES ($1, 1)', [key]);
    return { n: 1 };
  })));
  assert.equal(runs, 1);
  assert.equal(all.filter((d) => !d.replayed).length, 1);
  assert.ok(all.every((d) => d.result.n === 1));
  assert.equal(await one(pool, 'SELECT count(*)::int FROM core_orders WHERE k = $1', [key]), 1);
});

test('rawJson: params given as JSON text keep every digit of big numbers', async () => {
  const scope = await newScope(pool, 'core.raw');
  const key = newKey();
  await idem.once(scope, key, { params: idempo.rawJson('{"amount": 12345678901234567890}') }, async () => 1);
  const same = await idem.claim(scope, key, { params: idempo.rawJson('{"amount": 12345678901234567890.0}') });
  assert.equal(same.outcome, 'replay');
  const rounded = await idem.claim(scope, key, { params: { amount: 12345678901234567890 } });
  assert.equal(rounded.outcome, 'conflict');     // JSON.stringify rounds: another number
});
