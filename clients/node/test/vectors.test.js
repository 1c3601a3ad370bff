'use strict';
// clients/http-vectors.json, the HTTP contract (docs/http-contract.md) as request sequences, on
// Express and Fastify over real HTTP.  The Python suite plays the same file on Starlette, Flask
// and Django (clients/python/tests/test_http_vectors.py): any answer that differs from the
// file's fails, so the two languages answer alike.  Each framework gets a database of its own.
const { describe, test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { Pool, Client } = require('pg');
const { Idempo } = require('idempo');

const file = process.env.IDEMPO_HTTP_VECTORS || path.join(__dirname, '..', '..', 'http-vectors.json');
const SPEC = JSON.parse(fs.readFileSync(file, 'utf8'));
const FORMS = { transaction: {}, lease: { mode: 'lease' } };

// the app of the vector file: status from the JSON body's reply_status (default 201), a new id
function answer(body) {
  const status = body !== null && typeof body === 'object' && Number.isInteger(body.reply_status) ? body.reply_status : 201;
  return { status, text: JSON.stringify({ id: crypto.randomUUID() }) };
}
const HEADERS = { 'content-type': 'application/json', 'x-vec': 'handler' };

async function expressApp(idem) {
  const express = require('express');
  const { idempotency } = require('idempo/express');
  const app = express();
  const keep = (req, res, buf) => { req.rawBody = buf; };
  app.use(express.json({ verify: keep }), express.text({ type: 'text/*', verify: keep }));
  for (const route of SPEC.app.routes) {
    app.post(route.path, idempotency(idem, { scope: route.scope, ...FORMS[route.form] }), (req, res) => {
      const { status, text } = answer(req.body);
      res.status(status).set(HEADERS).send(Buffer.from(text));
    });
  }
  // a body its parser refused: 400, as the framework answers it
  app.use((err, req, res, next) => {     // eslint-disable-line no-unused-vars
    res.status(err.status ?? 500).json({ title: 'error', status: err.status ?? 500 });
  });
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  return { port: server.address().port, close: () => new Promise((resolve) => server.close(resolve)) };
}

async function fastifyApp(idem) {
  const app = require('fastify')();
  await app.register(require('idempo/fastify'), { idem });
  for (const route of SPEC.app.routes) {
    app.post(route.path, { config: { idempotency: { scope: route.scope, ...FORMS[route.form] } } }, async (request, reply) => {
      const { status, text } = answer(request.body);
      return reply.code(status).headers(HEADERS).send(text);
    });
  }
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { port: app.server.address().port, close: () => app.close() };
}

function send(port, request) {
  return new Promise((resolve, reject) => {
    const body = Buffer.from(request.body ?? '', 'utf8');
    const headers = { 'content-length': String(body.length) };
    if (request.content_type) headers['content-type'] = request.content_type;
    // an array: one header line per key
    if (request.keys.length > 0) headers['idempotency-key'] = request.keys.length === 1 ? request.keys[0] : request.keys;
    const req = http.request({ host: '127.0.0.1', port, method: request.method, path: request.path, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// -> the differences from expect (none: as the contract says)
function check(expect, { status, headers, body }, replies, where) {
  const diff = [];
  if (status !== expect.status) diff.push(`status ${status}, expected ${expect.status}`);
  for (const [name, want] of Object.entries(expect.headers ?? {})) {
    const got = headers[name] ?? null;
    const ok = want !== null && typeof want === 'object'
      ? got !== null && /^\d+$/.test(got) && Number(got) >= want.min && Number(got) <= want.max
      : got === want;
    if (!ok) diff.push(`${name}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  }
  if (expect.problem) {
    let doc = {};
    try { doc = JSON.parse(body); } catch { /* compared below */ }
    const code = expect.problem;
    const want = {
      type: `${SPEC.problem_type_base}#${code}`, code, status: expect.status, title: SPEC.problem_titles[code], ...(expect.members ?? {}),
    };
    if (headers['content-type'] !== 'application/problem+json') {
      diff.push(`content-type ${JSON.stringify(headers['content-type'])}, expected application/problem+json`);
    }
    for (const [k, v] of Object.entries(want)) {
      if (doc[k] !== v) diff.push(`problem ${k}: ${JSON.stringify(doc[k])}, expected ${JSON.stringify(v)}`);
    }
  }
  if (expect.body !== undefined && body !== expect.body) diff.push(`body ${body}, expected ${expect.body}`);
  if (expect.same_body_as !== undefined && body !== replies[expect.same_body_as]) {
    diff.push(`body ${body}, expected the body of request ${expect.same_body_as}: ${replies[expect.same_body_as]}`);
  }
  return diff.map((d) => `${where}: ${d}`);
}

const admin = () => new Client({ database: 'postgres' });

for (const [framework, start] of [['express', expressApp], ['fastify', fastifyApp]]) {
  describe(`HTTP vectors on ${framework}`, () => {
    const database = `${process.env.PGDATABASE || 'idempo_node_test'}_vec_${framework}`;
    let pool;
    let app;
    before(async () => {
      const a = admin();
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
      await a.query(`CREATE DATABASE ${database}`);
      await a.end();
      pool = new Pool({ database, max: 10 });
      pool.on('error', () => {});
      await pool.query('CREATE EXTENSION IF NOT EXISTS idempo');
      for (const sql of SPEC.setup) await pool.query(sql);
      app = await start(new Idempo(pool));
    });
    after(async () => {
      if (app) await app.close();
      if (pool) await pool.end();
      const a = admin();
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
      await a.end();
    });

    for (const sequence of SPEC.sequences) {
      test(sequence.name, async () => {
        const held = new Client({ database });
        await held.connect();
        const replies = [];
        const diffs = [];
        try {
          for (const [i, step] of sequence.steps.entries()) {
            if (step.sql !== undefined) {
              const res = await (step.session === 'held' ? held : pool).query({ text: step.sql, rowMode: 'array' });
              if (step.rows !== undefined && JSON.stringify(res.rows) !== JSON.stringify(step.rows)) {
                diffs.push(`step ${i}: ${step.sql} gave ${JSON.stringify(res.rows)}, expected ${JSON.stringify(step.rows)}`);
              }
              continue;
            }
            const got = await send(app.port, step.request);
            replies.push(got.body);
            diffs.push(...check(step.expect, got, replies, `step ${i} (${got.status} ${got.body.slice(0, 200)})`));
          }
        } finally {
          await held.end();
        }
        assert.deepEqual(diffs, []);
      });
    }
  });
}
