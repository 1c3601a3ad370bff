'use strict';
// idempo for Node.js: see docs/node.md.  No runtime dependencies: pass your own pg Pool (or a
// Knex, Kysely or Prisma adapter).
const client = require('./lib/client');
const errors = require('./lib/errors');
const adapters = require('./lib/adapters');

module.exports = {
  ...client,
  ...errors,
  pg: adapters.pg,
  knex: adapters.knex,
  prisma: adapters.prisma,
  kysely: adapters.kysely,
};
