'use strict';
// How idempo reaches the database.  The library never loads a driver itself (so that an
// application's own copy of pg, Knex, Kysely or Prisma is the one used, also when this package
// is linked with `npm install ./clients/node`); an adapter turns the application's object into
//   query(text, values) -> rows      one statement; text uses $1, $2, ... once each, in order
//   transaction(fn)                  fn(adapter of the transaction), committed if fn resolves
//   handle                           what a user's function gets to write in the transaction
//   bind(handle)                     the adapter of a transaction the caller opened
// SQL text written for these adapters casts every result column to a plain type (text, int,
// jsonb, timestamptz) so that every driver can read it (Prisma reads no custom enum).

// node-postgres: a Pool, a Client, or a PoolClient (pool.connect()).
// A Client or PoolClient is one connection: the library's operations on it take turns (a
// transaction holds it from BEGIN to COMMIT), else two concurrent once() calls would interleave
// BEGIN/COMMIT into one transaction (a rollback of one taking the other's claim and work with
// it), and a callOnce claim sent while a transaction is open would not be committed before its
// call.  The turn is per connection object, shared by every Idempo on it.
// A call made while its own turn runs (idem.lookup() inside once()'s function) runs in that turn
// rather than wait for it to end (which would never come).
const { AsyncLocalStorage } = require('node:async_hooks');
const { ConnectionLostError, isConnectionError } = require('./errors');
const turns = new WeakMap();
const holding = new AsyncLocalStorage();
function inTurn(conn, fn) {
  const held = holding.getStore();
  if (held && held.has(conn)) return fn();
  const mine = new Set(held ?? []).add(conn);
  const run = (turns.get(conn) ?? Promise.resolve()).then(() => holding.run(mine, fn));
  turns.set(conn, run.catch(() => {}));
  return run;
}
const rowsOf = (result) => result.rows;

// A client checked out of a pool is ours until released: pg-pool removes its own idle 'error'
// listener at checkout, and a connection the server ends while the transaction is idle (a
// restart, pg_terminate_backend) emits 'error' on the client, which without a listener ends the
// process.  The guard fails the transaction instead (the client is then released as broken:
// the pool discards it).  It is attached once per client and stays (an add and a remove per
// transaction are work the same SQL by hand does not do), and attached again when it is gone
// (an application's removeAllListeners() on a client it checked out itself).  Out of the
// library's transactions, when it is the client's only listener, it steps aside and the error
// is emitted unhandled: an application's own checkout of the client ends the process as
// without idempo.
const guards = new WeakMap();
function guardOf(client) {
  let guard = guards.get(client);
  if (guard === undefined) {
    const g = { active: false, lost: null, listener: null };
    g.listener = (err) => {
      if (g.active) {
        g.lost = g.lost ?? err;
      } else if (client.listenerCount('error') === 1) {
        client.removeListener('error', g.listener);
        client.emit('error', err);             // unhandled, as without idempo
      }
    };
    client.on('error', g.listener);
    guards.set(client, g);
    guard = g;
  } else if (!client.listeners('error').includes(guard.listener)) {
    client.on('error', guard.listener);
  }
  return guard;
}

// A pool's transaction: a client checked out, BEGIN, fn(the client's adapter), COMMIT.
async function poolTransaction(pool, fn) {
  let client;
  try {
    client = await pool.connect();
  } catch (err) {
    throw isConnectionError(err) ? ConnectionLostError.of(err) : err;
  }
  const guard = guardOf(client);
  guard.active = true;
  guard.lost = null;
  let broken;
  try {
    await client.query('BEGIN');
    const value = await fn(txAdapterOf(client));
    await client.query('COMMIT');
    return value;
  } catch (err) {
    // A failed COMMIT has ended the transaction already; ROLLBACK then only warns.
    await client.query('ROLLBACK').catch((e) => { broken = e; });
    if (guard.lost) throw ConnectionLostError.of(guard.lost);
    throw isConnectionError(err) ? ConnectionLostError.of(err) : err;
  } finally {
    guard.active = false;
    client.release(broken ?? guard.lost ?? undefined);
  }
}

// The adapter of a client in a transaction: made once per client (a pool's clients serve
// transaction after transaction; it keeps nothing of one transaction).
const txAdapters = new WeakMap();
function txAdapterOf(client) {
  let adapter = txAdapters.get(client);
  if (adapter === undefined) {
    adapter = pg(client, { inTransaction: true });
    txAdapters.set(client, adapter);
  }
  return adapter;
}

function pg(db, { inTransaction = false } = {}) {
  const isPool = typeof db.connect === 'function' && 'totalCount' in db && typeof db.release !== 'function';
  const exclusive = isPool || inTransaction ? (fn) => fn() : (fn) => inTurn(db, fn);
  return {
    kind: 'pg',
    handle: db,
    inTransaction,
    query(text, values) {
      // a pool, or a transaction's client: no turn to take, and one promise less per statement
      if (isPool || inTransaction) {
        try {
          return db.query(text, values).then(rowsOf);
        } catch (err) {
          return Promise.reject(err);        // a rejection, as the async function it was gave
        }
      }
      return exclusive(async () => (await db.query(text, values)).rows);
    },
    // the driver's own promise of its result ({rows}): one promise less than query() where
    // the library reads the rows itself (once()); only where no turn is taken
    result: isPool || inTransaction ? (text, values) => db.query(text, values) : undefined,
    transaction(fn) {
      if (isPool) return poolTransaction(db, fn);
      return exclusive(() => this._transaction(fn));
    },
    // A Client's (or a PoolClient's) own transaction, in its turn.
    async _transaction(fn) {
      const client = db;
      try {
        await client.query('BEGIN');
        const value = await fn(txAdapterOf(client));
        await client.query('COMMIT');
        return value;
      } catch (err) {
        // A failed COMMIT has ended the transaction already; ROLLBACK then only warns.
        await client.query('ROLLBACK').catch(() => {});
        throw isConnectionError(err) ? ConnectionLostError.of(err) : err;
      }
    },
    bind(handle) {
      return pg(handle, { inTransaction: true });
    },
  };
}

// Knex (over pg): the knex instance, or a transaction `trx` of knex.transaction().
function toQuestionMarks(text) {
  let next = 1;
  return text.replace(/\$(\d+)/g, (_, n) => {
    if (Number(n) !== next) throw new Error(`idempo: placeholder $${n} out of order for Knex`);
    next += 1;
    return '?';
  });
}
function knex(db, { inTransaction = Boolean(db.isTransaction) } = {}) {
  return {
    kind: 'knex',
    handle: db,
    inTransaction,
    async query(text, values) {
      const out = await db.raw(toQuestionMarks(text), values);
      return out.rows ?? out;
    },
    transaction(fn) {
      return db.transaction((trx) => fn(knex(trx, { inTransaction: true })));
    },
    bind(handle) {
      return knex(handle, { inTransaction: true });
    },
  };
}

// Prisma: the PrismaClient, or the `tx` of prisma.$transaction(async (tx) => ...).
// options.transaction: passed to $transaction (e.g. {timeout: 10000}; Prisma's default is 5 s).
// A tx is told by its missing $connect (denied in an interactive transaction by every Prisma
// since 4), not by $transaction: Prisma 7's tx has one (nested transactions), and a tx taken for
// the client would let callOnce commit its claim only with the caller's transaction.
function prisma(db, { inTransaction = typeof db.$connect !== 'function', transaction } = {}) {
  return {
    kind: 'prisma',
    handle: db,
    inTransaction,
    query(text, values) {
      return db.$queryRawUnsafe(text, ...values);
    },
    transaction(fn) {
      return db.$transaction((tx) => fn(prisma(tx, { inTransaction: true })), transaction);
    },
    bind(handle) {
      return prisma(handle, { inTransaction: true });
    },
  };
}

// Kysely (PostgresDialect): the Kysely instance or a transaction, and Kysely's CompiledQuery
// class (the application's copy: `const { CompiledQuery } = require('kysely')`).
function kysely(db, { CompiledQuery, inTransaction = Boolean(db.isTransaction) } = {}) {
  if (!CompiledQuery || typeof CompiledQuery.raw !== 'function') {
    throw new TypeError("idempo.kysely(db, { CompiledQuery }): pass CompiledQuery from 'kysely'");
  }
  return {
    kind: 'kysely',
    handle: db,
    inTransaction,
    async query(text, values) {
      return (await db.executeQuery(CompiledQuery.raw(text, values))).rows;
    },
    transaction(fn) {
      return db.transaction().execute((trx) => fn(kysely(trx, { CompiledQuery, inTransaction: true })));
    },
    bind(handle) {
      return kysely(handle, { CompiledQuery, inTransaction: true });
    },
  };
}

function isAdapter(x) {
  return x && typeof x.query === 'function' && typeof x.transaction === 'function' && typeof x.bind === 'function'
    && typeof x.kind === 'string';
}

// The adapter for what the application passed: an adapter already, or a pg Pool/Client/PoolClient.
function toAdapter(db) {
  if (isAdapter(db)) return db;
  if (db && typeof db.query === 'function' && typeof db.connect === 'function') return pg(db);
  if (db && typeof db.query === 'function' && typeof db.release === 'function') return pg(db);
  throw new TypeError('idempo: pass a pg Pool, Client or PoolClient, or an adapter: '
    + 'idempo.knex(knex), idempo.prisma(prisma), idempo.kysely(db, { CompiledQuery })');
}

module.exports = { pg, knex, prisma, kysely, toAdapter, toQuestionMarks };
