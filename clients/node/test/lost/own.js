'use strict';
// Run by test/connection.test.js as a child process: the application's own checkout of a pool
// client that once() used before, its connection ended by the server while the application
// holds it without an 'error' listener of its own.  Without idempo the process ends (node-postgres
// says: listen on a client you hold); idempo's guard on that client must not swallow the error.
// Prints "lived" if the process outlived the end of the connection.
const { Pool } = require('pg');
const idempo = require('../..');

async function main() {
  const pool = new Pool({ max: 1, application_name: 'idempo-node-test-own' });
  pool.on('error', () => {});
  const idem = new idempo.Idempo(pool);
  const scope = `own.${process.pid}`;
  await pool.query('SELECT idempo.create_scope($1)', [scope]);
  await idem.once(scope, 'k-1', async () => ({ n: 1 }));
  const client = await pool.connect();           // the client once() used (max: 1)
  const { rows: [{ pid }] } = await client.query('SELECT pg_backend_pid() AS pid');
  const ended = new Promise((resolve) => client.once('end', resolve));
  const other = new (require('pg').Client)();
  await other.connect();
  await other.query('SELECT pg_terminate_backend($1)', [pid]);
  await other.end();
  await ended;
  await new Promise((resolve) => setImmediate(resolve));
  console.log('lived');
  process.exit(0);
}
main().catch((err) => { console.error(err); process.exit(2); });
