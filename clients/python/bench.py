#!/usr/bin/env python3
"""What the library costs over the same SQL written by hand (the target: at most 5 %).

One-transaction work, the library's fast path: BEGIN, claim, the business INSERT, complete,
COMMIT -- by hand with psycopg 3, and with idempo.once().  Then the replay of the same keys
(BEGIN, claim -> replay, COMMIT).  The two run interleaved in the same invocation, on the same
connection and database, alternating which goes first in each round, so that drift of the
machine (other load, caches, autovacuum) falls on both alike: operation by operation, the two
alternating which goes first; the median of each is reported.  Prints a table; asserts nothing (timings are not a test's business).

usage: bench.py [--rounds N] [--ops N]      (PGHOST, PGPORT, PGUSER, PGDATABASE: libpq's)
"""
import argparse
import json
import os
import statistics
import sys
import time
import uuid

import psycopg

import idempo

HAND_CLAIM = 'SELECT outcome::text, attempt, result FROM idempo.claim(%s, %s, params => %s::jsonb)'
HAND_COMPLETE = 'SELECT idempo.complete(%s, %s, result => %s::jsonb)'
INSERT = 'INSERT INTO bench_moves (key, qty) VALUES (%s, %s)'


def by_hand(conn, scope, key, qty):
    with conn.transaction():
        outcome, _, result = conn.execute(HAND_CLAIM, [scope, key, json.dumps({'sku': 'A-7', 'qty': qty})]).fetchone()
        if outcome == 'acquired':
            conn.execute(INSERT, [key, qty])
            result = {'reserved': qty}
            conn.execute(HAND_COMPLETE, [scope, key, json.dumps(result)])
        elif outcome != 'replay':
            raise RuntimeError(outcome)
    return result


def with_library(conn, scope, key, qty):
    with conn.transaction(), idempo.once(conn, scope, key, {'sku': 'A-7', 'qty': qty}) as op:
        if op.acquired:
            conn.execute(INSERT, [key, qty])
            op.result = {'reserved': qty}
    return op.result


def one(fn, conn, scope, key):
    """-> (wall, client CPU) in microseconds.  The client's CPU time is what the library can
    add; on a busy machine the wall time also grows with the CPU a process asks for."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(conn, scope, key, 2)
    return (time.perf_counter() - wall) * 1e6, (time.process_time() - cpu) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rounds', type=int, default=15)
    ap.add_argument('--ops', type=int, default=1000)
    args = ap.parse_args()
    admin = psycopg.connect(dbname='postgres', autocommit=True)
    db = f'idempo_bench_{uuid.uuid4().hex[:8]}'
    admin.execute(f'CREATE DATABASE {db}')
    try:
        with psycopg.connect(dbname=db, autocommit=True) as conn:
            conn.execute('CREATE EXTENSION idempo')
            if os.environ.get('IDEMPO_TEST_SHIM') == '1':      # development against an older server only
                conn.execute(open(os.path.join(os.path.dirname(__file__), 'tests', 'shim.sql')).read())
            conn.execute('CREATE TABLE bench_moves (key text, qty int)')
            conn.execute("SELECT idempo.create_scope('bench.hand'), idempo.create_scope('bench.lib')")
            idempo.version(conn)                         # the once-per-connection check, outside the timing
            for warm in range(200):                      # psycopg prepares statements after 5 uses
                by_hand(conn, 'bench.hand', f'warm-{warm}', 2)
                with_library(conn, 'bench.lib', f'warm-{warm}', 2)
            rows = {(phase, name): [] for phase in ('acquire', 'replay') for name in ('hand', 'library')}
            for r in range(args.rounds):
                for phase in ('acquire', 'replay'):
                    for i in range(args.ops):
                        # one operation of each, back to back, alternating which goes first
                        pair = [('hand', by_hand, 'bench.hand'), ('library', with_library, 'bench.lib')]
                        if i % 2:
                            pair.reverse()
                        for name, fn, scope in pair:
                            rows[(phase, name)].append(one(fn, conn, scope, f'r{r}-{i}'))
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS {db} WITH (FORCE)')
        admin.close()
    print(f'idempo {idempo.__version__} for Python, psycopg {psycopg.__version__}, Python {sys.version.split()[0]}: '
          f'{args.rounds} rounds of {args.ops} operations each, interleaved one by one; median microseconds')
    print(f'{"path":<10} {"by hand":>10} {"library":>10} {"overhead":>9}   {"CPU hand":>9} {"CPU lib":>9} {"added":>7}')
    for phase in ('acquire', 'replay'):
        hand = [statistics.median(x[i] for x in rows[(phase, 'hand')]) for i in (0, 1)]
        lib = [statistics.median(x[i] for x in rows[(phase, 'library')]) for i in (0, 1)]
        print(f'{phase:<10} {hand[0]:>10.1f} {lib[0]:>10.1f} {100 * (lib[0] - hand[0]) / hand[0]:>8.1f}%   '
              f'{hand[1]:>9.1f} {lib[1]:>9.1f} {lib[1] - hand[1]:>7.1f}')

if __name__ == '__main__':
    main()
