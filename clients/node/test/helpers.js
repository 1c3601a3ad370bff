'use strict';
// Shared by the tests: a pool on the test database (libpq's PG* variables; the runner sets
// PGDATABASE), scopes with unique names, and polling instead of sleeping and hoping.
const crypto = require('node:crypto');
const { Pool, Client } = require('pg');

function newPool(options = {}) {
  return new Pool({ max: 20, application_name: 'idempo-node-test', ...options });
}

let seq = 0;
// A new scope (create_scope's options as SQL text, e.g. "lease => '1 second'").
async function newScope(db, prefix, options = '') {
  seq += 1;
  const name = `${prefix}.${process.pid}.${seq}.${crypto.randomBytes(3).toString('hex')}`;
  await db.query(`SELECT idempo.create_scope($1${options ? `, ${options}` : ''})`, [name]);
  return name;
}

async function waitFor(what, condition, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const newKey = () => crypto.randomUUID();

async function one(db, sql, args = []) {
  return Object.values((await db.query(sql, args)).rows[0] ?? {})[0];
}

module.exports = { newPool, newScope, waitFor, sleep, newKey, one, Client };
