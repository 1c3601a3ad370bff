// Compiled by `tsc --noEmit -p test/types` (types.test.js): the declarations describe what the
// JavaScript does, used the way docs/node.md shows.  A wrong declaration fails to compile.
import { Pool, PoolClient } from 'pg';
import knexFactory from 'knex';
import * as idempo from 'idempo';

async function main(): Promise<void> {
  const pool = new Pool();
  const idem = new idempo.Idempo<PoolClient>(pool);
  const done = await idem.once('shop.orders', 'k1', { params: { qty: 1 }, onBusy: 'raise' }, async (tx, claim) => {
    const n: number | null = claim.attempt;
    await tx.query('SELECT 1');
    return { orderId: 1, n };
  });
  const replayed: boolean = done.replayed;
  const orderId: number | undefined = done.result?.orderId;

  const paid = await idem.callOnce('shop.payments', 'k2', {
    params: { amount: 5 },
    call: async ({ key, signal }) => ({ id: `ch_${key}`, aborted: signal.aborted }),
    lookup: async ({ key }) => (key ? { id: `ch_${key}`, aborted: false } : null),
    record: async (tx, charge) => { await tx.query('SELECT 1'); return { chargeId: charge.id }; },
    targetRef: (charge) => charge.id,
    classifyError: (err) => (err instanceof Error && err.message === 'declined' ? 'failed' : 'unknown'),
    heartbeat: { everyMs: 1000, extend: '30 seconds' },
  });
  const chargeId: string | undefined = paid.result?.chargeId;

  const claim: idempo.Claim = await idem.claim('s', 'k', { lease: 30000, completeOnCommit: true });
  if (claim.outcome === idempo.Outcome.CONFLICT) console.log(claim.conflictId);
  const status: idempo.StatusName = await idem.complete('s', 'k', { attempt: 1, result: { a: 1 } });
  const until: Date = await idem.heartbeat('s', 'k', 1);

  try {
    await idem.once('s', 'k', async () => 1);
  } catch (err) {
    if (err instanceof idempo.ConflictError) console.log(err.conflictId, err.changedFields?.[0]?.field);
    if (err instanceof idempo.BusyError) console.log(err.retryAfterMs);
    if (err instanceof idempo.ConnectionLostError || idempo.isConnectionError(err)) console.log('retry with the same key');
    if (err instanceof idempo.IdempoError) console.log(err.code, err.hint);
  }

  const db = knexFactory({ client: 'pg' });
  const viaKnex = new idempo.Idempo(idempo.knex(db));
  await db.transaction(async (trx) => {
    await viaKnex.within(trx).once('s', 'k', async (t) => t('x').insert({ a: 1 }));
  });
  console.log(replayed, orderId, chargeId, status, until);
}
void main;

// The middleware, typed as Express and Fastify applications use them.
import express from 'express';
import Fastify from 'fastify';
import { idempotency } from 'idempo/express';
import idempoFastify from 'idempo/fastify';

async function web(idem: idempo.Idempo<PoolClient>): Promise<void> {
  const app = express();
  app.post('/orders', express.json(), idempotency(idem, { scope: 'http.orders', tenant: (req) => req.headers['x-tenant'] as string }),
    async (req, res) => {
      const tx = req.idempotency?.tx as PoolClient;
      await tx.query('SELECT 1');
      res.status(201).json({ ok: true });
    });
  // mode 'lease': a failed attempt is left to its lease ('doubt', the default) or failed retryable
  app.post('/payments', express.json(), idempotency(idem, { scope: 'http.payments', mode: 'lease', onError: 'retry' }),
    async (req, res) => {
      const tx = (await req.idempotency!.transaction!()) as PoolClient;
      await tx.query('SELECT 1');
      res.status(201).json({ aborted: req.idempotency?.signal?.aborted });
    });
  // @ts-expect-error onError is 'doubt' or 'retry'
  idempotency(idem, { scope: 'http.payments', mode: 'lease', onError: 'fail' });
  const f = Fastify();
  await f.register(idempoFastify, { idem, store: (status) => status < 300 });
  f.post('/payments', { config: { idempotency: { scope: 'http.payments', mode: 'lease', onError: 'doubt' } } }, async () => 'ok');
  // @ts-expect-error onError is 'doubt' or 'retry'
  await f.register(idempoFastify, { idem, onError: 'again' });
  f.post('/orders', { config: { idempotency: { scope: 'http.orders', key: { fields: ['order_id'] } } } }, async (request, reply) => {
    const attempt: number | null | undefined = request.idempotency?.attempt;
    return reply.code(201).send({ attempt });
  });
}
void web;

// Kysely: the function gets the Kysely transaction, typed with the application's tables.
import { Kysely, PostgresDialect, CompiledQuery, Generated } from 'kysely';
interface ShopDb { orders: { id: Generated<number>; customer: string; qty: number } }
async function viaKysely(): Promise<void> {
  const db = new Kysely<ShopDb>({ dialect: new PostgresDialect({ pool: new Pool() }) });
  const idem = new idempo.Idempo(idempo.kysely(db, { CompiledQuery }));
  const done = await idem.once('shop.orders', 'k', async (trx) => {
    const row = await trx.insertInto('orders').values({ customer: 'ada', qty: 1 }).returning('id').executeTakeFirstOrThrow();
    return { id: row.id };
  });
  const id: number | undefined = done.result?.id;
  await db.transaction().execute(async (trx) => {
    await idem.within(trx).once('shop.orders', 'k2', async (t) => t.insertInto('orders').values({ customer: 'bo', qty: 2 }).execute());
  });
  void id;
}
void viaKysely;

// Prisma: $transaction's client is typed by Prisma as the PrismaClient without its deny list
// (Prisma.TransactionClient): within(tx) takes it, and the functions get it.  Declared here as
// Prisma 7's generated client declares it, without running prisma generate.
type TxDenied = '$connect' | '$disconnect' | '$on' | '$use' | '$extends';
declare class PrismaLike {
  order: { create(args: { data: { qty: number } }): Promise<{ id: number; qty: number }> };
  $connect(): Promise<void>;
  $disconnect(): Promise<void>;
  $on(event: string, cb: () => void): void;
  $use(cb: () => void): void;
  $extends(x: unknown): this;
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): Promise<T>;
  $transaction<R>(fn: (tx: Omit<PrismaLike, TxDenied>) => Promise<R>, options?: { timeout?: number }): Promise<R>;
}
async function viaPrisma(prisma: PrismaLike): Promise<void> {
  const idem = new idempo.Idempo(idempo.prisma(prisma, { transaction: { timeout: 10000 } }));
  const done = await idem.once('shop.orders', 'k', async (tx) => ({ id: (await tx.order.create({ data: { qty: 1 } })).id }));
  const id: number | undefined = done.result?.id;
  await prisma.$transaction(async (tx) => {
    await idem.within(tx).once('shop.orders', 'k2', async (t) => t.order.create({ data: { qty: 2 } }));
  });
  void id;
}
void viaPrisma;

import { paramsOf, defaultStore, checkOptions } from 'idempo/http';
const raw: idempo.RawJson = paramsOf({ method: 'POST', path: '/x', contentType: 'application/json', body: { a: 1 } });
const kept: boolean = defaultStore(404);
// another framework's adapter checks its options when it is made, as Express's and Fastify's do
const checked: { scope: string; mode: 'lease'; onError: 'retry' } = checkOptions({ scope: 'http.x', mode: 'lease', onError: 'retry' }, 'my adapter');
void raw; void kept; void checked;
