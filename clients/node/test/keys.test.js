'use strict';
// The stored key and the stored reply, without a database: the key derivation of
// clients/key-vectors.json (idempo's Python middleware reads the same list, so a service in
// either language stores the same key for the same request), and the per-client headers a
// stored reply leaves out.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { keyOf, Refusal, storedReply, defaultStore } = require('../lib/http');

test('keys derive as the shared vectors say (tenant and field values escaped, no tenant refused)', () => {
  const file = process.env.IDEMPO_KEY_VECTORS || path.join(__dirname, '..', '..', 'key-vectors.json');
  const { vectors } = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.ok(vectors.length > 10);
  for (const v of vectors) {
    const options = {};
    if (v.fields) options.key = { fields: v.fields };
    if ('tenant' in v) options.tenant = () => v.tenant;
    const headerValues = (name) => (name === 'idempotency-key' && v.header !== undefined ? v.header : undefined);
    let got;
    try {
      got = keyOf({}, options, { headerValues, body: v.body ?? {} });
    } catch (err) {
      assert.ok(err instanceof Refusal, `${JSON.stringify(v)}: ${err}`);
      assert.equal(v.key, null, JSON.stringify(v));
      assert.equal(err.reply.status, v.status, JSON.stringify(v));
      if (v.problem) assert.ok(JSON.parse(err.reply.body).type.endsWith(`#${v.problem}`), `${JSON.stringify(v)}: ${err.reply.body}`);
      continue;
    }
    assert.equal(got, v.key, JSON.stringify(v));
  }
});

test('per-client headers (set-cookie...) are not stored unless keepHeaders names them', () => {
  const headers = { 'content-type': 'application/json', 'set-cookie': ['sid=1', 'b=2'], 'authentication-info': 'x', location: '/orders/1' };
  assert.deepEqual(storedReply(201, headers, Buffer.from('{}')).headers,
    [['content-type', 'application/json'], ['location', '/orders/1']]);
  assert.deepEqual(storedReply(201, headers, Buffer.from('{}'), ['Set-Cookie']).headers,
    [['content-type', 'application/json'], ['set-cookie', 'sid=1'], ['set-cookie', 'b=2'], ['location', '/orders/1']]);
});

test('401 and 403 are not stored by default: they answer for the caller, not the operation', () => {
  // a login that had expired, a CSRF check: stored, the mended caller got them back under its key
  assert.deepEqual([401, 403].map(defaultStore), [false, false]);
  assert.deepEqual([200, 201, 302, 402, 404, 410].map(defaultStore), [true, true, true, true, true, true]);
});

test('JSON depth: 64 levels of arrays and objects pass, 65 do not, brackets inside strings do not count (text or parsed)', () => {
  const { jsonTooDeep, MAX_JSON_DEPTH } = require('../lib/http');
  const nest = (depth) => `${'['.repeat(depth)}${']'.repeat(depth)}`;
  const cases = [
    [nest(64), false], [nest(65), true], [`{"a":${nest(63)}}`, false], [`{"a":${nest(64)}}`, true],
    [`["${'['.repeat(100)}"]`, false], [`{"a\\"[[[":${nest(64)}}`, true], [`["\\\\",${nest(63)}]`, false],
    [`[{"a":[{"b":${nest(60)}}]}]`, false], [`[{"a":[{"b":${nest(61)}}]}]`, true],
  ];
  assert.equal(MAX_JSON_DEPTH, 64);
  for (const [text, deep] of cases) {
    assert.equal(jsonTooDeep(text), deep, text);
    assert.equal(jsonTooDeep(JSON.parse(text)), deep, `parsed ${text}`);
  }
});
