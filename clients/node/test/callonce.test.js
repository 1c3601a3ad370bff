'use strict';
// callOnce(): the two-system flow against a stand-in provider (test/provider.js) that does not
// deduplicate, so any doubled action shows.  Lease, heartbeat, unknown -> lookup -> verify, the
// verify race, and 10,000 requests with duplicates, changed parameters and lost replies.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const idempo = require('..');
const { newPool, newScope, waitFor, sleep, newKey, one } = require('./helpers');
const { startProvider, providerClient, Declined } = require('./provider');

let pool;
let idem;
let provider;
let pay;
before(async () => {
  pool = newPool({ max: 30 });
  idem = new idempo.Idempo(pool, { log: { error() {} } });
  provider = await startProvider();
  pay = providerClient(provider.url, { timeoutMs: 1000 });
  await pool.query(`CREATE TABLE IF NOT EXISTS callout_payments (
    id serial PRIMARY KEY, key text NOT NULL, charge_id text NOT NULL UNIQUE, amount int NOT NULL)`);
});
after(async () => {
  provider.server.close();
  await pool.end();
});

// The application's rules for its provider: a decline had no effect; anything else is in doubt.
const classifyError = (err) => (err instanceof Declined ? 'retryable' : 'unknown');
function payment(scope, key, amount, extra = {}, counters = {}) {
  return idem.callOnce(scope, key, {
    params: { amount },
    call: ({ key: k, signal }) => { counters.calls = (counters.calls ?? 0) + 1; return pay.charge(`${scope}/${k}`, amount, extra, signal); },
    lookup: ({ key: k }) => { counters.lookups = (counters.lookups ?? 0) + 1; return pay.findCharge(`${scope}/${k}`); },
    record: async (tx, charge) => {
      counters.records = (counters.records ?? 0) + 1;
      await tx.query('INSERT INTO callout_payments (key, charge_id, amount) VALUES ($1, $2, $3)', [key, charge.id, amount]);
      return { chargeId: charge.id };
    },
    targetRef: (charge) => charge.id,
    classifyError,
    onBusy: 'wait',
    busyTimeoutMs: 20000,
  });
}
const actionsOf = (scope, key) => provider.state.actions.get(`${scope}/${key}`) ?? 0;
const paymentsOf = (key) => one(pool, 'SELECT count(*)::int FROM callout_payments WHERE key = $1', [key]);

test('acquired: the claim commits before the call, the payment row and complete() commit together; a retry replays', async () => {
  const scope = await newScope(pool, 'co.basic');
  const key = newKey();
  provider.state.gate = new Promise((resolve) => { provider.state.open = resolve; });
  const c = {};
  const first = payment(scope, key, 500, {}, c);
  await waitFor('the call to reach the provider', async () => provider.state.requests > 0 && c.calls === 1);
  // the claim is committed while the call runs: another session sees the key held
  const op = await idem.lookup(scope, key);
  assert.equal(op.status, 'in_progress');
  provider.state.gate = null;
  provider.state.open();
  const done = await first;
  assert.equal(done.replayed, false);
  assert.match(done.result.chargeId, /^ch_/);
  assert.equal(done.targetRef, done.result.chargeId);
  const again = await payment(scope, key, 500, {}, c);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.result, done.result);
  assert.equal(c.calls, 1);
  assert.equal(actionsOf(scope, key), 1);
  assert.equal(await paymentsOf(key), 1);
  assert.equal((await idem.lookup(scope, key)).targetRef, done.result.chargeId);
});

test("classifyError 'retryable' (a decline): fail(retryable) frees the key, the next request runs attempt 2", async () => {
  const scope = await newScope(pool, 'co.decline');
  const key = newKey();
  await assert.rejects(payment(scope, key, 700, { fault: 'decline' }), Declined);
  const op = await idem.lookup(scope, key);
  assert.equal(op.status, 'retryable');
  const done = await payment(scope, key, 700);
  assert.equal(done.attempt, 2);
  assert.equal(actionsOf(scope, key), 1);
});

test("classifyError 'failed': a final failure, answered and replayed as status failed", async () => {
  const scope = await newScope(pool, 'co.final');
  const key = newKey();
  const opts = {
    call: async () => { throw new Error('card reported stolen'); },
    classifyError: () => 'failed',
  };
  const first = await idem.callOnce(scope, key, opts);
  assert.equal(first.status, 'failed');
  assert.equal(first.replayed, false);
  assert.match(first.error, /stolen/);
  const again = await idem.callOnce(scope, key, opts);
  assert.equal(again.replayed, true);
  assert.equal(again.status, 'failed');
  assert.match(again.error, /stolen/);
});

test('a lost reply: the call fails in doubt, the lookup finds the charge, complete() records it: one action', async () => {
  const scope = await newScope(pool, 'co.lost');
  const key = newKey();
  const c = {};
  const done = await payment(scope, key, 900, { fault: 'drop-reply' }, c);
  assert.equal(done.replayed, false);
  assert.equal(c.calls, 1);
  assert.equal(c.lookups, 1);
  assert.equal(actionsOf(scope, key), 1);
  assert.equal(await paymentsOf(key), 1);
});

test('in doubt and not found yet: the key stays held; after the lease it is unknown, verified not found after verify_settle, then attempt 2', async () => {
  const scope = await newScope(pool, 'co.doubt', "lease => '1 second', verify_settle => '1500 milliseconds'");
  const key = newKey();
  await assert.rejects(payment(scope, key, 300, { fault: 'drop-request' }), (err) => {
    assert.ok(err instanceof idempo.UnknownOutcomeError, err.stack);
    assert.equal(err.attempt, 1);
    return true;
  });
  assert.equal((await idem.lookup(scope, key)).status, 'in_progress');
  const c = {};
  const done = await payment(scope, key, 300, {}, c);     // waits out the lease, then settle
  assert.equal(done.attempt, 2);
  assert.ok(c.lookups >= 1);
  assert.equal(actionsOf(scope, key), 1);
  assert.equal(await paymentsOf(key), 1);
});

test('unknown and found (a charge made late, in flight): verify(found) records it, never a second charge', async () => {
  const scope = await newScope(pool, 'co.late', "lease => '1 second', verify_settle => '2 seconds'");
  const key = newKey();
  await assert.rejects(payment(scope, key, 400, { fault: 'late' }), idempo.UnknownOutcomeError);
  await waitFor('the late charge', async () => actionsOf(scope, key) === 1);
  const c = {};
  const done = await payment(scope, key, 400, {}, c);
  assert.equal(done.verified, true);
  assert.equal(c.calls ?? 0, 0);
  assert.equal(actionsOf(scope, key), 1);
  assert.equal(await paymentsOf(key), 1);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('two workers on an unknown key: one verifies, the other is busy, waits and replays; one row', async () => {
  const scope = await newScope(pool, 'co.race', "lease => '1 second'");
  const key = newKey();
  await assert.rejects(payment(scope, key, 100, { fault: 'late' }), idempo.UnknownOutcomeError);
  await waitFor('the late charge', async () => actionsOf(scope, key) === 1);
  await sleep(1100);                                              // the lease runs out: unknown
  const c = {};
  const [a, b] = await Promise.all([payment(scope, key, 100, {}, c), payment(scope, key, 100, {}, c)]);
  assert.deepEqual(a.result, b.result);
  assert.equal([a, b].filter((d) => d.verified).length, 1);
  assert.equal(c.records, 1);
  assert.equal(c.calls ?? 0, 0);
  assert.equal(await paymentsOf(key), 1);
});

test('the verify race: a verifier whose verification lease ran out is refused, claims again and replays', async () => {
  const scope = await newScope(pool, 'co.vrace', "lease => '1 second'");
  const key = newKey();
  await pool.query('CREATE TABLE IF NOT EXISTS callout_verified (key text NOT NULL, by text NOT NULL)');
  const inDoubt = () => { throw new Error('connection reset'); };
  await assert.rejects(idem.callOnce(scope, key, { call: inDoubt }), idempo.UnknownOutcomeError);
  await sleep(1100);                                              // attempt 1's lease runs out: unknown
  let openA;
  const gateA = new Promise((resolve) => { openA = resolve; });
  let aLooking = false;
  const record = (by) => async (tx, charge) => {
    await tx.query('INSERT INTO callout_verified (key, by) VALUES ($1, $2)', [key, by]);
    return { chargeId: charge.id, by };
  };
  const a = idem.callOnce(scope, key, {
    call: inDoubt,
    lookup: async () => { aLooking = true; await gateA; return { id: 'ch_found' }; },
    record: record('A'),
  });
  await waitFor('A to hold the verification lease and look up', async () => aLooking);
  await sleep(1100);                                              // A's verification lease runs out
  const b = await idem.callOnce(scope, key, { call: inDoubt, lookup: async () => ({ id: 'ch_found' }), record: record('B') });
  assert.equal(b.verified, true);
  openA();                                                        // A's verify now comes too late
  const doneA = await a;
  assert.equal(doneA.replayed, true);
  assert.deepEqual(doneA.result, { chargeId: 'ch_found', by: 'B' });
  assert.deepEqual((await pool.query('SELECT by FROM callout_verified WHERE key = $1', [key])).rows, [{ by: 'B' }]);
});

test('heartbeat: a call longer than the lease keeps the key (others are busy, never unknown), and completes', async () => {
  const scope = await newScope(pool, 'co.beat', "lease => '1 second'");
  const key = newKey();
  let seen;
  const done = await idem.callOnce(scope, key, {
    call: async () => {
      await sleep(2500);
      seen = await idem.claim(scope, key, { wait: false });     // another worker, mid-call
      return 'charged';
    },
  });
  assert.equal(seen.outcome, 'busy');
  assert.equal(seen.status, 'in_progress');
  assert.equal(done.result, 'charged');
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('without a heartbeat the same call loses its lease: the other worker is told unknown (the heartbeat is what keeps it)', async () => {
  const scope = await newScope(pool, 'co.nobeat', "lease => '1 second'");
  const key = newKey();
  let seen;
  await idem.callOnce(scope, key, {
    heartbeat: false,
    call: async () => {
      await sleep(1500);
      seen = await idem.claim(scope, key, { wait: false });
      return 'charged';
    },
  }).catch(() => {});
  assert.equal(seen.outcome, 'unknown');
});

test('a lease lost mid-call (retry scope, another worker took attempt 2): the signal aborts and the result is not recorded', async () => {
  const scope = await newScope(pool, 'co.lost-lease', "lease => '1 second', on_lease_expiry => 'retry'");
  const key = newKey();
  let aborted = null;
  const slow = idem.callOnce(scope, key, {
    heartbeat: { everyMs: 2000 },                 // too slow to keep a 1 s lease
    call: ({ signal }) => new Promise((resolve) => {
      signal.addEventListener('abort', () => { aborted = signal.reason; resolve('late'); });
    }),
  });
  await sleep(1200);
  const taker = await idem.claim(scope, key, { completeOnCommit: true });
  assert.equal(taker.outcome, 'acquired');
  assert.equal(taker.attempt, 2);
  await assert.rejects(slow, idempo.LeaseLostError);
  assert.ok(aborted instanceof idempo.LeaseLostError);
  const op = await idem.lookup(scope, key);
  assert.equal(op.attempt, 2);
  assert.equal(op.result, null);
});

test('conflict: other parameters for a key are a ConflictError and never reach the provider', async () => {
  const scope = await newScope(pool, 'co.conflict');
  const key = newKey();
  await payment(scope, key, 100);
  const c = {};
  await assert.rejects(payment(scope, key, 999, {}, c), idempo.ConflictError);
  assert.equal(c.calls ?? 0, 0);
  assert.equal(actionsOf(scope, key), 1);
});

test('10,000 requests (duplicates, changed amounts, declines, lost requests, lost replies, late charges): 0 doubled actions', async () => {
  const scope = await newScope(pool, 'co.job', "lease => '1 second', verify_settle => '1 second'");
  const job = await startProvider({ faults: { 'drop-request': 0.02, 'drop-reply': 0.03, late: 0.01, decline: 0.02 }, lateMs: 200 });
  const client = providerClient(job.url, { timeoutMs: 1000 });
  try {
    const keys = Array.from({ length: 4000 }, (_, i) => ({ key: `job-${i}`, amount: 100 + (i % 50) }));
    const requests = [];
    for (const k of keys) requests.push({ ...k });
    while (requests.length < 10000) {
      const k = keys[Math.floor(Math.random() * keys.length)];
      requests.push({ ...k, amount: Math.random() < 0.05 ? k.amount + 1 : k.amount });  // 5% changed parameters
    }
    for (let i = requests.length - 1; i > 0; i -= 1) {               // shuffle: duplicates meet concurrently
      const j = Math.floor(Math.random() * (i + 1));
      [requests[i], requests[j]] = [requests[j], requests[i]];
    }
    const tally = { done: 0, replayed: 0, conflict: 0, declined: 0, retries: 0 };
    const firstAmount = new Map();
    const run = async (r) => {
      for (let tries = 0; ; tries += 1) {
        try {
          const d = await idem.callOnce(scope, r.key, {
            params: { amount: r.amount },
            call: ({ key, signal }) => client.charge(`${scope}/${key}`, r.amount, {}, signal),
            lookup: ({ key }) => client.findCharge(`${scope}/${key}`),
            record: async (tx, charge) => {
              await tx.query('INSERT INTO callout_payments (key, charge_id, amount) VALUES ($1, $2, $3)',
                [`${scope}/${r.key}`, charge.id, charge.amount]);
              return { chargeId: charge.id, amount: charge.amount };
            },
            classifyError,
            onBusy: 'wait',
            busyTimeoutMs: 3000,
          });
          assert.equal(d.status, 'succeeded');
          if (d.replayed) tally.replayed += 1; else tally.done += 1;
          assert.equal(d.result.amount, firstAmount.get(r.key) ?? d.result.amount);
          firstAmount.set(r.key, d.result.amount);
          return;
        } catch (err) {
          if (err instanceof idempo.ConflictError) { tally.conflict += 1; return; }
          if (err instanceof Declined) { tally.declined += 1; return; }   // the client gives up; the key is retryable
          // in doubt, busy, or an error of the call passed on: a client retries the same request
          if (tries > 60) throw err;
          tally.retries += 1;
          await sleep(100);
        }
      }
    };
    let next = 0;
    await Promise.all(Array.from({ length: 25 }, async () => {
      while (next < requests.length) await run(requests[next++]);
    }));
    const doubled = [...job.state.actions.values()].filter((n) => n > 1).length;
    assert.equal(doubled, 0);
    // what the provider did and what the database recorded are the same set of keys
    const { rows } = await pool.query(`SELECT o.key, p.charge_id FROM idempo.operations o
      LEFT JOIN callout_payments p ON p.key = o.scope || '/' || o.key WHERE o.scope = $1 AND o.status = 'succeeded'`, [scope]);
    assert.equal(rows.length, job.state.actions.size);
    for (const row of rows) assert.equal(job.state.charges.get(`${scope}/${row.key}`).id, row.charge_id);
    assert.equal(await one(pool, 'SELECT count(*)::int FROM callout_payments WHERE key LIKE $1', [`${scope}/%`]), job.state.actions.size);
    assert.ok(tally.conflict > 0 && tally.replayed > 0 && tally.retries > 0, JSON.stringify(tally));
    console.log(`# 10,000 requests: ${JSON.stringify(tally)}, ${job.state.actions.size} charges, ${job.state.requests} provider calls, 0 doubled`);
  } finally {
    job.server.close();
  }
});

test('not found inside the settle window: UnknownOutcomeError says when the window ends (the lease\'s end + verify_settle)', async () => {
  const scope = await newScope(pool, 'co.settle', "lease => '1 second', verify_settle => '1 hour'");
  const key = newKey();
  const opts = { call: () => { throw new Error('connection reset'); }, lookup: () => null };
  await assert.rejects(idem.callOnce(scope, key, opts), idempo.UnknownOutcomeError);
  await sleep(1100);                                              // attempt 1's lease runs out: unknown
  const err = await idem.callOnce(scope, key, opts).then(() => null, (e) => e);
  assert.ok(err instanceof idempo.UnknownOutcomeError, String(err && err.stack));
  const { rows: [r] } = await pool.query(
    "SELECT last_attempt_at AS last, last_attempt_at + interval '1 hour' AS ends FROM idempo.lookup($1, $2)", [scope, key]);
  assert.equal(err.settlesAt && err.settlesAt.getTime(), r.ends.getTime());
  assert.match(err.message, new RegExp(`the settle window ends at ${r.ends.toISOString().replace(/\./g, '\\.')}`));
  assert.match(err.message, /call callOnce again with the same key after then/);
});

test('busy after a call in doubt: the BusyError names the attempt holding the key and when its lease runs out', async () => {
  const scope = await newScope(pool, 'co.busy-message', "lease => '30 seconds'");
  const key = newKey();
  await assert.rejects(payment(scope, key, 300, { fault: 'drop-request' }), idempo.UnknownOutcomeError);
  // the same worker (or any other) asks again at once: nobody is running it, the attempt is in
  // doubt until its lease runs out; "being processed by another worker" said otherwise
  const err = await idem.callOnce(scope, key, { params: { amount: 300 }, call: async () => assert.fail('called') })
    .catch((e) => e);
  assert.ok(err instanceof idempo.BusyError, String(err));
  assert.match(err.message, /^key "[^"]+" in scope "[^"]+" is held by attempt 1 \(status in_progress\) until its lease runs out in (29|30) s: /);
  assert.match(err.message, /outcome is in doubt/);
  assert.ok(err.retryAfterMs > 25000, String(err.retryAfterMs));
});
