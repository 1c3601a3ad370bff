'use strict';
// The Kysely adapter (PostgresDialect over pg): idempo's calls and helpers on a Kysely instance
// and inside a transaction the application opened with db.transaction().execute(), written the
// way docs/node.md shows: idempo.kysely(db, { CompiledQuery }).
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Kysely, PostgresDialect, CompiledQuery, sql } = require('kysely');
const idempo = require('..');
const { newPool, newScope, newKey } = require('./helpers');

let db;
let idem;
let outside;      // another connection: what is committed
before(async () => {
  outside = new idempo.Idempo(newPool({ max: 1 }));
  db = new Kysely({ dialect: new PostgresDialect({ pool: newPool({ max: 10 }) }) });   // libpq's PG* variables
  idem = new idempo.Idempo(idempo.kysely(db, { CompiledQuery }));
  await sql`CREATE TABLE IF NOT EXISTS kysely_orders (id serial PRIMARY KEY, k text NOT NULL, qty int NOT NULL)`.execute(db);
});
after(async () => { await db.destroy(); await outside.db.handle.end(); });

// newScope's db: create_scope through Kysely
const viaKysely = { query: (text, values) => db.executeQuery(CompiledQuery.raw(text, values)) };
const ordersOf = async (k) => Number((await db.selectFrom('kysely_orders').where('k', '=', k)
  .select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);
const insertOrder = (trx, k, qty) => trx.insertInto('kysely_orders').values({ k, qty }).returning('id').executeTakeFirstOrThrow();

test('idempo.kysely() without CompiledQuery says what to pass', () => {
  assert.throws(() => idempo.kysely(db), /CompiledQuery from 'kysely'/);
  assert.equal(idempo.kysely(db, { CompiledQuery }).kind, 'kysely');
  assert.equal(idempo.kysely(db, { CompiledQuery }).inTransaction, false);
});

test('once() in a Kysely transaction of its own: the function gets the trx; replay; conflict', async () => {
  const scope = await newScope(viaKysely, 'kysely.once');
  const key = newKey();
  let runs = 0;
  const work = async (trx) => {
    runs += 1;
    assert.equal(trx.isTransaction, true);
    const row = await insertOrder(trx, key, 2);
    // the claim is in this transaction: not committed, so not seen from outside it
    assert.equal(await outside.lookup(scope, key), null);
    return { id: row.id };
  };
  const first = await idem.once(scope, key, { params: { qty: 2 } }, work);
  const again = await idem.once(scope, key, { params: { qty: 2 } }, work);
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.result, first.result);
  assert.equal(runs, 1);
  assert.equal(await ordersOf(key), 1);
  const conflict = await idem.once(scope, key, { params: { qty: 3 } }, work).catch((e) => e);
  assert.ok(conflict instanceof idempo.ConflictError, String(conflict));
  assert.equal(typeof conflict.conflictId, 'number');
  await assert.rejects(idem.claim('no.such.scope.kysely', key), idempo.NotFoundError);
});

test('once() throwing in a Kysely transaction rolls back the claim and the writes', async () => {
  const scope = await newScope(viaKysely, 'kysely.throw');
  const key = newKey();
  await assert.rejects(idem.once(scope, key, async (trx) => {
    await insertOrder(trx, key, 1);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
});

test("within(trx): in the application's db.transaction(), the claim commits and rolls back with it", async () => {
  const scope = await newScope(viaKysely, 'kysely.within');
  const key = newKey();
  await assert.rejects(db.transaction().execute(async (trx) => {
    await idem.within(trx).once(scope, key, async (t) => {
      assert.equal(t, trx);
      await insertOrder(t, key, 1);
      return 'x';
    });
    throw new Error('the application rolls back');
  }), /rolls back/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
  await db.transaction().execute(async (trx) => {
    const done = await idem.within(trx).once(scope, key, async (t) => { await insertOrder(t, key, 1); return 'y'; });
    assert.equal(done.result, 'y');
    // a replay in the same transaction: the claim is visible to it
    const again = await idem.within(trx).once(scope, key, async () => 'z');
    assert.equal(again.replayed, true);
    assert.equal(again.result, 'y');
  });
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
  assert.equal(await ordersOf(key), 1);
});

test('callOnce() on Kysely: the record step gets a trx, complete commits with it; a lost reply is looked up', async () => {
  const scope = await newScope(viaKysely, 'kysely.callout');
  const key = newKey();
  const charges = new Map();
  let calls = 0;
  const done = await idem.callOnce(scope, key, {
    params: { amount: 5 },
    call: async (ctx) => { calls += 1; charges.set(ctx.key, { id: `ch-${ctx.key}` }); throw new Error('reply lost'); },
    lookup: async (ctx) => charges.get(ctx.key) ?? null,
    record: async (trx, charge) => {
      assert.equal(trx.isTransaction, true);
      await insertOrder(trx, key, 5);
      return { charge: charge.id };
    },
    targetRef: (charge) => charge.id,
  });
  assert.equal(calls, 1);
  assert.equal(done.result.charge, `ch-${key}`);
  const op = await idem.lookup(scope, key);
  assert.equal(op.status, 'succeeded');
  assert.equal(op.targetRef, `ch-${key}`);
  assert.equal(await ordersOf(key), 1);
  const again = await idem.callOnce(scope, key, { params: { amount: 5 }, call: async () => assert.fail('called again') });
  assert.equal(again.replayed, true);
});
