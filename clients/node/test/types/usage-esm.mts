// The same declarations used from an ES module (an application with "type": "module", or a
// .mts file): Node gives a CommonJS module's module.exports as the default import, and
// TypeScript types it so only if the declaration says `export =` (a declared `export default`
// is then the object holding it, and fastify.register refuses that object).
import express from 'express';
import Fastify from 'fastify';
import { Pool } from 'pg';
import { Idempo, ConflictError, Outcome } from 'idempo';
import { idempotency } from 'idempo/express';
import idempoFastify from 'idempo/fastify';
import { idempotency as idempoFastifyByName } from 'idempo/fastify';

const pool = new Pool();
const idem = new Idempo(pool);

const app = express();
app.post('/orders', express.json(), idempotency(idem, { scope: 'shop.orders' }), async (req, res) => {
  const { rows: [order] } = await req.idempotency!.tx.query('INSERT INTO orders DEFAULT VALUES RETURNING *');
  res.status(201).json(order);
});

const f = Fastify();
await f.register(idempoFastify, { idem });
await f.register(idempoFastifyByName, { idem });
f.post('/orders', { config: { idempotency: { scope: 'shop.orders' } } }, async (request, reply) => {
  const { rows: [order] } = await request.idempotency!.tx.query('INSERT INTO orders DEFAULT VALUES RETURNING *');
  return reply.code(201).send(order);
});

try {
  await idem.once('s', 'k', async () => Outcome.ACQUIRED);
} catch (err) {
  if (err instanceof ConflictError) console.log(err.conflictId);
}

// the types fastify.d.ts names, imported by name
import type { IdempoPluginOptions, MiddlewareOptions, IdempotencyContext } from 'idempo/fastify';
import { answerFor } from 'idempo/fastify';
const pluginOptions: IdempoPluginOptions = { idem, scope: 'shop.orders', mode: 'lease', onError: 'retry' };
const middlewareOptions: MiddlewareOptions = { scope: () => 'shop.orders' };
const context: IdempotencyContext | null = null;
console.log(pluginOptions, middlewareOptions, context, answerFor({ outcome: 'busy', leaseLeftMs: 1000 }, {}).status);
