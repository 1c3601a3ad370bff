'use strict';
// A stand-in payment provider over HTTP, for the two-system tests.  It does NOT deduplicate:
// every charge it performs is counted per key, so a doubled action shows.  Faults, by
// probability or by the request's "fault" field:
//   drop-request   the connection is cut before anything is done
//   drop-reply     the charge is made, then the connection is cut (a lost reply)
//   late           the connection is cut at once, the charge is made lateMs later (in flight)
//   decline        402, nothing done
// With dedupe, a key charged already gets its first charge back (as real providers do);
// state.failNext answers 503 that many times; state.gate (a promise) holds calls.
// GET /charges?key=K is the lookup: 200 {id} or 404.
const http = require('node:http');
const crypto = require('node:crypto');

function startProvider({ faults = {}, lateMs = 300, dedupe = false } = {}) {
  const state = { actions: new Map(), charges: new Map(), requests: 0, lookups: 0, gate: null, failNext: 0, waiting: 0 };
  const pick = (forced) => {
    if (forced) return forced;
    let r = Math.random();
    for (const [fault, p] of Object.entries(faults)) {
      if (r < p) return fault;
      r -= p;
    }
    return 'ok';
  };
  const perform = (key, body) => {
    state.actions.set(key, (state.actions.get(key) ?? 0) + 1);
    const charge = { id: `ch_${crypto.randomUUID()}`, key, amount: body.amount };
    state.charges.set(key, charge);
    return charge;
  };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const url = new URL(req.url, 'http://x');
      if (req.method === 'GET' && url.pathname === '/charges') {
        state.lookups += 1;
        const charge = state.charges.get(url.searchParams.get('key'));
        if (!charge) return res.writeHead(404).end();
        return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(charge));
      }
      state.requests += 1;
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
      const key = req.headers['idempotency-key'];
      if (state.gate) {
        state.waiting += 1;
        await state.gate;
        state.waiting -= 1;
      }
      if (state.failNext > 0) {
        state.failNext -= 1;
        return res.writeHead(503).end();
      }
      // dedupe: honours Idempotency-Key as real providers do (the answer of the first charge)
      if (dedupe && state.charges.has(key)) {
        return res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify(state.charges.get(key)));
      }
      const fault = pick(body.fault);
      if (fault === 'drop-request') return req.socket.destroy();
      if (fault === 'decline') return res.writeHead(402, { 'content-type': 'application/json' }).end('{"error":"declined"}');
      if (fault === 'late') {
        req.socket.destroy();
        setTimeout(() => perform(key, body), lateMs);
        return undefined;
      }
      const charge = perform(key, body);
      if (fault === 'drop-reply') return req.socket.destroy();
      return res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify(charge));
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
    resolve({ server, state, url: `http://127.0.0.1:${server.address().port}` });
  }));
}

// A small client: resolves {status, body} or rejects (a cut connection, a timeout).
function request(url, { method = 'GET', headers = {}, body, timeoutMs = 5000, signal } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, timeout: timeoutMs, signal, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}

class Declined extends Error {}

// The application's side: charge(key, amount) and findCharge(key) against the provider.
function providerClient(url, { timeoutMs = 2000 } = {}) {
  return {
    async charge(key, amount, extra = {}, signal) {
      const r = await request(`${url}/charges`, {
        method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ amount, ...extra }), timeoutMs, signal,
      });
      if (r.status === 402) throw new Declined('declined');
      if (r.status !== 201) throw new Error(`provider answered ${r.status}`);
      return JSON.parse(r.body);
    },
    async findCharge(key) {
      const r = await request(`${url}/charges?key=${encodeURIComponent(key)}`, { timeoutMs });
      if (r.status === 404) return null;
      if (r.status !== 200) throw new Error(`lookup answered ${r.status}`);
      return JSON.parse(r.body);
    },
  };
}

module.exports = { startProvider, providerClient, request, Declined };
