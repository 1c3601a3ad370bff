'use strict';
// A small shop API whose POSTs are made idempotent by the Idempotency-Key header (see
// idempotency.js):
//   POST /orders    {customer, sku, qty}      one transaction: claim + INSERT + complete
//   POST /payments  {order_id, amount_cents}  two transactions around a call to the payment
//                                             provider (PROVIDER_URL), which honours our key
// Environment: PGHOST, PGPORT, PGDATABASE, PGUSER (libpq's names; without PGHOST, Debian's socket
// directory, as libpq does there), PROVIDER_URL, HTTP_PORT (0: any free port).  Checks the
// database first and exits with status 1 if it cannot use it; then listens on 127.0.0.1 only and
// prints "listening on http://127.0.0.1:PORT".
const http = require('node:http');
const { Pool } = require('pg');
const { serve, send, json, problem, Refusal } = require('./idempotency');
const { request: httpRequest } = require('./client');

// node-postgres, unlike libpq, defaults to TCP on localhost; use the Unix socket as psql does.
const pool = new Pool({ host: process.env.PGHOST || '/var/run/postgresql', application_name: 'idempo-http-node' });
const PROVIDER_URL = process.env.PROVIDER_URL ?? 'http://127.0.0.1:9099';

function requireJsonObject(request) {
  if (request.json === undefined) return problem(415, 'json-only', 'Send application/json', `Got "${request.mediaType}".`);
  if (typeof request.json !== 'object' || request.json === null || Array.isArray(request.json)) {
    return problem(400, 'invalid-body', 'The body must be a JSON object', '');
  }
  return null;
}

// A value for an integer column (JSON.parse already made 2.0 the number 2).
function whole(value) {
  return Number.isInteger(value) && Math.abs(value) < 2 ** 31;
}

function validateOrder(request) {
  const { customer, sku, qty } = request.json ?? {};
  return requireJsonObject(request)
    ?? (typeof customer === 'string' && typeof sku === 'string' && whole(qty) && qty > 0
      ? null
      : problem(400, 'invalid-order', 'Invalid order', 'Need customer and sku (strings) and qty (a positive integer).'));
}

async function createOrder(db, request) {
  const { customer, sku, qty } = request.json;
  const { rows: [order] } = await db.query(
    'INSERT INTO shop.orders (customer, sku, qty) VALUES ($1, $2, $3) RETURNING id, customer, sku, qty',
    [customer, sku, qty]);
  return json(201, order);
}

function validatePayment(request) {
  const { order_id: orderId, amount_cents: amount } = request.json ?? {};
  return requireJsonObject(request)
    ?? (whole(orderId) && whole(amount) && amount > 0
      ? null
      : problem(400, 'invalid-payment', 'Invalid payment', 'Need order_id and amount_cents (positive integers).'));
}

// The outside call.  Our key goes along, so a retried call returns the charge already made.
async function chargeCard(request, providerKey) {
  const answer = await httpRequest(`${PROVIDER_URL}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': providerKey },
    body: JSON.stringify({ amount_cents: request.json.amount_cents, reference: `order-${request.json.order_id}` }),
    timeoutMs: 10000,       // well inside the scope's 30 s lease
  });
  if (answer.status !== 200 && answer.status !== 201) throw new Error(`provider answered ${answer.status}`);
  return JSON.parse(answer.body);
}

async function recordPayment(db, request, charge) {
  const { rows: [payment] } = await db.query(
    `INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES ($1, $2, $3)
     RETURNING id, order_id, amount_cents, charge_id`,
    [request.json.order_id, request.json.amount_cents, charge.id]);
  return json(201, payment);
}

const routes = new Map([
  ['POST /orders', { scope: 'http.orders', validate: validateOrder, handler: createOrder }],
  ['POST /payments', { scope: 'http.payments', validate: validatePayment, callOut: chargeCard, record: recordPayment }],
]);

const server = http.createServer(async (req, res) => {
  const route = routes.get(`${req.method} ${new URL(req.url, 'http://localhost').pathname}`);
  try {
    send(res, route ? await serve(pool, route, req) : problem(404, 'not-found', 'No such endpoint', req.url));
  } catch (err) {
    if (err instanceof Refusal) return send(res, err.reply);
    console.error(`${req.method} ${req.url} failed: ${err.message}`);
    return send(res, problem(500, 'internal', 'Internal error', 'Nothing was stored; retry with the same Idempotency-Key.'));
  }
});

// Fail at start-up, loudly, rather than answer every request with 500: the database must be
// reachable, with schema.sql loaded (the shop's tables and both scopes).
async function checkDatabase() {
  try {
    await pool.query(`SELECT 'shop.orders'::regclass, 'shop.payments'::regclass,
                             idempo.lookup('http.orders', 'start-up check'), idempo.lookup('http.payments', 'start-up check')`);
  } catch (err) {
    const user = process.env.PGUSER ?? process.env.USER;
    const where = `host=${pool.options.host} port=${process.env.PGPORT ?? 5432} ` +
      `dbname=${process.env.PGDATABASE ?? user} user=${user}`;
    console.error(`cannot use the database (${where}): ${err.message}\n` +
      'Set PGHOST, PGPORT, PGDATABASE and PGUSER, and load schema.sql into that database.');
    process.exit(1);
  }
}

checkDatabase().then(() => {
  server.listen(Number(process.env.HTTP_PORT ?? 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
});

// Stop accepting, drop idle keep-alive connections, then close the pool.
process.on('SIGTERM', () => {
  server.close();
  server.closeIdleConnections();
  pool.end().finally(() => process.exit(0));
});
