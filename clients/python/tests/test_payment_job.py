"""The payment job of docs/python.md, by hand (examples/payment_job_by_hand.py) and with the library
(examples/payment_job.py): 2,000 requests -- duplicates, changed parameters, declined cards, lost
requests and lost replies -- by 4 workers at once, against a provider that does not deduplicate.
Both come out right: one charge per payment at most, every payment settled, declines replayed."""
import importlib.util
import os
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import FakeProvider

psycopg = pytest.importorskip('psycopg')

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, '..', 'examples')


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Provider(FakeProvider):
    def __init__(self, declined_cls, seed):
        super().__init__()
        self.random, self.declined_cls = random.Random(seed), declined_cls

    def fate(self, reference, amount):
        fate = self.random.random()
        if amount % 97 == 0:
            raise self.declined_cls('card declined')
        return 'request' if fate < 0.03 else 'reply' if fate < 0.045 else 'reset' if fate < 0.06 else None


@pytest.mark.parametrize('job', ['payment_job_by_hand', 'payment_job'])
def test_the_payment_job(job, dbname, db):
    module = load(job)
    db.execute('DROP TABLE IF EXISTS job_payments')
    db.execute('CREATE TABLE job_payments (key text PRIMARY KEY, charge text UNIQUE)')
    db.execute("DELETE FROM idempo.scopes WHERE false")      # (scopes are never dropped)
    if not db.execute("SELECT 1 FROM idempo.scopes WHERE name = 'jobs.payments'").fetchone():
        db.execute("SELECT idempo.create_scope('jobs.payments', lease => '0.5 seconds', verify_settle => '0.2 seconds')")
    run = uuid.uuid4().hex[:6]
    rnd = random.Random(job)
    payments = [{'key': f'{run}-{i}', 'order': i, 'amount': 100 + i} for i in range(500)]
    requests = [dict(p) for p in payments for _ in range(4)]      # 2,000: each payment 4 times
    changed = rnd.sample(range(len(requests)), 40)
    for i in changed:
        requests[i] = {**requests[i], 'amount': requests[i]['amount'] + 1}   # same key, other parameters
    changed_keys = {requests[i]['key'] for i in changed}
    rnd.shuffle(requests)
    provider = Provider(module.Declined, 28)
    outcomes = {'ok': 0, 'declined': 0, 'conflict': 0}
    conflicted = set()
    lock = threading.Lock()
    local = threading.local()

    def one(request):
        if not hasattr(local, 'conn'):
            local.conn = psycopg.connect(dbname=dbname, autocommit=True, options='-c synchronous_commit=off')
        try:
            result = module.pay(local.conn, provider, request)
            what = 'declined' if 'declined' in result else 'ok'
        except Exception as err:
            if 'other parameters' not in str(err) and type(err).__name__ != 'Conflict':
                raise
            what = 'conflict'
            with lock:
                conflicted.add(request['key'])
        with lock:
            outcomes[what] += 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, requests))
    assert sum(outcomes.values()) == 2000
    assert outcomes['conflict'] > 0 and conflicted <= changed_keys
    assert {k: v for k, v in provider.charges.items() if len(v) > 1} == {}
    # declined: the amount (or the changed amount, when a changed request came first) is refused
    declined = {r['key'] for r in requests if r['amount'] % 97 == 0}
    recorded = dict(db.execute('SELECT key, charge FROM job_payments WHERE key LIKE %s', [f'{run}-%']).fetchall())
    # every payment that was not declined is recorded once, with the charge the provider made
    charged = {p['key'] for p in payments} - declined
    assert set(recorded) <= charged
    for key in recorded:
        assert provider.charges[f'jobs.payments/{key}'] == [recorded[key]]
    statuses = dict(db.execute("SELECT status::text, count(*) FROM idempo.operations WHERE scope = 'jobs.payments' "
                               "AND key LIKE %s GROUP BY 1", [f'{run}-%']).fetchall())
    assert 0 < statuses.get('failed', 0) <= len(declined) and statuses.get('succeeded', 0) == len(recorded)
    assert statuses.get('succeeded', 0) + statuses.get('failed', 0) == 500      # every payment settled


def dispatch_lines(name):
    lines = open(os.path.join(EXAMPLES, f'{name}.py')).read().split('\n')
    start = next(i for i, l in enumerate(lines) if '# -- dispatch: begin' in l)
    end = next(i for i, l in enumerate(lines) if '# -- dispatch: end' in l)
    return len([l for l in lines[start + 1:end] if l.strip()])


def test_the_line_counts_docs_python_md_shows():
    """docs/python.md states both jobs' lengths and their dispatch lines: they are measured here."""
    docs = os.environ.get('IDEMPO_TEST_DOCS') or os.path.join(HERE, '..', '..', '..', 'docs', 'python.md')
    text = open(docs).read()
    for name in ('payment_job_by_hand', 'payment_job'):
        total = len(open(os.path.join(EXAMPLES, f'{name}.py')).read().rstrip('\n').split('\n'))
        claim = f'`{name}.py`: {total} lines, {dispatch_lines(name)} of them dispatching'
        assert claim in text, f'docs/python.md should say: {claim}'
