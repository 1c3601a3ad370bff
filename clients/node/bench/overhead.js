'use strict';
// What the library adds over the same SQL calls made by hand, interleaved in one invocation:
// the same pool, the sides alternating operation by operation, each doing the same work.
//   once-acquired   a new key: BEGIN, claim, INSERT, complete, COMMIT
//   once-replay     a finished key: claim -> replay
// Usage: PG* variables (idempo installed, a database you may write); node bench/overhead.js
//   [--rounds 20] [--per-round 300] [--short]
// The two sides alternate operation by operation.  Prints the median over the rounds of each
// side's time per operation and of the library's overhead in percent within a round.  No
// assertion: the test suite runs --short only to see that it works.
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
  const names = Object.keys(sides);
  const cases = ['acquired', 'replay'];
  // per round and case: the total time of each side; the two sides alternate operation by
  // operation (and which goes first), so that a change of the machine's load hits both alike
  const rounds = Object.fromEntries(cases.map((c) => [c, []]));
  const finished = { 'by hand': [], library: [] };       // keys each side finished, for its replays
  // this process's CPU, µs, per case and side (the client's share: what the library can add)
  const cpu = Object.fromEntries(cases.map((c) => [c, { 'by hand': 0, library: 0 }]));
  const timed = async (c, s, fn) => {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    await fn();
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    const used = process.cpuUsage(c0);
    cpu[c][s] += used.user + used.system;
    return ms;
  };
  for (let round = 0; round < ROUNDS + 1; round += 1) {          // round 0 warms up, not counted
    if (round === 1) for (const c of cases) { cpu[c]['by hand'] = 0; cpu[c].library = 0; }
    for (const c of cases) {
      const total = { 'by hand': 0, library: 0 };
      for (let i = 0; i < PER_ROUND; i += 1) {
        const order = (round + i) % 2 === 0 ? names : [...names].reverse();
        for (const s of order) {
          const key = c === 'acquired' ? crypto.randomUUID() : finished[s][i % finished[s].length];
          total[s] += await timed(c, s, () => sides[s][c](key));
          if (c === 'acquired') finished[s].push(key);
        }
      }
      if (round > 0) rounds[c].push({ hand: total['by hand'] / PER_ROUND, lib: total.library / PER_ROUND });
    }
  }
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
  console.log(`${ROUNDS} rounds x ${PER_ROUND} operations per side and case, alternating operation by operation`);
  console.log('median over the rounds: ms per operation, and the library over by hand in the same round');
  console.log("and this process's CPU per operation (µs: the mean; the library adds only client CPU)");
  console.log('case          by hand   library   overhead    CPU hand  CPU lib   added');
  const ops = ROUNDS * PER_ROUND;
  for (const c of cases) {
    const h = median(rounds[c].map((r) => r.hand));
    const l = median(rounds[c].map((r) => r.lib));
    const ratio = median(rounds[c].map((r) => r.lib / r.hand - 1)) * 100;
    const ch = cpu[c]['by hand'] / ops;
    const cl = cpu[c].library / ops;
    console.log(`${c.padEnd(12)} ${h.toFixed(3).padStart(8)}  ${l.toFixed(3).padStart(8)}   ${ratio.toFixed(1).padStart(6)} %`
      + `  ${ch.toFixed(0).padStart(8)} ${cl.toFixed(0).padStart(8)} ${(cl - ch).toFixed(0).padStart(7)}`);
  }
  await pool.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
