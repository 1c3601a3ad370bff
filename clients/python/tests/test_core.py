"""The blocking API against a real database: typed outcomes and errors, once(), @idempotent,
the version check, psycopg 3 and psycopg2."""
import os
import threading
import time
import uuid

import pytest

import idempo
from idempo import Outcome, Status
from conftest import new_key

psycopg = pytest.importorskip('psycopg')


def count(db, table, where='true', args=()):
    return db.execute(f'SELECT count(*) FROM {table} WHERE {where}', args).fetchone()[0]


@pytest.fixture
def stock(db):
    db.execute('CREATE TABLE IF NOT EXISTS stock_moves (key text, qty int)')
    return lambda key: count(db, 'stock_moves', 'key = %s', [key])


def test_version(conn):
    assert idempo.version(conn) == '1.0.1'


def test_claim_outcomes_are_typed(conn, scope):
    s, k = scope(), new_key()
    with conn.transaction():
        first = idempo.claim(conn, s, k, {'qty': 1})
        assert first.outcome is Outcome.ACQUIRED and first.status is Status.IN_PROGRESS and first.attempt == 1
        assert first.acquired and not first.replayed
        assert idempo.complete(conn, s, k, result={'ok': [1, 'x']}, target_ref='R-1') is Status.SUCCEEDED
    again = idempo.claim(conn, s, k, {'qty': 1})
    assert again.outcome is Outcome.REPLAY and again.result == {'ok': [1, 'x']} and again.target_ref == 'R-1'
    assert again.completed_at is not None
    other = idempo.claim(conn, s, k, {'qty': 2})
    assert other.outcome is Outcome.CONFLICT and isinstance(other.conflict_id, int)


@pytest.mark.parametrize('path', ['flow', 'fast'])
def test_once_runs_once_and_replays(conn, db, scope, stock, path):
    s, k = scope(), new_key()
    runs = []
    if path == 'fast':
        idempo.version(conn)                          # checked: once() takes its fast path

    def reserve():
        with conn.transaction(), idempo.once(conn, s, k, {'sku': 'A-7', 'qty': 2}) as op:
            if op.acquired:
                runs.append(1)
                conn.execute('INSERT INTO stock_moves VALUES (%s, 2)', [k])
                op.result = {'reserved': 2}
        return op

    first, second = reserve(), reserve()
    assert first.acquired and first.status is Status.SUCCEEDED and first.result == {'reserved': 2}
    assert second.replayed and not second.acquired and second.result == {'reserved': 2}
    assert runs == [1] and stock(k) == 1
    assert idempo.lookup(db, s, k).status is Status.SUCCEEDED


def test_once_error_rolls_back_the_claim(conn, scope, stock):
    s, k = scope(), new_key()
    with pytest.raises(ZeroDivisionError):
        with conn.transaction(), idempo.once(conn, s, k) as op:
            conn.execute('INSERT INTO stock_moves VALUES (%s, 1)', [k])
            1 / 0
    assert idempo.lookup(conn, s, k) is None and stock(k) == 0
    with conn.transaction(), idempo.once(conn, s, k) as op:
        assert op.acquired and op.attempt == 1


def test_once_conflict_carries_id_and_changed_fields(conn, db, scope):
    s, k = scope(store_params=True), new_key()
    with conn.transaction(), idempo.once(conn, s, k, {'sku': 'A-7', 'qty': 2}):
        pass
    with pytest.raises(idempo.Conflict) as caught:
        with conn.transaction(), idempo.once(conn, s, k, {'sku': 'A-7', 'qty': 5}):
            pytest.fail('the block must not run on a conflict')
    err = caught.value
    assert err.claim.outcome is Outcome.CONFLICT
    assert err.conflict_id == db.execute('SELECT id FROM idempo.conflicts WHERE scope = %s AND key = %s',
                                         [s, k]).fetchone()[0]
    assert err.changed_fields == [{'field': 'qty', 'stored': 2, 'incoming': 5}]
    assert 'qty' in str(err)


def test_once_busy_raises_or_waits(conn, db, dbname, scope):
    s, k = scope(), new_key()
    holder = idempo.claim(db, s, k)                   # committed (autocommit): a running lease
    assert holder.acquired
    with psycopg.connect(dbname=dbname, autocommit=True) as fresh:     # its first use: the flow
        with pytest.raises(idempo.Busy):
            with fresh.transaction(), idempo.once(fresh, s, k):
                pytest.fail('must not run while busy')
    idempo.version(conn)                              # checked: once() takes its fast path
    with pytest.raises(idempo.Busy) as caught:
        with conn.transaction(), idempo.once(conn, s, k):
            pytest.fail('must not run while busy')
    assert caught.value.claim.status is Status.IN_PROGRESS
    assert 0 < caught.value.retry_after <= 300
    # wait: the holder completes a moment later; the waiting block then sees the replay
    timer = threading.Timer(0.3, lambda: idempo.complete(psycopg.connect(autocommit=True), s, k,
                                                         attempt=1, result={'by': 'holder'}))
    timer.start()
    started = time.monotonic()
    with conn.transaction(), idempo.once(conn, s, k, on_busy='wait', busy_timeout=10) as op:
        assert not op.acquired
    timer.join()
    assert op.replayed and op.result == {'by': 'holder'} and time.monotonic() - started >= 0.25
    with pytest.raises(idempo.Busy):       # busy_timeout passes
        k2 = new_key()
        idempo.claim(db, s, k2)
        with conn.transaction(), idempo.once(conn, s, k2, on_busy='wait', busy_timeout=0.2):
            pass


def test_once_needs_a_transaction(conn, scope):
    with pytest.raises(idempo.NoTransaction):
        with idempo.once(conn, scope(), new_key()):
            pass


@pytest.mark.parametrize('key', [1001, uuid.UUID('8e03978e-40d5-43e8-bc93-6894a57f9324'), b'order-1001', None])
def test_a_key_that_is_not_text_is_refused_by_name(conn, scope, key):
    # an order id is often an int or a UUID; the server's answer to one ("function
    # idempo.claim(unknown, integer, params => jsonb) does not exist", UndefinedFunction) names
    # neither the key nor the cure
    s = scope()
    calls = [lambda: idempo.claim(conn, s, key), lambda: idempo.once(conn, s, key).__enter__(),
             lambda: idempo.lookup(conn, s, key), lambda: idempo.complete(conn, s, key),
             lambda: idempo.fail(conn, s, key), lambda: idempo.verify(conn, s, key, 1, True),
             lambda: idempo.heartbeat(conn, s, key, 1)]
    for call in calls:
        with conn.transaction():
            with pytest.raises(TypeError, match=r'key must be a str, not .*str\(') as caught:
                call()
        assert type(key).__name__ in str(caught.value)
    with pytest.raises(TypeError, match='key must be a str'):
        idempo.call_once(conn, s, key, lambda reference: None)
    with pytest.raises(TypeError, match='scope must be a str'):
        with conn.transaction():
            idempo.claim(conn, None, 'order-1001')

    @idempo.idempotent(s, key='order_id')
    def reserve(conn, order_id):
        return 'reserved'
    with pytest.raises(TypeError, match='key must be a str'):
        with conn.transaction():
            reserve(conn, key)


def test_a_key_that_is_not_text_is_refused_by_name_asyncio(dbname, scope):
    import asyncio
    import idempo.aio
    s = scope()

    async def main():
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            for call in (lambda: idempo.aio.claim(conn, s, 1001), lambda: idempo.aio.lookup(conn, s, 1001)):
                with pytest.raises(TypeError, match='key must be a str, not int'):
                    async with conn.transaction():
                        await call()
            with pytest.raises(TypeError, match='key must be a str, not int'):
                await idempo.aio.call_once(conn, s, 1001, lambda reference: None)
            with pytest.raises(TypeError, match='key must be a str, not int'):
                async with conn.transaction(), idempo.aio.once(conn, s, 1001):
                    pass
    asyncio.run(main())


def test_a_result_reads_the_same_the_first_time_and_replayed(conn, scope):
    # Stored as jsonb, a result replays as JSON reads back: a tuple as a list, an int dict key as
    # a str.  The first call answered the object itself, so code that worked the first time broke
    # on a retry, the path a test rarely takes.
    s, value, stored = scope(), {'ids': (1, 2), 7: 'seven'}, {'ids': [1, 2], '7': 'seven'}

    @idempo.idempotent(s, key='k')
    def reserve(conn, k):
        return value
    k = new_key()
    answers = []
    for _ in range(2):
        with conn.transaction():
            answers.append(reserve(conn, k))
    assert answers == [stored, stored]
    k = new_key()
    for _ in range(2):
        with conn.transaction(), idempo.once(conn, s, k) as op:
            if op.acquired:
                op.result = value
        assert op.result == stored


def test_a_number_reads_the_same_the_first_time_and_replayed(conn, scope):
    # jsonb keeps a number as numeric and writes it back without an exponent: 1e+16 (Python's
    # repr of a float from 1e16 up) replays as the int 10000000000000000, -0.0 as 0.0.  The first
    # answer was json.loads of the text sent (the float 1e+16): == held, the type did not.
    # Both ways the first answer is made: copied (str keys only) and parsed back (an int key);
    # and a replay whose answer is not ASCII (read through the driver, not straight from libpq).
    s = scope()
    plain = {'big': 1e16, 'huge': 1.5e300, 'neg_zero': -0.0, 'small': 1e-05, 'tiny': 1.25e-10, 'plain': 2.5,
             'int': 123456789012345678901234567890, 'naïve': 'café ✓'}
    for value in (plain, {**plain, 7: 'seven'}):
        k = new_key()
        answers = []
        for _ in range(2):
            with conn.transaction(), idempo.once(conn, s, k) as op:
                if op.acquired:
                    op.result = value
            answers.append(op.result)
        assert repr(answers[0]) == repr(answers[1])
        assert type(answers[0]['big']) is int and type(answers[0]['small']) is float


def test_replayed_failure(conn, scope):
    s, k = scope(), new_key()
    with conn.transaction(), idempo.once(conn, s, k) as op:
        assert op.fail('card declined', retryable=False) is Status.FAILED
    with conn.transaction(), idempo.once(conn, s, k) as op:
        assert op.replayed and op.failed and op.error == 'card declined'


def test_decorator(conn, scope, stock):
    s = scope(store_params=True)
    runs = []

    @idempo.idempotent(s, key='order_id', params=('sku', 'qty'))
    def reserve(conn, order_id, sku, qty):
        runs.append(order_id)
        conn.execute('INSERT INTO stock_moves VALUES (%s, %s)', [order_id, qty])
        return {'order': order_id, 'qty': qty}

    k = new_key()
    with conn.transaction():
        assert reserve(conn, k, 'A-7', 2) == {'order': k, 'qty': 2}
    with conn.transaction():
        assert reserve(conn, k, sku='A-7', qty=2) == {'order': k, 'qty': 2}
    assert runs == [k] and stock(k) == 1
    with pytest.raises(idempo.Conflict) as caught, conn.transaction():
        reserve(conn, k, 'A-7', 3)
    assert caught.value.changed_fields == [{'field': 'qty', 'stored': 2, 'incoming': 3}]


def test_sqlstates_become_exceptions(conn, db, scope):
    with pytest.raises(idempo.NotFound) as caught, conn.transaction():
        idempo.claim(conn, 'no.such.scope', 'k')
    assert caught.value.sqlstate == '42704' and 'no.such.scope' in str(caught.value) and caught.value.hint
    assert isinstance(caught.value.__cause__, psycopg.Error)
    with pytest.raises(idempo.InvalidArgument), conn.transaction():
        idempo.claim(conn, scope(), '   ')
    s, k = scope(on_lease_expiry='retry', lease='1 second'), new_key()
    assert idempo.claim(db, s, k).attempt == 1
    db.execute("SET idempo.clock_offset = '2s'")
    assert idempo.claim(db, s, k).attempt == 2
    with pytest.raises(idempo.InvalidState) as fenced:
        idempo.complete(db, s, k, attempt=1)
    assert fenced.value.sqlstate == '55000'
    with pytest.raises(idempo.ReadOnly), conn.transaction():
        conn.execute('SET TRANSACTION READ ONLY')
        idempo.claim(conn, s, new_key())
    db.execute('RESET idempo.clock_offset')


def test_version_refused_with_a_clear_message(dbname):
    """A database whose idempo answers another version, and one without idempo at all."""
    with psycopg.connect(dbname=dbname, autocommit=True) as c:
        c.execute('BEGIN')
        c.execute("CREATE OR REPLACE FUNCTION idempo.version() RETURNS text LANGUAGE sql AS $$ SELECT '0.2.0'::text $$")
        with pytest.raises(idempo.UnsupportedVersion) as caught:
            idempo.version(c)
        c.execute('ROLLBACK')
    assert caught.value.found == '0.2.0' and caught.value.needed == '0.3.x or 1.x'
    assert 'the database has idempo 0.2.0' in str(caught.value)
    assert f'(idempo for Python {idempo.__version__}) needs idempo 0.3.x or 1.x' in str(caught.value)
    assert 'UPDATE TO' not in str(caught.value)
    with psycopg.connect(dbname='postgres', autocommit=True) as c:
        with pytest.raises(idempo.UnsupportedVersion, match='idempo is not installed in this database'):
            idempo.claim(c, 's', 'k')


def test_psycopg2(dbname, scope, db, stock):
    psycopg2 = pytest.importorskip('psycopg2')
    s, k = scope(store_params=True), new_key()
    c = psycopg2.connect(dbname=dbname)          # psycopg2's default: a transaction opens by itself
    try:
        for _ in range(2):
            with idempo.once(c, s, k, {'qty': 1}) as op:
                if op.acquired:
                    c.cursor().execute('INSERT INTO stock_moves VALUES (%s, 1)', [k])
                    op.result = {'n': 1}
            c.commit()
        assert op.replayed and op.result == {'n': 1} and stock(k) == 1
        with pytest.raises(idempo.Conflict) as caught:
            with idempo.once(c, s, k, {'qty': 2}):
                pass
        c.commit()
        assert caught.value.changed_fields[0]['field'] == 'qty'
        with pytest.raises(idempo.NotFound):
            idempo.claim(c, 'no.such.scope', 'k')
        c.rollback()
    finally:
        c.close()


def test_sqlalchemy_session(dbname, scope, stock):
    sqlalchemy = pytest.importorskip('sqlalchemy')
    from sqlalchemy.orm import Session
    host, port, user = os.environ.get('PGHOST', ''), os.environ.get('PGPORT', '5432'), os.environ.get('PGUSER', '')
    engine = sqlalchemy.create_engine(f'postgresql+psycopg2://{user}@/{dbname}?host={host}&port={port}')
    s, k = scope(), new_key()
    try:
        for _ in range(2):
            with Session(engine) as session, session.begin():
                with idempo.once(session, s, k, {'qty': 1}) as op:
                    if op.acquired:
                        session.execute(sqlalchemy.text('INSERT INTO stock_moves VALUES (:k, 1)'), {'k': k})
                        op.result = {'n': 1}
        assert op.replayed and op.result == {'n': 1} and stock(k) == 1
        with pytest.raises(ZeroDivisionError):                 # the session's rollback takes the claim
            with Session(engine) as session, session.begin():
                with idempo.once(session, s, k + '-2'):
                    1 / 0
        with Session(engine) as session:
            assert idempo.lookup(session, s, k + '-2') is None
    finally:
        engine.dispose()


def test_async_decorator(dbname, scope):
    import asyncio
    import idempo.aio  # noqa: F401
    s, runs = scope(), []

    @idempo.idempotent(s, key='order_id', params=('qty',))
    async def reserve(conn, order_id, qty):
        runs.append(order_id)
        await conn.execute('INSERT INTO stock_moves VALUES (%s, %s)', [order_id, qty])
        return {'qty': qty}

    async def main():
        k = new_key()
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            results = []
            for _ in range(2):
                async with conn.transaction():
                    results.append(await reserve(conn, k, 3))
            return k, results
    k, results = asyncio.run(main())
    assert results == [{'qty': 3}, {'qty': 3}] and runs == [k]


def test_django_transaction_atomic(dbname, scope, stock):
    """once() with Django's connection joins transaction.atomic() (Django 3.2: psycopg2)."""
    pytest.importorskip('django')
    import subprocess
    import sys
    s, k = scope(), new_key()
    env = {**os.environ, 'PGDATABASE': dbname,
           'PYTHONPATH': os.pathsep.join([os.path.dirname(os.path.dirname(idempo.__file__)),
                                          os.environ.get('PYTHONPATH', '')])}
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), 'django_atomic.py'), s, k],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == 'ok', r.stdout + r.stderr
    assert stock(k) == 1


def test_one_runner_per_connection_across_threads(conn, monkeypatch):
    # two threads starting on the same connection must share its Runner (and its lock)
    import threading
    from idempo import _sync
    _sync._runners.pop(conn, None)
    barrier, made, real = threading.Barrier(2), [], _sync.Runner.__init__

    def init(self, c, **kw):
        real(self, c, **kw)
        try:
            barrier.wait(timeout=2)          # both threads have made a Runner before either stores it
        except threading.BrokenBarrierError:
            pass
    monkeypatch.setattr(_sync.Runner, '__init__', init)
    threads = [threading.Thread(target=lambda: made.append(_sync.runner_for(conn))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made[0] is made[1] is _sync.runner_for(conn)


def test_busy_says_until_when_and_what_to_do(conn, db, scope):
    s, k = scope(lease='30 seconds'), new_key()
    idempo.claim(db, s, k)                      # a running attempt (a lost reply leaves one)
    with pytest.raises(idempo.Busy) as busy:
        with conn.transaction(), idempo.once(conn, s, k):
            pass
    assert 'until its lease ends at' in str(busy.value) and "on_busy='wait'" in str(busy.value), str(busy.value)


def test_a_connection_the_library_used_is_freed_when_the_application_drops_it(dbname, scope):
    """The library keeps per-connection state (its Runner, the version check, one cursor); none
    of it may keep the connection alive after the application let it go (a service opening
    connections would grow without end)."""
    import gc
    import weakref
    s = scope()
    c = psycopg.connect(dbname=dbname, autocommit=True)
    with c.transaction(), idempo.once(c, s, new_key(), {'n': 1}) as op:
        op.result = {'ok': True}
    idempo.claim(c, s, new_key(), complete_on_commit=True)
    gone = weakref.ref(c)
    c.close()
    del c, op
    gc.collect()
    assert gone() is None
