#!/usr/bin/env python3
"""idempo through PgBouncer in transaction pooling mode: what works, what is session-bound.

BOUNCER_DSN reaches a database (with nothing in it) through PgBouncer (pool_mode = transaction,
server_round_robin = 0: a released server connection is the next one handed out, so a second
client that opens a transaction right after the first one's statement gets the first one's
server connection).  DIRECT_DSN reaches the same database directly.  BOUNCER_MAX_PREPARED:
PgBouncer's max_prepared_statements (0 or unset: it does not track prepared statements).  Prints "ok - ..." or
"not ok - ..." per check and "N passed, N failed" last.
"""
import json
import os
import sys
import threading

import psycopg

BOUNCER = os.environ['BOUNCER_DSN']
DIRECT = os.environ['DIRECT_DSN']
# PgBouncer's max_prepared_statements (SHOW CONFIG; none before 1.21: 0)
MAX_PREPARED = int(os.environ.get('BOUNCER_MAX_PREPARED') or 0)
results = []


def check(ok, what):
    results.append(ok)
    print(f'{"ok" if ok else "not ok"} - {what}', flush=True)


def bouncer(**kw):
    kw.setdefault('autocommit', True)
    c = psycopg.connect(BOUNCER, **kw)
    if 'prepare_threshold' not in kw:
        c.prepare_threshold = None      # transaction pooling: no server-side prepared statements
    return c


def one(c, sql, params=()):
    row = c.execute(sql, params).fetchone()
    return row[0] if row and len(row) == 1 else row


def occupy():
    """Another client takes the server connection just released (and keeps it in a transaction)."""
    x = bouncer(autocommit=False)
    pid = one(x, 'SELECT pg_backend_pid()')
    return x, pid


def main():
    with psycopg.connect(DIRECT, autocommit=True) as d:
        d.execute('CREATE EXTENSION IF NOT EXISTS idempo')
        d.execute("SELECT idempo.create_scope('pool.pay', lease => '1 minute', store_params => true, audit => true)")
        d.execute("SELECT idempo.create_scope('pool.local', lease => '1 minute')")
        d.execute('CREATE TABLE IF NOT EXISTS payments (key text PRIMARY KEY, amount int)')

    a = bouncer()

    # 1. The two-transaction pattern: claim, (outside call), complete -- on two server connections.
    pid1 = one(a, 'SELECT pg_backend_pid()')
    oc, attempt = a.execute("SELECT outcome::text, attempt FROM idempo.claim('pool.pay', 'p-1', "
                            "'{\"amount\": 5}'::jsonb, run_id => 'r1')").fetchone()
    x, xpid = occupy()
    pid2 = one(a, 'SELECT pg_backend_pid()')
    st = one(a, "SELECT idempo.complete('pool.pay', 'p-1', %s, '{\"ok\": true}'::jsonb, 'pay-1')::text", (attempt,))
    check(oc == 'acquired' and st == 'succeeded' and xpid == pid1 and pid2 != pid1,
          f'claim on server {pid1}, complete on server {pid2} (another client held {xpid}): {oc} -> {st}')
    x.rollback(); x.close()
    oc = one(a, "SELECT outcome::text FROM idempo.claim('pool.pay', 'p-1', '{\"amount\": 5}'::jsonb)")
    check(oc == 'replay', f'the retry through the pooler replays: {oc}')
    oc = one(a, "SELECT outcome::text FROM idempo.claim('pool.pay', 'p-1', '{\"amount\": 6}'::jsonb)")
    n = one(a, "SELECT count(*) FROM idempo.conflicts WHERE scope = 'pool.pay' AND key = 'p-1'")
    check(oc == 'conflict' and n == 1, f'a changed request is a conflict, recorded: {oc}, {n} row')

    # 2. The in-transaction pattern: claim and the local write in one transaction (one server).
    t = bouncer(autocommit=False)
    with t.transaction():
        oc = one(t, "SELECT outcome::text FROM idempo.claim('pool.local', 'l-1', complete_on_commit => true)")
        t.execute("INSERT INTO payments VALUES ('l-1', 7)")
    st = one(a, "SELECT status::text FROM idempo.lookup('pool.local', 'l-1')")
    check(oc == 'acquired' and st == 'succeeded', f'claim with complete_on_commit in one transaction: {oc} -> {st}')
    t.close()

    # 3. Every other call of the SQL API through the pooler, each its own transaction.
    calls = [
        ("SELECT outcome::text FROM idempo.claim('pool.pay', 'p-2', run_id => 'r2')", 'acquired'),
        ("SELECT idempo.fail('pool.pay', 'p-2', 1, 'declined')::text", 'retryable'),
        ("SELECT outcome::text FROM idempo.claim('pool.pay', 'p-2', run_id => 'r3')", 'acquired'),
        ("SELECT idempo.request_review('pool.pay', 'p-2', 'manual check') > 0", True),
        ("SELECT count(*) > 0 FROM idempo.review_queue WHERE key = 'p-2'", True),
        ("SELECT idempo.resolve('pool.pay', 'p-2', 'not_executed', 'rita')::text", 'retryable'),
        ("SELECT idempo.stored_key('pool.pay', 'p-2') IS NOT NULL", True),
        ("SELECT status::text FROM idempo.lookup('pool.pay', 'p-2')", 'retryable'),
        ("SELECT idempo.fingerprint('{\"a\": 1}'::jsonb) IS NOT NULL", True),
        ("SELECT count(*) FROM idempo.conflict_queue WHERE key = 'p-1'", 1),
        ("SELECT idempo.resolve_conflict(id, 'dismissed', 'rita')::text FROM idempo.conflict_queue "
         "WHERE key = 'p-1'", ''),
        ("SELECT count(*) FROM idempo.conflict_queue WHERE key = 'p-1'", 0),
        ("SELECT count(*) FROM idempo.stats", None),
        ("SELECT count(*) FROM idempo.check_consistency()", 0),
        ("SELECT count(*) > 0 FROM idempo.counters()", True),
        ("SELECT count(*) > 0 FROM idempo.workers()", True),
        ("SELECT count(*) FROM idempo.sweep()", 1),
    ]
    for sql, want in calls:
        try:
            got = one(a, sql)
            check(want is None or got == want, f'{sql[:70]} -> {got}')
        except psycopg.Error as e:
            check(False, f'{sql[:70]} -> {e.sqlstate}: {e.diag.message_primary}')

    # 4. The verify step after a lost reply: claim, lease runs out, unknown, verify -- each a
    #    separate transaction on whatever server connection.
    a.execute("SELECT idempo.create_scope('pool.short', lease => '1 second', verify_settle => '1 second')")
    oc, attempt = a.execute("SELECT outcome::text, attempt FROM idempo.claim('pool.short', 's-1')").fetchone()
    oc2 = None
    for _ in range(100):
        oc2, att2 = a.execute("SELECT outcome::text, attempt FROM idempo.claim('pool.short', 's-1')").fetchone()
        if oc2 != 'busy':
            break
        threading.Event().wait(0.1)
    st = one(a, "SELECT idempo.verify('pool.short', 's-1', %s, true, 'ref-1')::text", (att2,)) if oc2 == 'unknown' else None
    check(oc == 'acquired' and oc2 == 'unknown' and st == 'succeeded', f'lease ran out: {oc} -> {oc2} -> verify {st}')

    # 5. Session-bound: SET idempo.clock_offset (a session setting) stays on the server connection.
    a.execute("SET idempo.clock_offset = '2 hours'")
    x, xpid = occupy()
    leaked = one(x, 'SHOW idempo.clock_offset')
    x.rollback()
    x.execute('RESET idempo.clock_offset')     # clean up that server connection
    x.commit()
    x.close()
    check(leaked not in ('0', '0s', '0 s', '00:00:00'),
          f"session SET idempo.clock_offset leaks to the next client of that server connection: it saw '{leaked}'")
    # ... and SET LOCAL is the safe form: it lives and dies with one transaction
    t = bouncer(autocommit=False)
    with t.transaction():
        t.execute("SET LOCAL idempo.clock_offset = '2 hours'")
        shifted = one(t, "SELECT idempo.now() - now() > interval '1 hour'")
    x, _ = occupy()
    after = one(x, 'SHOW idempo.clock_offset')
    x.rollback(); x.close(); t.close()
    check(shifted and after in ('0', '0s', '0 s', '00:00:00', '0ms'),
          f"SET LOCAL idempo.clock_offset shifts only its own transaction (next client sees '{after}')")
    # a startup parameter cannot carry it either: PgBouncer refuses 'options' (not silently dropped)
    try:
        psycopg.connect(BOUNCER, options='-c idempo.clock_offset=2h').close()
        check(False, "PgBouncer accepted options='-c idempo.clock_offset=2h'")
    except psycopg.OperationalError as e:
        check('options' in str(e), f'PgBouncer refuses a startup options parameter: {str(e).strip().splitlines()[-1]}')

    # 6. Prepared statements (psycopg prepares a query after 5 executions; prepare_threshold=0:
    #    at once): the next transaction may run on a server connection that never saw it.
    p = bouncer(prepare_threshold=0)
    err = None
    try:
        for i in range(6):
            p.execute("SELECT outcome::text FROM idempo.claim('pool.pay', %s)", (f'prep-{i}',))
            x, _ = occupy()
            p.execute("SELECT outcome::text FROM idempo.claim('pool.pay', %s)", (f'prep-{i}',))
            x.rollback(); x.close()
    except psycopg.Error as e:
        err = e
    if MAX_PREPARED == 0:
        check(err is not None and err.sqlstate in ('26000', '42P05'),
              'server-side prepared statements break under transaction pooling: '
              + (f'{err.sqlstate}: {err.diag.message_primary}' if err else 'no error'))
    else:
        # PgBouncer 1.21 on, max_prepared_statements > 0 (1.24's default: 200): it prepares them
        # on each server connection itself
        check(err is None, f'server-side prepared statements work (PgBouncer max_prepared_statements = {MAX_PREPARED}): '
              + (f'{err.sqlstate}: {err.diag.message_primary}' if err else 'no error'))
    p.close()

    # 7. A client that goes away inside a transaction: PgBouncer drops its server connection, the
    #    claim rolls back with it, the key is free again.
    t = bouncer(autocommit=False)
    one(t, "SELECT outcome::text FROM idempo.claim('pool.pay', 'gone-1')")
    t.close()
    with bouncer() as b:
        b.execute("SET lock_timeout = '30s'")   # (a session SET: harmless here, every row is ours)
        oc = one(b, "SELECT outcome::text FROM idempo.claim('pool.pay', 'gone-1')")
    check(oc == 'acquired', f'a claim whose client vanished mid-transaction is rolled back: next claim {oc}')
    with psycopg.connect(DIRECT, autocommit=True) as d:
        # the harmless SET above stayed on some server connection: clear them all
        d.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND pid <> pg_backend_pid()")
    a.close()

    failed = results.count(False)
    print(f'{len(results) - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
