#!/usr/bin/env python3
"""The review console's pages against the queries they run (test/bench/console calls it).

A person (bench_rita, who reviews half of the records) signs in to a console started on the
filled database; each round asks every page over HTTP and then runs the same database calls
the page makes (idempo.console.db's functions, on a connection of hers), interleaved, so that
both sides see the same moment of a shared machine.  Prints per page the median page time (the
request as the browser waits for it: the console's server time plus a loopback round trip),
the median time of its queries alone, and the page's share that is not the database's.  The
target (every list page within 200 ms) is reported, never asserted: timing is no test.

usage: console_bench.py DBNAME ROUNDS
"""
import os
import statistics
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'clients', 'python'))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'clients', 'python', 'console_tests'))

import conftest                                   # noqa: E402  (the console tests' Console and Person)
from idempo.console import db                     # noqa: E402

TARGET_MS = 200


def main():
    dbname, rounds = sys.argv[1], int(sys.argv[2])
    console = conftest.Console(dbname)
    try:
        rita = conftest.Person(console)
        status, body, _, _ = rita.post('/login', rita.login_form('bench_rita', 'rita-pw'))
        assert status == 200 and 'id="whoami">bench_rita<' in body, body[:500]
        dsn = f"dbname={dbname} host={os.environ['PGHOST']} port={os.environ['PGPORT']}"
        conn = db.connect(dsn, 'bench_rita', 'rita-pw')
        # a position deep in the reviews queue: the keyset page a person reaches after paging
        deep = conn.execute("""SELECT q.opened_at, q.id FROM idempo.review_queue_page(page_size => NULL) AS q
                               ORDER BY q.opened_at, q.id
                               OFFSET (SELECT count(*) / 2 FROM idempo.review_queue_page(page_size => NULL))
                               LIMIT 1""").fetchone()
        deep_after = f"{deep['opened_at'].isoformat()}|{deep['id']}" if deep else None
        one = conn.execute("SELECT q.scope, q.key FROM idempo.review_queue_page(page_size => NULL) AS q "
                           "ORDER BY q.opened_at DESC LIMIT 1").fetchone()

        def queue_queries(fetch, **f):
            rows = fetch(conn, **f)[:db.PAGE]
            db.tokens(conn, [r for r in rows if not r['hash_keys']]) if fetch is not db.conflicts else None
            db.scopes(conn)

        pages = [
            ('overview', '/', lambda: db.overview(conn)),
            ('reviews, first page', '/reviews', lambda: queue_queries(db.reviews)),
            ('reviews of one scope', '/reviews?scope=billing.charge',
             lambda: queue_queries(db.reviews, scope='billing.charge')),
            ('reviews, a key searched', '/reviews?q=k-0001',
             lambda: queue_queries(db.reviews, q='k-0001')),
            ('reviews, a page half way', '/reviews?' + urllib.parse.urlencode({'after': deep_after or ''}),
             lambda: queue_queries(db.reviews, after=deep_after)),
            ('reviews waiting over 30 min', '/reviews?older_than=30',
             lambda: queue_queries(db.reviews, older_than=30)),
            ('unknown, first page', '/unknown', lambda: queue_queries(db.unknown)),
            ('conflicts, first page', '/conflicts', lambda: queue_queries(db.conflicts)),
            ('a record', '/record?' + urllib.parse.urlencode({'scope': one['scope'], 'key': one['key']}),
             lambda: db.record(conn, one['scope'], one['key'])),
        ]
        page_ms = {name: [] for name, _, _ in pages}
        query_ms = {name: [] for name, _, _ in pages}
        for _ in range(rounds):
            for name, path, queries in pages:
                t0 = time.perf_counter()
                status, body, _, _ = rita.get(path)
                page_ms[name].append((time.perf_counter() - t0) * 1000)
                assert status == 200, (name, status, body[:300])
                t0 = time.perf_counter()
                queries()
                query_ms[name].append((time.perf_counter() - t0) * 1000)
        counts = conn.execute("""SELECT (SELECT sum(st.in_progress + st.succeeded + st.failed + st.retryable + st.unknown
                                                    + st.in_review + st.remembered)
                                         FROM idempo.stats AS st JOIN idempo.scopes AS s ON s.name = st.scope
                                         WHERE idempo.may_review(s.review_role, s.allowed_role)) AS ops,
                                        (SELECT count(*) FROM idempo.review_queue_page(page_size => NULL)) AS reviews""").fetchone()
        print(f"bench_rita reviews {counts['ops']} operations, {counts['reviews']} open reviews; "
              f"medians of {rounds} interleaved rounds")
        print(f"{'page':30} {'page ms':>9} {'queries ms':>11} {'not the db':>11}  within {TARGET_MS} ms")
        for name, _, _ in pages:
            p, q = statistics.median(page_ms[name]), statistics.median(query_ms[name])
            print(f"{name:30} {p:9.1f} {q:11.1f} {max(p - q, 0):11.1f}  {'yes' if p <= TARGET_MS else 'NO'}")
        conn.close()
    finally:
        console.stop()


if __name__ == '__main__':
    main()
