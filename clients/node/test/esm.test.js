'use strict';
// An application written as ES modules ("type": "module", or TypeScript compiled for Node's
// ESM) imports the library by name: `import { Idempo } from 'idempo'`.  Node gives a CommonJS
// module's named exports only where its static analysis (cjs-module-lexer) finds them, and
// TypeScript's check does not run that analysis: tsc accepts the import, Node refuses it at
// start ("Named export 'Idempo' not found").  Every name require() gives must be importable.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');

for (const spec of ['idempo', 'idempo/express', 'idempo/fastify', 'idempo/http']) {
  test(`import { ... } from '${spec}' in an ES module: every exported name`, () => {
    const names = Object.keys(require(spec)).sort();
    const script = `import * as m from ${JSON.stringify(spec)};\n`
      + `const names = ${JSON.stringify(names)};\n`
      + 'const missing = names.filter((n) => !(n in m));\n'
      + 'if (missing.length) { console.log(missing.join(" ")); process.exit(1); }\n';
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: __dirname, encoding: 'utf8' });
    assert.equal(r.status, 0, `not importable by name from ${spec}: ${r.stdout}${r.stderr}`);
  });
}
