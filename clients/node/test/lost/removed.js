'use strict';
// Run by test/connection.test.js as a child process: the application checks out a pool client
// that once() used, and before releasing it removes every 'error' listener on it
// (removeAllListeners, as cleanup code does; pg-pool adds its own again at release).  Then once()
// runs on that client and the server ends the connection while the function awaits: the
// library's guard must be on the client again, so once() fails with ConnectionLostError and the
// process lives.  Prints one JSON line if it does.
const { Pool, Client } = require('pg');
const idempo = require('../..');

async function terminate(pid) {
  const other = new Client();
  await other.connect();
  try {
    await other.query('SELECT pg_terminate_backend($1)', [pid]);
  } finally {
    await other.end();
  }
}

async function main() {
  const pool = new Pool({ max: 1, application_name: 'idempo-node-test-removed' });
  pool.on('error', () => {});
  const idem = new idempo.Idempo(pool);
  const scope = `removed.${process.pid}`;
  await pool.query('SELECT idempo.create_scope($1)', [scope]);
  await idem.once(scope, 'k-0', async () => 0);
  const own = await pool.connect();              // the client once() used (max: 1)
  own.on('error', () => {});
  await own.query('SELECT 1');
  if (process.argv[2] === 'all') own.removeAllListeners(); else own.removeAllListeners('error');
  own.release();
  let error = null;
  try {
    await idem.once(scope, 'k-1', async (tx) => {
      const { rows: [{ pid }] } = await tx.query('SELECT pg_backend_pid() AS pid');
      const ended = new Promise((resolve) => tx.once('end', resolve));   // the client's connection
      await terminate(pid);
      await ended;
      return 1;
    });
  } catch (err) {
    error = err;
  }
  const next = await idem.once(scope, 'k-1', async () => 2);
  console.log(JSON.stringify({ error: error && error.constructor.name, next: next.result }));
  await pool.end();
}
main().catch((err) => { console.error(err); process.exit(2); });
