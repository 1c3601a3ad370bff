"""The two-system flow under faults: 10,000 requests (2,000 payments, each sent 5 times, shuffled,
by 8 workers at once) against a stand-in provider that does NOT deduplicate and loses requests
and replies.  call_once's in-doubt path (the lease runs out -> unknown -> lookup -> verify) is
all that stands between a lost reply and a second charge.  0 doubled charges, and every payment
recorded once with the charge it names."""
import queue
import random
import threading
import time

import pytest

import idempo
from conftest import FakeProvider

psycopg = pytest.importorskip('psycopg')

PAYMENTS, COPIES, WORKERS = 2000, 5, 8
LOSE_REQUEST, LOSE_REPLY = 0.03, 0.03
# Commits that do not wait for the disk: the same answers, 10,000 requests in less time (a crash
# of the server is not what this test is about).
FAST = '-c synchronous_commit=off'


class Provider(FakeProvider):
    def __init__(self, seed):
        super().__init__()
        self.random = random.Random(seed)

    def fate(self, key):
        fate = self.random.random()
        return ('request' if fate < LOSE_REQUEST else 'reply' if fate < LOSE_REQUEST + LOSE_REPLY / 2
                else 'reset' if fate < LOSE_REQUEST + LOSE_REPLY else None)


def test_ten_thousand_requests_no_doubled_charge(dbname, db, scope):
    s = scope(lease='0.5 seconds', verify_settle='0.2 seconds')
    db.execute('CREATE TABLE lost_replies (key text PRIMARY KEY, charge text UNIQUE NOT NULL)')
    provider = Provider(28)
    keys = [f'pay-{i}' for i in range(PAYMENTS)]
    requests = keys * COPIES
    random.Random(2028).shuffle(requests)
    work = queue.Queue()
    for k in requests:
        work.put(k)
    answers = {'done': 0, 'replayed': 0, 'verified': 0, 'busy': 0, 'in_doubt': 0, 'retryable': 0, 'other': []}
    lock = threading.Lock()

    def record(conn, charge, key):
        conn.execute('INSERT INTO lost_replies VALUES (%s, %s)', [key, charge['id']])
        return {'charge': charge['id']}

    def worker():
        with psycopg.connect(dbname=dbname, autocommit=True, options=FAST) as conn:
            while True:
                try:
                    key = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    done = idempo.call_once(conn, s, key, provider.charge, params={'amount': 100},
                                            lookup=provider.find, record=lambda c, v, key=key: record(c, v, key),
                                            retryable=lambda e: True if isinstance(e, ConnectionRefusedError) else None)
                    what = 'replayed' if done.replayed else 'verified' if done.verified else 'done'
                except idempo.Busy:
                    what = 'busy'
                except ConnectionRefusedError:
                    what = 'retryable'
                except (TimeoutError, ConnectionError):
                    what = 'in_doubt'
                except Exception as err:           # anything else is a failure of the test
                    with lock:
                        answers['other'].append(repr(err))
                    continue
                with lock:
                    answers[what] += 1

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers['other'] == []
    assert sum(v for k, v in answers.items() if k != 'other') == PAYMENTS * COPIES
    assert provider.lost['request'] > 0 and provider.lost['reply'] > 0

    # Then every payment is settled, retried as a client would, until none is left in doubt.
    deadline = time.monotonic() + 120
    left = list(keys)
    with psycopg.connect(dbname=dbname, autocommit=True, options=FAST) as conn:
        while left and time.monotonic() < deadline:
            still = []
            for key in left:
                try:
                    idempo.call_once(conn, s, key, provider.charge, params={'amount': 100}, lookup=provider.find,
                                     record=lambda c, v, key=key: record(c, v, key),
                                     retryable=lambda e: True if isinstance(e, ConnectionRefusedError) else None)
                except (idempo.Busy, idempo.Unknown, TimeoutError, ConnectionError):
                    still.append(key)
            left = still
            if left:
                time.sleep(0.2)
    assert left == []

    doubled = {k: v for k, v in provider.charges.items() if len(v) > 1}
    assert doubled == {}, f'{len(doubled)} payments charged more than once'
    assert len(provider.charges) == PAYMENTS
    recorded = dict(db.execute('SELECT key, charge FROM lost_replies').fetchall())
    assert recorded == {k: provider.charges[f'{s}/{k}'][0] for k in keys}
    statuses = dict(db.execute('SELECT status::text, count(*) FROM idempo.operations WHERE scope = %s GROUP BY 1',
                               [s]).fetchall())
    assert statuses == {'succeeded': PAYMENTS}
    print(f'\n10,000 requests: {answers}, lost: {provider.lost}; doubled charges: 0')
