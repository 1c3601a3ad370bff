'use strict';
// The Prisma adapter: Prisma 7 over pg (@prisma/adapter-pg, no query engine), idempo's calls and
// helpers on a PrismaClient and inside a prisma.$transaction the application opened, written the
// way docs/node.md shows: idempo.prisma(prisma).
// Its client is generated first (prisma generate, test/prisma/schema.prisma) and compiled by tsc,
// offline: generate runs no engine (it parses the schema in WebAssembly), but the Prisma CLI
// downloads its schema engine from binaries.prisma.sh before any command unless
// PRISMA_SCHEMA_ENGINE_BINARY names a file, so it is pointed at one (node itself) that is never run.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const { spawnSync } = require('node:child_process');
const idempo = require('..');
const { newPool, newScope, newKey } = require('./helpers');

const OUT = path.join(__dirname, '.prisma-client');
const TX = { timeout: 20000 };      // Prisma's default, 5 s, is short on a loaded machine

function sh(args, env = {}) {
  const r = spawnSync(process.execPath, args, { cwd: __dirname, encoding: 'utf8', env: { ...process.env, ...env } });
  assert.equal(r.status, 0, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
}

let prisma;
let idem;
let outside;      // another connection: what is committed
before(async () => {
  fs.rmSync(OUT, { recursive: true, force: true });
  sh([require.resolve('prisma/build/index.js'), 'generate', '--schema', 'prisma/schema.prisma'],
    { PRISMA_SCHEMA_ENGINE_BINARY: process.execPath, CHECKPOINT_DISABLE: '1', PRISMA_HIDE_UPDATE_MESSAGE: '1' });
  sh([require.resolve('typescript/bin/tsc'), '-p', 'prisma']);
  const { PrismaClient } = require('./.prisma-client/client.js');
  const { PrismaPg } = require('@prisma/adapter-pg');
  prisma = new PrismaClient({ adapter: new PrismaPg({ max: 10 }) });     // libpq's PG* variables
  idem = new idempo.Idempo(idempo.prisma(prisma, { transaction: TX }));
  outside = new idempo.Idempo(newPool({ max: 1 }));
  await prisma.$executeRawUnsafe('CREATE TABLE IF NOT EXISTS prisma_orders (id serial PRIMARY KEY, k text NOT NULL, qty int NOT NULL)');
});
after(async () => {
  if (prisma) await prisma.$disconnect();
  if (outside) await outside.db.handle.end();
  fs.rmSync(OUT, { recursive: true, force: true });
});

// newScope's db: create_scope through Prisma
const viaPrisma = { query: (text, values) => prisma.$queryRawUnsafe(text, ...values) };
const ordersOf = (k) => prisma.prismaOrder.count({ where: { k } });

test('once() in a Prisma interactive transaction: the function gets its tx; replay; conflict', async () => {
  const scope = await newScope(viaPrisma, 'prisma.once', "store_params => true");
  const key = newKey();
  let runs = 0;
  const work = async (tx) => {
    runs += 1;
    assert.equal(typeof tx.$connect, 'undefined');       // $transaction's client, not the PrismaClient
    const row = await tx.prismaOrder.create({ data: { k: key, qty: 2 } });
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
  assert.deepEqual(conflict.changedFields, [{ field: 'qty', stored: 2, incoming: 3 }]);
  // the database's refusal as idempo's class, with its SQLSTATE, message and hint (Prisma 7 wraps
  // it in a P2010 error: meta.driverAdapterError.cause)
  const missing = await idem.claim('no.such.scope.prisma', key).catch((e) => e);
  assert.ok(missing instanceof idempo.NotFoundError, String(missing));
  assert.equal(missing.code, '42704');
  assert.match(missing.message, /^scope "no\.such\.scope\.prisma" does not exist/);
  assert.match(missing.hint, /create_scope/);
  const op = await idem.lookup(scope, key);
  assert.ok(op.firstSeenAt instanceof Date);
  assert.equal(op.attempt, 1);
});

test('once() throwing in a Prisma transaction rolls back the claim and the writes', async () => {
  const scope = await newScope(viaPrisma, 'prisma.throw');
  const key = newKey();
  await assert.rejects(idem.once(scope, key, async (tx) => {
    await tx.prismaOrder.create({ data: { k: key, qty: 1 } });
    throw new Error('boom');
  }), /boom/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
});

test("within(tx): in the application's prisma.$transaction, the claim commits and rolls back with it", async () => {
  const scope = await newScope(viaPrisma, 'prisma.within');
  const key = newKey();
  await assert.rejects(prisma.$transaction(async (tx) => {
    await idem.within(tx).once(scope, key, async (t) => {
      assert.equal(t, tx);
      await t.prismaOrder.create({ data: { k: key, qty: 1 } });
      return 'x';
    });
    throw new Error('the application rolls back');
  }, TX), /rolls back/);
  assert.equal(await idem.lookup(scope, key), null);
  assert.equal(await ordersOf(key), 0);
  await prisma.$transaction(async (tx) => {
    const done = await idem.within(tx).once(scope, key, async (t) => { await t.prismaOrder.create({ data: { k: key, qty: 1 } }); return 'y'; });
    assert.equal(done.result, 'y');
    const again = await idem.within(tx).once(scope, key, async () => 'z');
    assert.equal(again.replayed, true);
    assert.equal(again.result, 'y');
  }, TX);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
  assert.equal(await ordersOf(key), 1);
});

test('callOnce() on Prisma: the record step gets the tx, complete commits with it; a lost reply is looked up', async () => {
  const scope = await newScope(viaPrisma, 'prisma.callout');
  const key = newKey();
  const charges = new Map();
  let calls = 0;
  const done = await idem.callOnce(scope, key, {
    params: { amount: 5 },
    call: async (ctx) => { calls += 1; charges.set(ctx.key, { id: `ch-${ctx.key}` }); throw new Error('reply lost'); },
    lookup: async (ctx) => charges.get(ctx.key) ?? null,
    record: async (tx, charge) => {
      await tx.prismaOrder.create({ data: { k: key, qty: 5 } });
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

test("idempo.prisma(tx) knows $transaction's client for a transaction (Prisma 7's has a $transaction of its own)", async () => {
  assert.equal(idempo.prisma(prisma).inTransaction, false);
  const scope = await newScope(viaPrisma, 'prisma.adapter-tx');
  const key = newKey();
  await prisma.$transaction(async (tx) => {
    assert.equal(idempo.prisma(tx).inTransaction, true);
    const inTx = new idempo.Idempo(idempo.prisma(tx));
    // callOnce commits its claim before the call: refused in a transaction, not run in it
    await assert.rejects(inTx.callOnce(scope, key, { call: async () => assert.fail('called') }), /outside a transaction/);
    const done = await inTx.once(scope, key, async (t) => { assert.equal(t, tx); return 1; });
    assert.equal(done.result, 1);
  }, TX);
  assert.equal((await idem.lookup(scope, key)).status, 'succeeded');
});

test('an extended client ($extends) is a client, its tx a transaction', async () => {
  const xprisma = prisma.$extends({ client: { $hello() { return 'hi'; } } });
  assert.equal(idempo.prisma(xprisma).inTransaction, false);
  const scope = await newScope(viaPrisma, 'prisma.extends');
  const key = newKey();
  await xprisma.$transaction(async (tx) => {
    assert.equal(idempo.prisma(tx).inTransaction, true);
    const done = await new idempo.Idempo(idempo.prisma(tx)).once(scope, key, async () => 2);
    assert.equal(done.result, 2);
  }, TX);
  const viaX = new idempo.Idempo(idempo.prisma(xprisma, { transaction: TX }));
  const done = await viaX.once(scope, newKey(), async (tx) => { assert.equal(typeof tx.$connect, 'undefined'); return 3; });
  assert.equal(done.result, 3);
});
