'use strict';
// The Knex adapter: idempo's calls and helpers on a knex instance (pg client) and inside a
// transaction the application opened with knex.transaction().
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const knexFactory = require('knex');
const idempo = require('..');
const { newScope, newKey } = require('./helpers');

let knex;
let idem;
before(async () => {
  knex = knexFactory({ client: 'pg', connection: {}, pool: { min: 0, max: 10 } });   // libpq's PG* variables
  idem = new idempo.Idempo(idempo.knex(knex));
  await knex.raw('CREATE TABLE IF NOT EXISTS knex_orders (id serial PRIMARY KEY, k text NOT NULL, qty int NOT NULL)');
});
after(() => knex.destroy());

// newScope's db: create_scope through knex.raw
const viaKnex = { query: (text, values) => knex.raw(text.replace('$1', '?'), values) };
const ordersOf = async (k) => Number((await knex('knex_orders').where({ k }).count('* as n'))[0].n);

test('placeholders: $1..$n become Knex positional bindings, in order, once each', () => {
  assert.equal(idempo.knex(knex).kind, 'knex');
  const { toQuestionMarks } = require('../lib/adapters');
  assert.equal(toQuestionMarks('SELECT f(a => $1::text, b => $2)'), 'SELECT f(a => ?::text, b => ?)');
  assert.throws(() => toQuestionMarks('SELECT $2, $1'), /out of order/);
});

test('once() in a Knex transaction of its own: the function gets the trx; replay; conflict', async () => {
  const scope = await newScope(viaKnex, 'knex.once');
  const key = newKey();
  let runs = 0;
  const work = async (trx) => {
    runs += 1;
    assert.equal(trx.isTransaction, true);
    const [row] = await trx('knex_orders').insert({ k: key, qty: 2 }).returning('id');
    return { id: row.id };
  };
  const first = await idem.once(scope, key, { params: { qty: 2 } }, work);
  const again = await idem.once(scope, key, { params: { qty: 2 } }, work);
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.result, first.result);
  assert.equal(runs, 1);
  assert.equal(await ordersOf(key), 1);
  await assert.rejects(idem.once(scope, key, { params: { qty: 3 } }, work), idempo.ConflictError);
  await assert.rejects(idem.claim('no.such.scope.knex', key), idempo.NotFoundError);
});

test('once() throwing in a Knex transaction rolls back the claim and the writes', async () => {
  const scope = await newScope(viaKnex, 'knex.throw');
  const key = newKey();
  await assert.rejects(idem.once(scope, key, async (trx) => {
    await trx('knex_orders').insert({ k: key, qty: 1 });
    throw new Error('boom');
  }), /boom/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
});

test("within(trx): in the application's knex.transaction, the claim commits and rolls back with it", async () => {
  const scope = await newScope(viaKnex, 'knex.within');
  const key = newKey();
  await assert.rejects(knex.transaction(async (trx) => {
    await idem.within(trx).once(scope, key, async (t) => {
      assert.equal(t, trx);
      await t('knex_orders').insert({ k: key, qty: 1 });
      return 'x';
    });
    throw new Error('the application rolls back');
  }), /rolls back/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
  await knex.transaction(async (trx) => {
    const done = await idem.within(trx).once(scope, key, async (t) => { await t('knex_orders').insert({ k: key, qty: 1 }); return 'y'; });
    assert.equal(done.result, 'y');
  });
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
  assert.equal(await ordersOf(key), 1);
});

test('callOnce() on Knex: the record step gets a trx, complete commits with it', async () => {
  const scope = await newScope(viaKnex, 'knex.callout');
  const key = newKey();
  const done = await idem.callOnce(scope, key, {
    params: { amount: 5 },
    call: async (ctx) => ({ id: `ch-${ctx.key}` }),
    record: async (trx, charge) => { await trx('knex_orders').insert({ k: key, qty: 5 }); return { charge: charge.id }; },
    targetRef: (charge) => charge.id,
  });
  assert.equal(done.result.charge, `ch-${key}`);
  const op = await idem.lookup(scope, key);
  assert.equal(op.status, 'succeeded');
  assert.equal(op.targetRef, `ch-${key}`);
  assert.equal(await ordersOf(key), 1);
});
