'use strict';
// A shop on Express or Fastify with idempo's middleware, for test/http.test.js (run as a child
// process, so that it can be killed with SIGKILL).  node app.js express|fastify; PG* variables;
// PROVIDER_URL; SCOPE_PREFIX.  Prints "listening on URL".
//   POST /orders          one transaction: INSERT INTO shop.orders; sku FLAKY throws once per
//                         key (500, not stored); sku GONE answers 404 (stored, a 4xx); sku
//                         HELD answers 409 (a 4xx that refuses the request: not stored); sku
//                         LOST: the server ends the transaction's connection once per key
//   POST /orders-strict   the same with store: only 2xx (a 404 is not stored)
//   POST /shipments       key from the body's fields order_id and line
//   POST /payments        lease: the provider is called, then INSERT INTO shop.payments; a
//                         failed call frees the key (onError: 'retry': the provider deduplicates)
//   POST /charges         lease with the default onError ('doubt'): the provider at
//                         PLAIN_PROVIDER_URL (which does not deduplicate) is called with the
//                         body's fault; a lost reply answers 502 and the attempt keeps its lease
//   POST /charges-looked-up   the same, with options.lookup (the provider's GET /charges): a
//                         retry that meets unknown looks the charge up and verifies
//   POST /charges-looked-up-settled   the same in a scope whose verify_settle is 1 ms
const { Pool } = require('pg');
const http = require('node:http');
const { Idempo } = require('idempo');

const framework = process.argv[2];
const prefix = process.env.SCOPE_PREFIX;
const pool = new Pool({ max: 60, application_name: `idempo-http-${framework}` });
// an idle client that the server ends (a restart) emits 'error' on the pool: without a
// listener, the process ends (docs/node.md)
pool.on('error', () => {});
const idem = new Idempo(pool);
const flaky = new Set();
const lost = new Set();

function validOrder(body) {
  return body && typeof body === 'object' && typeof body.customer === 'string' && typeof body.sku === 'string'
    && Number.isInteger(body.qty) && body.qty > 0;
}
const badOrder = { type: 'about:blank#invalid-order', title: 'Invalid order', status: 400 };

async function createOrder(idempotency, body) {
  if (body.sku === 'GONE') return { status: 404, body: { title: 'No such product', status: 404 } };
  if (body.sku === 'HELD') return { status: 409, body: { title: 'Stock is being counted', status: 409 } };
  if (body.sku === 'LOST' && !lost.has(idempotency.key)) {
    // the server ends the transaction's connection while it is idle (a restart would too)
    lost.add(idempotency.key);
    const { rows: [{ pid }] } = await idempotency.tx.query('SELECT pg_backend_pid() AS pid');
    const ended = new Promise((resolve) => idempotency.tx.once('end', resolve));
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await ended;
  }
  const { rows: [order] } = await idempotency.tx.query(
    'INSERT INTO shop.orders (customer, sku, qty) VALUES ($1, $2, $3) RETURNING id, customer, sku, qty',
    [body.customer, body.sku, body.qty]);
  if (body.sku === 'FLAKY' && !flaky.has(idempotency.key)) {
    flaky.add(idempotency.key);
    throw new Error('the handler failed');
  }
  return { status: 201, body: order };
}

function charge(providerKey, amount, signal, { url = process.env.PROVIDER_URL, fault } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/charges`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': providerKey }, timeout: 10000, signal,
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => (res.statusCode === 201 || res.statusCode === 200
        ? resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')))
        : reject(new Error(`provider answered ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(JSON.stringify({ amount, fault }));
  });
}

async function pay(idempotency, body) {
  let ch;
  try {
    ch = await charge(`${idempotency.scope}/${idempotency.key}`, body.amount_cents, idempotency.signal);
  } catch (err) {
    return { status: 502, body: { title: 'The payment provider did not answer', status: 502 } };
  }
  const tx = await idempotency.transaction();
  const { rows: [payment] } = await tx.query(
    `INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES ($1, $2, $3)
     RETURNING id, order_id, amount_cents, charge_id`, [body.order_id, body.amount_cents, ch.id]);
  return { status: 201, body: payment };
}

async function chargeOnly(idempotency, body) {
  try {
    const ch = await charge(`${idempotency.scope}/${idempotency.key}`, body.amount_cents, idempotency.signal,
      { url: process.env.PLAIN_PROVIDER_URL, fault: body.fault });
    return { status: 201, body: ch };
  } catch (err) {
    return { status: 502, body: { title: 'The payment provider did not answer', status: 502 } };
  }
}

// keys are per client: X-Tenant stands for the authenticated client (none: 'anonymous')
const tenant = (req) => req.headers['x-tenant'] ?? 'anonymous';
const orders = { scope: `${prefix}.orders`, tenant };
const strict = { scope: `${prefix}.orders`, tenant, store: (status) => status >= 200 && status < 300 };
const shipments = { scope: `${prefix}.shipments`, key: { fields: ['order_id', 'line'] } };
// the provider deduplicates by our key: a failed call may be made again
const payments = { scope: `${prefix}.payments`, mode: 'lease', onError: 'retry' };
const charges = { scope: `${prefix}.charges`, mode: 'lease' };
// the provider's lookup: the charge found is answered (and stored) as the handler would have
function lookUpCharge({ scope, key }) {
  const url = `${process.env.PLAIN_PROVIDER_URL}/charges?key=${encodeURIComponent(`${scope}/${key}`)}`;
  return new Promise((resolve, reject) => {
    http.get(url, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        if (res.statusCode === 404) return resolve(null);
        if (res.statusCode !== 200) return reject(new Error(`lookup answered ${res.statusCode}`));
        return resolve({ status: 201, headers: { 'content-type': 'application/json' }, body: Buffer.concat(chunks) });
      });
    }).on('error', reject);
  });
}
const chargesLookedUp = { scope: `${prefix}.looked-up`, mode: 'lease', lookup: lookUpCharge, retryAfter: 7 };
// the same in a scope whose verify_settle is 1 ms: nothing found is believed at once
const chargesSettled = { scope: `${prefix}.looked-up-settled`, mode: 'lease', lookup: lookUpCharge };
// a lookup that always fails (the other system down), in a scope whose lease is an hour: the
// attempt's lease is 2 s, the verification lease for a lookup 500 ms
const chargesLookupFails = {
  scope: `${prefix}.lookup-fails`, mode: 'lease', lease: '2 seconds', lookupLease: 500,
  lookup: async () => { throw new Error('the provider is down'); },
};

async function express() {
  const expressLib = require('express');
  const { idempotency } = require('idempo/express');
  const app = expressLib();
  app.use(expressLib.json());
  const validate = (req, res, next) => (validOrder(req.body) ? next() : res.status(400).json(badOrder));
  const requireJson = (req, res, next) => (req.is('application/json') ? next() : res.status(415).json({ title: 'json only' }));
  const handle = (fn) => async (req, res) => {
    const out = await fn(req.idempotency, req.body);
    res.status(out.status).json(out.body);
  };
  app.post('/orders', requireJson, validate, idempotency(idem, orders), handle(createOrder));
  app.post('/orders-strict', requireJson, validate, idempotency(idem, strict), handle(createOrder));
  app.post('/shipments', idempotency(idem, shipments), handle(async (i, body) => ({ status: 201, body: { shipped: body } })));
  app.post('/payments', idempotency(idem, payments), handle(pay));
  app.post('/charges', idempotency(idem, charges), handle(chargeOnly));
  app.post('/charges-looked-up', idempotency(idem, chargesLookedUp), handle(chargeOnly));
  app.post('/charges-looked-up-settled', idempotency(idem, chargesSettled), handle(chargeOnly));
  app.post('/charges-lookup-fails', idempotency(idem, chargesLookupFails), handle(chargeOnly));
  // errors: problem details, and nothing of the error's text
  app.use((err, req, res, next) => {     // eslint-disable-line no-unused-vars
    res.status(err.status ?? err.statusCode ?? 500).json({ title: 'error', status: err.status ?? 500 });
  });
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve(server.address().port));
  });
}

async function fastify() {
  const app = require('fastify')();
  await app.register(require('idempo/fastify'), { idem });
  const orderSchema = {
    body: {
      type: 'object', required: ['customer', 'sku', 'qty'],
      properties: { customer: { type: 'string' }, sku: { type: 'string' }, qty: { type: 'integer', minimum: 1 } },
    },
  };
  const handle = (fn) => async (request, reply) => {
    const out = await fn(request.idempotency, request.body);
    return reply.code(out.status).send(out.body);
  };
  app.post('/orders', { schema: orderSchema, config: { idempotency: orders } }, handle(createOrder));
  app.post('/orders-strict', { schema: orderSchema, config: { idempotency: strict } }, handle(createOrder));
  app.post('/shipments', { config: { idempotency: shipments } }, handle(async (i, body) => ({ status: 201, body: { shipped: body } })));
  app.post('/payments', { config: { idempotency: payments } }, handle(pay));
  app.post('/charges', { config: { idempotency: charges } }, handle(chargeOnly));
  app.post('/charges-looked-up', { config: { idempotency: chargesLookedUp } }, handle(chargeOnly));
  app.post('/charges-looked-up-settled', { config: { idempotency: chargesSettled } }, handle(chargeOnly));
  app.post('/charges-lookup-fails', { config: { idempotency: chargesLookupFails } }, handle(chargeOnly));
  await app.listen({ port: 0, host: '127.0.0.1' });
  return app.server.address().port;
}

(framework === 'express' ? express() : fastify()).then((port) => {
  console.log(`listening on http://127.0.0.1:${port}`);
}, (err) => {
  console.error(err);
  process.exit(1);
});
