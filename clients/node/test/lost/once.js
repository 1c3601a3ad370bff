'use strict';
// Run by test/connection.test.js as a child process, so that the test can tell whether this
// process survived: once() whose function awaits while the server ends its connection
// (pg_terminate_backend of the client once() checked out, its transaction idle; an earlier
// once() used the same client), then the same key again.  Prints one JSON line; PG* variables as for the tests.
const { Pool } = require('pg');
const idempo = require('../..');

async function main() {
  const pool = new Pool({ max: 4, application_name: 'idempo-node-test-lost' });
  // the pool's idle clients are the application's (docs/node.md: an application listens here)
  pool.on('error', () => {});
  const idem = new idempo.Idempo(pool);
  const scope = `lost.${process.pid}`;
  await pool.query('SELECT idempo.create_scope($1)', [scope]);
  // a transaction before on the same client: the guard once() leaves on it must still guard
  let before = null;
  await idem.once(scope, 'k-0', async (tx) => {
    before = (await tx.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    return { n: 0 };
  });
  let error = null;
  let sameClient = null;
  try {
    await idem.once(scope, 'k-1', { params: { n: 1 } }, async (tx) => {
      const { rows: [{ pid }] } = await tx.query('SELECT pg_backend_pid() AS pid');
      sameClient = pid === before;
      const ended = new Promise((resolve) => tx.once('end', resolve));
      await pool.query('SELECT pg_terminate_backend($1)', [pid]);
      await ended;                   // the connection is gone while its transaction is idle
      return { n: 1 };
    });
  } catch (err) {
    error = err;
  }
  const stored = await idem.lookup(scope, 'k-1');
  const next = await idem.once(scope, 'k-1', { params: { n: 1 } }, async () => ({ n: 2 }));
  console.log(JSON.stringify({
    error: error && error.name, typed: error instanceof idempo.ConnectionLostError, idempo: error instanceof idempo.IdempoError,
    cause: error && error.cause && error.cause.message, sameClient, storedAfterLoss: stored, next: next.result, replayed: next.replayed,
  }));
  await pool.end();
}
main().catch((err) => { console.error(err); process.exit(2); });
