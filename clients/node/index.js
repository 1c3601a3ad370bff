'use strict';
// idempo for Node.js: see docs/node.md.  No runtime dependencies: pass your own pg Pool (or a
// Knex, Kysely or Prisma adapter).
// Written so that Node's static analysis of CommonJS (cjs-module-lexer) finds every name: an ES
// module's `import { Idempo } from 'idempo'` gets only the names it finds (a spread of a
// variable, `...client`, hides them all; a spread of require() and `module.exports.x =` do not).
const adapters = require('./lib/adapters');

module.exports = {
  ...require('./lib/client'),
  ...require('./lib/errors'),
};
module.exports.pg = adapters.pg;
module.exports.knex = adapters.knex;
module.exports.prisma = adapters.prisma;
module.exports.kysely = adapters.kysely;
