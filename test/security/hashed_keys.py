#!/usr/bin/env python3
"""A clear key of a hash_keys scope must appear in no idempo table and no server log line.

    hashed_keys.py SOCKET_DIR PORT DBNAME [SERVER_LOG]

Runs every kind of call on one key (with bind parameters, as applications do), including calls
that fail, then searches every row of every idempo table for the clear key; with SERVER_LOG,
that log too, where each refused call must have left an error naming scope pii or the digest.
"""
import re
import sys

import psycopg

SECRET = 'customer:carol.secret@example.com'


def main():
    host, port, dbname = sys.argv[1], sys.argv[2], sys.argv[3]
    conn = psycopg.connect(host=host, port=port, user='postgres', dbname=dbname, autocommit=True)
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS idempo")
    cur.execute("SELECT idempo.create_scope('pii', hash_keys => true, audit => true, store_params => true,"
                " retention => '1 hour', lease => '1 minute', verify_settle => '1 minute')")
    calls = [
        ("SELECT outcome FROM idempo.claim('pii', %s, '{\"n\": 1}')", True),
        ("SELECT idempo.heartbeat('pii', %s, 1, '10 minutes')", True),
        ("SELECT idempo.heartbeat('pii', %s, 1, '2 hours')", False),     # over the retention: refused
        ("SELECT idempo.heartbeat('pii', %s, 3)", False),                # no such attempt: refused
        ("SELECT outcome FROM idempo.claim('pii', %s, lease => '0')", False),  # bad lease: refused
        ("SELECT idempo.complete('pii', %s, 2)", False),                 # not the attempt: refused
        ("SELECT idempo.complete('pii', %s, 1, '{\"ok\": true}', 'T-1')", True),
        ("SELECT outcome FROM idempo.claim('pii', %s, '{\"n\": 2}')", True),   # conflict
        ("SELECT idempo.verify('pii', %s, 1, true)", False),                # not unknown: refused
        ("SELECT idempo.fail('pii', %s, 1, 'x', NULL)", False),          # NULL retryable: refused
        ("SELECT idempo.request_review('pii', %s, 'check')", True),
        ("SELECT idempo.resolve('pii', %s, 'bogus', 'rita')", False),    # unknown resolution
        ("SELECT idempo.resolve('pii', %s, 'succeeded', 'rita')", True),
        ("SELECT status FROM idempo.lookup('pii', %s)", True),
    ]
    failures = 0
    for sql, should_succeed in calls:
        try:
            cur.execute(sql, (SECRET,))
            ok = True
        except psycopg.Error as e:
            ok = False
            failures += 1
            if SECRET in str(e):
                print(f"clear key in an error message: {e}")
                return 1
        if ok != should_succeed:
            print(f"unexpected {'success' if ok else 'failure'}: {sql}")
            return 1
    found = 0
    cur.execute("SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'idempo'::regnamespace AND c.relkind = 'r'")
    for (table,) in cur.fetchall():
        cur.execute(f"SELECT count(*) FROM idempo.{table} t WHERE t::text LIKE %s", ('%' + SECRET + '%',))
        n = cur.fetchone()[0]
        if n:
            print(f"clear key in idempo.{table}: {n} rows")
            found += n
    cur.execute("SELECT count(*) FROM idempo.operations WHERE key = idempo.stored_key('pii', %s)", (SECRET,))
    stored = cur.fetchone()[0]
    print(f"hashed keys: {len(calls)} calls, {failures} refused, {stored} record under the digest, "
          f"{found} rows with the clear key")
    ok = found == 0 and stored == 1 and failures == sum(1 for _, succeeds in calls if not succeeds)
    if len(sys.argv) > 4:
        with open(sys.argv[4], errors='replace') as f:
            log = f.read()
        in_log = log.count('carol.secret')
        errors = len(re.findall(r'ERROR: .*(key "[0-9a-f]{64}"|"pii")', log))
        print(f"server log: {in_log} mentions of the clear key, {errors} error lines naming scope pii or a digest")
        ok = ok and in_log == 0 and errors >= failures
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
