'use strict';
// What the library adds over the same SQL calls made by hand, interleaved in one invocation:
// the same pool, rounds alternating which side goes first, each side doing the same work.
//   once-acquired   a new key: BEGIN, claim, INSERT, complete, COMMIT
//   once-replay     a finished key: claim -> replay
// Usage: PG* variables (idempo installed, a database you may write); node bench/overhead.js
//   [--rounds 20] [--per-round 300] [--short]
// Prints a table of the median time per operation of each side and the overhead in percent,
// over the rounds.  No assertion: test/run runs --short only to see that it works.
const { Pool } = require('pg');
const crypto = require('node:crypto');
const { Idempo } = require('..');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? Number(args[i + 1]) : def; };
const short = args.includes('--short');
const ROUNDS = opt('--rounds', short ? 2 : 20);
const PER_ROUND = opt('--per-round', short ? 20 : 300);

async function main() {
  const pool = new Pool({ max: 2, application_name: 'idempo-node-bench' });
  const scope = `bench.node.${process.pid}.${crypto.randomBytes(3).toString('hex')}`;
  await pool.query('SELECT idempo.create_scope($1)', [scope]);
  await pool.query('CREATE TABLE IF NOT EXISTS bench_node_orders (id bigserial PRIMARY KEY, k text, qty int)');
  const idem = new Idempo(pool);
  await idem.ensureVersion();
  const params = { sku: 'A-7', qty: 2, customer: 'ada' };

  // --- by hand: what an application writes without the library ---
  const byHand = {
    async acquired(key) {
      const db = await pool.connect();
      try {
        await db.query('BEGIN');
        const { rows: [c] } = await db.query(
          'SELECT outcome::text, attempt, result FROM idempo.claim($1, $2, params => $3::jsonb)', [scope, key, JSON.stringify(params)]);
        if (c.outcome !== 'acquired') throw new Error(c.outcome);
        const { rows: [row] } = await db.query('INSERT INTO bench_node_orders (k, qty) VALUES ($1, $2) RETURNING id', [key, 2]);
        await db.query('SELECT idempo.complete($1, $2, result => $3::jsonb)', [scope, key, JSON.stringify({ id: row.id })]);
        await db.query('COMMIT');
        return row.id;
      } catch (err) {
        await db.query('ROLLBACK');
        throw err;
      } finally {
        db.release();
      }
    },
    async replay(key) {
      const db = await pool.connect();
      try {
        await db.query('BEGIN');
        const { rows: [c] } = await db.query(
          'SELECT outcome::text, attempt, result FROM idempo.claim($1, $2, params => $3::jsonb)', [scope, key, JSON.stringify(params)]);
        await db.query('COMMIT');
        if (c.outcome !== 'replay') throw new Error(c.outcome);
        return c.result;
      } finally {
        db.release();
      }
    },
  };
  // --- the library ---
  const lib = {
    async acquired(key) {
      const done = await idem.once(scope, key, { params }, async (tx) => {
        const { rows: [row] } = await tx.query('INSERT INTO bench_node_orders (k, qty) VALUES ($1, $2) RETURNING id', [key, 2]);
        return { id: row.id };
      });
      return done.result.id;
    },
    async replay(key) {
      const done = await idem.once(scope, key, { params }, async () => { throw new Error('ran'); });
      return done.result;
    },
  };

  const sides = { 'by hand': byHand, library: lib };
  const cases = ['acquired', 'replay'];
  const times = {};
  for (const c of cases) for (const s of Object.keys(sides)) times[`${c}/${s}`] = [];
  // keys finished by each side, for its replays
  const done = { 'by hand': [], library: [] };
  for (let round = 0; round < ROUNDS + 1; round += 1) {          // round 0 warms up, not counted
    const order = round % 2 === 0 ? ['by hand', 'library'] : ['library', 'by hand'];
    for (const c of cases) {
      for (const s of order) {
        const keys = c === 'acquired'
          ? Array.from({ length: PER_ROUND }, () => crypto.randomUUID())
          : done[s].slice(-PER_ROUND);
        const t0 = process.hrtime.bigint();
        for (const k of keys) await sides[s][c](k);
        const ms = Number(process.hrtime.bigint() - t0) / 1e6 / keys.length;
        if (c === 'acquired') done[s].push(...keys);
        if (round > 0) times[`${c}/${s}`].push(ms);
      }
    }
  }
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
  console.log(`${ROUNDS} rounds x ${PER_ROUND} operations per side and case, interleaved; median ms per operation`);
  console.log('case          by hand   library   overhead');
  for (const c of cases) {
    const h = median(times[`${c}/by hand`]);
    const l = median(times[`${c}/library`]);
    console.log(`${c.padEnd(12)} ${h.toFixed(3).padStart(8)}  ${l.toFixed(3).padStart(8)}   ${((l / h - 1) * 100).toFixed(1).padStart(6)} %`);
  }
  await pool.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
