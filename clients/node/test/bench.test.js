'use strict';
// The benchmark (bench/overhead.js) in its short mode: it runs and prints its table.  No timing
// is asserted (the numbers are in docs/node.md, measured by hand).
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

test('bench/overhead.js --short runs both sides and prints the overhead and the CPU per case', () => {
  const r = spawnSync(process.execPath, [path.join(__dirname, '..', 'bench', 'overhead.js'), '--short'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^acquired +[\d.]+ +[\d.]+ +-?[\d.]+ % +\d+ +\d+ +-?\d+$/m);
  assert.match(r.stdout, /^replay +[\d.]+ +[\d.]+ +-?[\d.]+ % +\d+ +\d+ +-?\d+$/m);
});
