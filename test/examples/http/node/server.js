'use strict';
// A small shop API whose POSTs are made idempotent by the Idempotency-Key header, with Express
// and idempo's Node.js library (clients/node: its middleware idempo/express does the claim,
// the replay and every refusal; see docs/node.md):
//   POST /orders    {customer, sku, qty}      one transaction: claim + INSERT + stored reply
//   POST /payments  {order_id, amount_cents}  mode 'lease': the claim commits with a lease (kept
//                                             by a heartbeat) around a call to the payment
//                                             provider (PROVIDER_URL), which honours our key; the
//                                             INSERT commits with the stored reply
// Environment: PGHOST, PGPORT, PGDATABASE, PGUSER (libpq's names; without PGHOST, Debian's socket
// directory, as libpq does there), PROVIDER_URL, HTTP_PORT (0: any free port).  Checks the
// database first and exits with status 1 if it cannot use it; then listens on 127.0.0.1 only and
// prints "listening on http://127.0.0.1:PORT".
const express = require('express');
const { Pool } = require('pg');
const { Idempo } = require('idempo');
const { idempotency, send } = require('idempo/express');
const { request: httpRequest } = require('./client');

// node-postgres, unlike libpq, defaults to TCP on localhost; use the Unix socket as psql does.
const pool = new Pool({ host: process.env.PGHOST || '/var/run/postgresql', application_name: 'idempo-http-node' });
// an idle client ended by the server (a restart) emits 'error' here: without a listener the
// process ends
pool.on('error', (err) => console.error(`idle database client: ${err.message}`));
const idem = new Idempo(pool);
const PROVIDER_URL = process.env.PROVIDER_URL ?? 'http://127.0.0.1:9099';
const DOCS = 'https://example.com/docs/idempotency';   // point problem types at your API docs

// RFC 9457 problem details, as the draft's examples use (the middleware answers the same way).
function problem(res, status, slug, title, detail) {
  send(res, {
    status,
    headers: { 'content-type': 'application/problem+json' },
    body: JSON.stringify({ type: `${DOCS}#${slug}`, title, status, detail }),
  });
}

// Validation runs before the middleware: a refused request uses up no key (as Stripe does).
function validate(check) {
  return (req, res, next) => {
    if (!req.is('application/json') && !req.is('application/*+json')) {
      return problem(res, 415, 'json-only', 'Send application/json', `Got "${req.headers['content-type'] ?? ''}".`);
    }
    if (typeof req.body !== 'object' || req.body === null || Array.isArray(req.body)) {
      return problem(res, 400, 'invalid-body', 'The body must be a JSON object', '');
    }
    const why = check(req.body);
    return why ? problem(res, 400, why[0], why[1], why[2]) : next();
  };
}
// A value for an integer column (JSON.parse already made 2.0 the number 2).
const whole = (value) => Number.isInteger(value) && Math.abs(value) < 2 ** 31;
const validOrder = ({ customer, sku, qty }) => (typeof customer === 'string' && typeof sku === 'string' && whole(qty) && qty > 0
  ? null : ['invalid-order', 'Invalid order', 'Need customer and sku (strings) and qty (a positive integer).']);
const validPayment = ({ order_id: orderId, amount_cents: amount }) => (whole(orderId) && whole(amount) && amount > 0
  ? null : ['invalid-payment', 'Invalid payment', 'Need order_id and amount_cents (positive integers).']);

// The outside call.  Our key goes along, so a retried call returns the charge already made.
async function chargeCard(body, providerKey) {
  const answer = await httpRequest(`${PROVIDER_URL}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': providerKey },
    body: JSON.stringify({ amount_cents: body.amount_cents, reference: `order-${body.order_id}` }),
    timeoutMs: 10000,       // well inside the scope's 30 s lease (and the heartbeat extends it)
  });
  if (answer.status !== 200 && answer.status !== 201) throw new Error(`provider answered ${answer.status}`);
  return JSON.parse(answer.body);
}

const app = express();
app.disable('x-powered-by');
// rawBody: the fingerprint takes the JSON text as sent, so big numbers keep every digit
app.use(express.json({ type: ['application/json', 'application/*+json'], limit: '1mb',
  verify: (req, res, buf) => { req.rawBody = buf; } }));

app.post('/orders', validate(validOrder), idempotency(idem, { scope: 'http.orders', problemTypeBase: DOCS }),
  async (req, res) => {
    const { customer, sku, qty } = req.body;
    const { rows: [order] } = await req.idempotency.tx.query(
      'INSERT INTO shop.orders (customer, sku, qty) VALUES ($1, $2, $3) RETURNING id, customer, sku, qty',
      [customer, sku, qty]);
    res.status(201).json(order);
  });

// A reply of 500 or 502 is not stored (the middleware's default rule).  onError: 'retry' fails
// the attempt as retryable and the retry runs as the next attempt.  That is right here only
// because the provider honours our key: a retry cannot charge twice there.  (The default,
// 'doubt', leaves the attempt to its lease: 409, then unknown, and a person or a verifier decides.)
app.post('/payments', validate(validPayment),
  idempotency(idem, { scope: 'http.payments', mode: 'lease', onError: 'retry', problemTypeBase: DOCS }),
  async (req, res) => {
    let charge;
    try {
      charge = await chargeCard(req.body, `${req.idempotency.scope}/${req.idempotency.key}`);
    } catch (err) {
      return problem(res, 502, 'upstream-failed', 'The payment provider did not answer',
        'Nothing was recorded; retry with the same Idempotency-Key.');
    }
    const tx = await req.idempotency.transaction();
    const { rows: [payment] } = await tx.query(
      `INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES ($1, $2, $3)
       RETURNING id, order_id, amount_cents, charge_id`,
      [req.body.order_id, req.body.amount_cents, charge.id]);
    return res.status(201).json(payment);
  });

app.use((req, res) => problem(res, 404, 'not-found', 'No such endpoint', req.url));
// Errors: a body the parser refused (before the claim), or the handler's (not stored: 500).
app.use((err, req, res, next) => {     // eslint-disable-line no-unused-vars
  if (err.type === 'entity.parse.failed') return problem(res, 400, 'invalid-json', 'The body is not valid JSON', err.message);
  if (err.type === 'entity.too.large') return problem(res, 413, 'too-large', 'Request body too large', 'At most 1 MB.');
  console.error(`${req.method} ${req.url} failed: ${err.message}`);
  return problem(res, 500, 'internal', 'Internal error', 'Nothing was stored; retry with the same Idempotency-Key.');
});

// Fail at start-up, loudly, rather than answer every request with 500: the database must be
// reachable, with idempo 0.3 and schema.sql loaded (the shop's tables and both scopes).
async function checkDatabase() {
  try {
    await pool.query(`SELECT 'shop.orders'::regclass, 'shop.payments'::regclass,
                             idempo.lookup('http.orders', 'start-up check'), idempo.lookup('http.payments', 'start-up check')`);
    await idem.ensureVersion();       // idempo 0.3.x (the library refuses another version, naming both)
  } catch (err) {
    const user = process.env.PGUSER ?? process.env.USER;
    const where = `host=${pool.options.host} port=${process.env.PGPORT ?? 5432} ` +
      `dbname=${process.env.PGDATABASE ?? user} user=${user}`;
    console.error(`cannot use the database (${where}): ${err.message}\n` +
      'Set PGHOST, PGPORT, PGDATABASE and PGUSER, and load schema.sql into that database.');
    process.exit(1);
  }
}

let server;
checkDatabase().then(() => {
  server = app.listen(Number(process.env.HTTP_PORT ?? 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
});

// Stop accepting, drop idle keep-alive connections, then close the pool.
process.on('SIGTERM', () => {
  if (server) {
    server.close();
    server.closeIdleConnections();
  }
  pool.end().finally(() => process.exit(0));
});
