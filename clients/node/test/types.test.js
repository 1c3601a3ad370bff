'use strict';
// The hand-written declarations (index.d.ts, express.d.ts, fastify.d.ts) compile against usage
// files with TypeScript's strict checks, resolving the package by its name as an application
// would (package.json's "exports" and "types"): usage.ts as CommonJS, usage-esm.mts as an ES
// module (where a CommonJS module's default import is its module.exports).
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

test('tsc --noEmit: the declarations compile against their documented use', () => {
  const tsc = require.resolve('typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '-p', path.join(__dirname, 'types')], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
