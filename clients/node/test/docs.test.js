'use strict';
// The ```js blocks of docs/node.md, run as written (test/docs runs its sql and sh blocks; this
// runs the JavaScript ones).  Its ```sql blocks run first, in order, on the test database.  A
// block whose first line is "// server.js" is started (PORT=0), asked twice with the same
// Idempotency-Key (the second answer must be the replay), then stopped; every other block runs
// to its end and must exit 0; a "// a b c" comment at the end of its console.log line is the
// output it must print.  The ```ts block "// src/server.ts" is compiled with the ```jsonc block
// "// tsconfig.json" (tsc, in a project of ES modules where node_modules/idempo links to this
// package, as npm install makes it), then started and asked as server.js is.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const { newPool } = require('./helpers');
const { request } = require('./provider');

const DOC = path.join(__dirname, '..', '..', '..', 'docs', 'node.md');
const WORK = path.join(__dirname, '.docs');        // inside the package: require('idempo') resolves to it

function blocks(text) {
  const out = [];
  const re = /^```(\w+)\n([\s\S]*?)^```$/gm;
  let m;
  while ((m = re.exec(text)) !== null) out.push({ lang: m[1], code: m[2] });
  return out;
}

let pool;
const all = blocks(fs.readFileSync(DOC, 'utf8'));
before(async () => {
  pool = newPool();
  // a fresh run: the blocks create their tables and scopes
  await pool.query('DROP TABLE IF EXISTS orders');
  await pool.query("DELETE FROM idempo.operations WHERE scope IN ('shop.orders', 'shop.payments', 'shop.charges')");
  await pool.query("DELETE FROM idempo.conflicts WHERE scope IN ('shop.orders', 'shop.payments', 'shop.charges')");
  await pool.query("DELETE FROM idempo.scopes WHERE name IN ('shop.orders', 'shop.payments', 'shop.charges')").catch(() => {});
  for (const b of all.filter((x) => x.lang === 'sql')) await pool.query(b.code);
  fs.mkdirSync(WORK, { recursive: true });
});
after(async () => {
  await pool.end();
  fs.rmSync(WORK, { recursive: true, force: true });
});

function run(file, env = {}) {
  const child = spawn(process.execPath, [file], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (t) => { stdout += t; });
  child.stderr.setEncoding('utf8').on('data', (t) => { stderr += t; });
  return { child, output: () => ({ stdout, stderr }) };
}

test('docs/node.md has js blocks (server.js, ship.js, pay.js) and the TypeScript server', () => {
  const names = all.filter((b) => b.lang === 'js').map((b) => b.code.split('\n')[0]);
  for (const n of ['// server.js', '// ship.js', '// pay.js']) assert.ok(names.includes(n), `${n} in ${names}`);
  assert.ok(all.some((b) => b.lang === 'ts' && b.code.startsWith('// src/server.ts\n')), 'a ts block // src/server.ts');
  assert.ok(all.some((b) => b.lang === 'jsonc' && b.code.startsWith('// tsconfig.json\n')), 'a jsonc block // tsconfig.json');
});

// Starts a server block's file, asks it as the first section says, stops it.
async function askServer(file) {
  const r = run(file, { PORT: '0' });
  try {
    const url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no "listening": ${JSON.stringify(r.output())}`)), 20000);
      r.child.stdout.on('data', () => {
        const m = /listening on port (\d+)/.exec(r.output().stdout);
        if (m) { clearTimeout(timer); resolve(`http://127.0.0.1:${m[1]}`); }
      });
      r.child.on('exit', (code) => reject(new Error(`exited ${code}: ${JSON.stringify(r.output())}`)));
    });
    const key = crypto.randomUUID();
    const ask = (body) => request(`${url}/orders`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body,
    });
    const first = await ask('{"customer":"ada","sku":"A-7","qty":2}');
    assert.equal(first.status, 201, first.body);
    const again = await ask('{"qty":2,"sku":"A-7","customer":"ada"}');
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(again.body, first.body);
    assert.equal((await ask('{"customer":"ada","sku":"A-7","qty":5}')).status, 422);
    assert.equal((await request(`${url}/orders`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })).status, 400);
  } finally {
    r.child.kill();
  }
}

test('docs/node.md src/server.ts compiles with its tsconfig.json (tsc, strict) and runs as an ES module', async () => {
  const source = all.find((b) => b.lang === 'ts' && b.code.startsWith('// src/server.ts\n'));
  const tsconfig = all.find((b) => b.lang === 'jsonc' && b.code.startsWith('// tsconfig.json\n'));
  const dir = path.join(WORK, 'ts');
  fs.mkdirSync(path.join(dir, 'src'), { recursive: true });
  fs.mkdirSync(path.join(dir, 'node_modules'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'package.json'), '{ "type": "module", "private": true }\n');
  fs.writeFileSync(path.join(dir, 'tsconfig.json'), tsconfig.code);
  fs.writeFileSync(path.join(dir, 'src', 'server.ts'), source.code);
  fs.symlinkSync(path.join(__dirname, '..'), path.join(dir, 'node_modules', 'idempo'), 'dir');
  const tsc = spawnSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', dir], { encoding: 'utf8' });
  assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
  await askServer(path.join(dir, 'dist', 'server.js'));
});

for (const b of all.filter((x) => x.lang === 'js')) {
  const name = b.code.split('\n')[0].replace(/^\/\/\s*/, '');
  test(`docs/node.md ${name} runs as written`, async () => {
    const file = path.join(WORK, name);
    fs.writeFileSync(file, b.code);
    if (name === 'server.js') {
      await askServer(file);
      return;
    }
    const r = run(file);
    const code = await new Promise((resolve) => r.child.on('exit', resolve));
    const { stdout, stderr } = r.output();
    assert.equal(code, 0, stderr);
    // "console.log(...);  // a b c": the line it prints
    const expected = [...b.code.matchAll(/console\.log\(.*\);\s*\/\/ (.+)$/gm)].map((m) => m[1].trim());
    const printed = stdout.trim().split('\n').filter((l) => l !== '');
    for (const line of expected) assert.ok(printed.includes(line), `expected "${line}" in ${JSON.stringify(printed)}`);
  });
}
