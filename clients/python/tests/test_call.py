"""call_once: the two-system flow (claim and commit, call, record + complete; fail by the user's
rule; unknown -> lookup -> verify; the heartbeat), blocking and asyncio."""
import asyncio
import time

import pytest

import idempo
import idempo.aio
from idempo import Status
from conftest import FakeProvider, new_key

psycopg = pytest.importorskip('psycopg')


class Provider(FakeProvider):
    """lose: the fates of the next calls, in order ('request', 'reply'); then every call goes through."""

    def __init__(self):
        super().__init__()
        self.lose = []

    def fate(self, key):
        return self.lose.pop(0) if self.lose else None


class Declined(Exception):
    pass


@pytest.fixture
def payments(db):
    db.execute('CREATE TABLE IF NOT EXISTS payments (key text, charge text UNIQUE)')
    return lambda key: db.execute('SELECT count(*) FROM payments WHERE key = %s', [key]).fetchone()[0]


def record_into(key):
    def record(conn, charge):
        conn.execute('INSERT INTO payments VALUES (%s, %s)', [key, charge['id']])
        return {'charge': charge['id']}
    return record


def test_success_then_replay(conn, scope, payments):
    s, k, p = scope(), new_key(), Provider()
    done = idempo.call_once(conn, s, k, p.charge, params={'amount': 5}, record=record_into(k),
                            target_ref=lambda c: c['id'])
    (charge,) = p.charges[f'{s}/{k}']
    assert done.succeeded and not done.replayed and done.attempt == 1 and done.result == {'charge': charge}
    assert done.target_ref == charge
    again = idempo.call_once(conn, s, k, p.charge, params={'amount': 5}, record=record_into(k))
    assert again.replayed and again.result == {'charge': charge} and again.target_ref == charge
    assert p.charges == {f'{s}/{k}': [charge]} and payments(k) == 1
    with pytest.raises(idempo.Conflict):
        idempo.call_once(conn, s, k, p.charge, params={'amount': 6})


def test_retryable_rule_and_final_failure(conn, scope, payments):
    s, k, p = scope(), new_key(), Provider()
    p.lose = ['request']
    with pytest.raises(ConnectionError):
        idempo.call_once(conn, s, k, p.charge, record=record_into(k),
                         retryable=lambda e: isinstance(e, ConnectionRefusedError) or (False if isinstance(e, Declined) else None))
    assert idempo.lookup(conn, s, k).status is Status.RETRYABLE
    done = idempo.call_once(conn, s, k, p.charge, record=record_into(k))
    assert done.succeeded and done.attempt == 2 and payments(k) == 1

    k2 = new_key()

    def decline(key):
        raise Declined('card declined')
    done = idempo.call_once(conn, s, k2, decline, retryable=lambda e: False if isinstance(e, Declined) else None)
    assert done.failed and 'card declined' in done.error and not done.replayed
    replay = idempo.call_once(conn, s, k2, decline)
    assert replay.replayed and replay.failed and 'card declined' in replay.error


def test_honours_key_frees_the_key_after_an_error(conn, scope):
    s, k, p = scope(), new_key(), Provider()
    p.lose = ['reply']
    with pytest.raises(TimeoutError):
        idempo.call_once(conn, s, k, p.charge, honours_key=True)
    assert idempo.lookup(conn, s, k).status is Status.RETRYABLE


def test_lost_reply_is_in_doubt_then_found_by_lookup(conn, db, scope, payments):
    s, k, p = scope(lease='5 minutes'), new_key(), Provider()
    p.lose = ['reply']
    with pytest.raises(TimeoutError):
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    assert idempo.lookup(conn, s, k).status is Status.IN_PROGRESS     # in doubt: nothing written
    with pytest.raises(idempo.Busy):                                   # the lease still runs
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    conn.execute("SET idempo.clock_offset = '6min'")
    done = idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    assert done.verified and done.succeeded and done.attempt == 1
    assert done.result == {'charge': p.charges[f'{s}/{k}'][0]}
    assert len(p.charges[f'{s}/{k}']) == 1 and payments(k) == 1
    assert idempo.call_once(conn, s, k, p.charge).replayed


def test_the_result_reads_the_same_the_first_time_and_replayed(conn, scope):
    # record's value is stored as jsonb: the Done of the first call, of a verify and of a replay
    # all carry it as a replay reads it back (a tuple as a list, an int key as a str)
    def record(conn, charge):
        return {'charge': (charge['id'],), 1: True}
    s, k, p = scope(lease='5 minutes'), new_key(), Provider()
    first = idempo.call_once(conn, s, k, p.charge, record=record)
    again = idempo.call_once(conn, s, k, p.charge, record=record)
    assert again.replayed and first.result == again.result == {'charge': [p.charges[f'{s}/{k}'][0]], '1': True}
    k = new_key()
    p.lose = ['reply']
    with pytest.raises(TimeoutError):
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record)
    conn.execute("SET idempo.clock_offset = '6min'")
    verified = idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record)
    again = idempo.call_once(conn, s, k, p.charge)
    conn.execute('RESET idempo.clock_offset')
    assert verified.verified and verified.result == again.result == {'charge': [p.charges[f'{s}/{k}'][0]], '1': True}


def test_lost_request_is_not_found_then_runs_again(conn, scope, payments):
    s, k, p = scope(lease='5 minutes', verify_settle='1 minute'), new_key(), Provider()
    p.lose = ['request']
    with pytest.raises(ConnectionError):
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    conn.execute("SET idempo.clock_offset = '6min'")
    done = idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    assert done.succeeded and done.attempt == 2 and not done.verified
    assert len(p.charges[f'{s}/{k}']) == 1 and payments(k) == 1


def test_not_found_inside_the_settle_window_says_until_when(conn, scope, payments):
    # verify_settle counts from the end of the attempt's lease (docs/time-and-doubt.md): the
    # Unknown says when that is and what to do, not just "try again later"
    s, k, p = scope(lease='5 minutes', verify_settle='1 hour'), new_key(), Provider()
    p.lose = ['request']
    with pytest.raises(ConnectionError):
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    conn.execute("SET idempo.clock_offset = '6min'")
    with pytest.raises(idempo.Unknown) as caught:
        idempo.call_once(conn, s, k, p.charge, lookup=p.find, record=record_into(k))
    (last, ends) = conn.execute("SELECT last_attempt_at, last_attempt_at + interval '1 hour' "
                                'FROM idempo.lookup(%s, %s)', [s, k]).fetchone()
    conn.rollback()
    assert caught.value.settles_at == ends
    assert f'the settle window ends at {ends.isoformat()}' in str(caught.value)
    assert last.isoformat() in str(caught.value) and 'call again with the same key after then' in str(caught.value)


def test_unknown_without_lookup_raises(conn, scope):
    s, k, p = scope(), new_key(), Provider()
    p.lose = ['reply']
    with pytest.raises(TimeoutError):
        idempo.call_once(conn, s, k, p.charge)
    conn.execute("SET idempo.clock_offset = '6min'")
    with pytest.raises(idempo.Unknown) as caught:
        idempo.call_once(conn, s, k, p.charge)
    assert caught.value.claim.attempt == 1


def test_not_in_a_transaction(conn, scope):
    with conn.transaction(), pytest.raises(idempo.InTransaction):
        idempo.call_once(conn, scope(), new_key(), lambda key: None)


def _slow_call_probed(dbname, s, k, seen):
    """A call that lasts 1.6 s of a 1 s lease; at 1.3 s another worker claims the key."""
    def call(key):
        time.sleep(1.3)
        with psycopg.connect(dbname=dbname, autocommit=True) as other:
            seen.append(idempo.claim(other, s, k).outcome)
        time.sleep(0.3)
        return {'id': 'ch'}
    return call


def test_heartbeat_keeps_the_lease(conn, dbname, scope):
    s, k, seen = scope(lease='1 second', on_lease_expiry='retry'), new_key(), []
    done = idempo.call_once(conn, s, k, _slow_call_probed(dbname, s, k, seen), heartbeat=0.25)
    assert seen == [idempo.Outcome.BUSY]
    assert done.succeeded and done.attempt == 1


def test_without_heartbeat_the_lease_runs_out_and_fencing_refuses(conn, dbname, scope):
    s, k, seen = scope(lease='1 second', on_lease_expiry='retry'), new_key(), []
    with pytest.raises(idempo.Superseded):
        idempo.call_once(conn, s, k, _slow_call_probed(dbname, s, k, seen), heartbeat=0)
    assert seen == [idempo.Outcome.ACQUIRED]           # attempt 2 took the key over
    assert idempo.lookup(conn, s, k).attempt == 2


def test_async(dbname, scope, payments):
    s, k, p = scope(lease='1 second', on_lease_expiry='retry'), new_key(), Provider()
    seen = []

    async def charge(key):
        await asyncio.sleep(1.3)
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as other:
            seen.append((await idempo.aio.claim(other, s, k)).outcome)
        return p.charge(key)

    async def record(conn, charge):
        await conn.execute('INSERT INTO payments VALUES (%s, %s)', [k, charge['id']])
        return {'charge': charge['id']}

    async def main():
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            assert await idempo.aio.version(conn) == '1.0.1'
            done = await idempo.aio.call_once(conn, s, k, charge, record=record, heartbeat=0.25)
            again = await idempo.aio.call_once(conn, s, k, charge, record=record)
            k2 = new_key()
            async with conn.transaction():
                async with idempo.aio.once(conn, s, k2, {'a': 1}) as op:
                    assert op.acquired
                    op.result = {'x': 1}
            async with conn.transaction():
                async with idempo.aio.once(conn, s, k2, {'a': 1}) as op2:
                    assert op2.replayed
            with pytest.raises(idempo.Conflict):
                async with conn.transaction():
                    async with idempo.aio.once(conn, s, k2, {'a': 2}):
                        pass
            return done, again, op2
    import idempo.aio
    done, again, op2 = asyncio.run(main())
    assert seen == [idempo.Outcome.BUSY] and done.succeeded and done.attempt == 1
    assert again.replayed and again.result == done.result and payments(k) == 1
    assert op2.result == {'x': 1}


def test_worker_killed_mid_call_then_lookup_and_verify(conn, db, dbname, scope):
    """kill -9 of a worker whose call charged and whose reply never came: its lease runs out
    (unknown), and the next call_once looks the charge up and verifies it: one charge, recorded."""
    import os
    import subprocess
    import sys
    s, k = scope(lease='1 second', verify_settle='0.5 seconds'), new_key()
    db.execute('CREATE TABLE IF NOT EXISTS provider_charges (reference text, charge text)')
    env = {**os.environ, 'PGDATABASE': dbname,
           'PYTHONPATH': os.pathsep.join([os.path.dirname(os.path.dirname(idempo.__file__)),
                                          os.environ.get('PYTHONPATH', '')])}
    worker = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), 'killed_worker.py'), s, k],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout.readline().strip() == 'charged'
    finally:
        worker.kill()                  # SIGKILL
        worker.wait(10)
    assert idempo.lookup(db, s, k).status is Status.IN_PROGRESS

    def find(reference):
        row = db.execute('SELECT charge FROM provider_charges WHERE reference = %s', [reference]).fetchone()
        return {'id': row[0]} if row else None

    def must_not_charge(reference):
        raise AssertionError('charged twice')
    done = idempo.call_once(conn, s, k, must_not_charge, params={'amount': 5}, lookup=find,
                            target_ref=lambda c: c['id'], on_busy='wait', busy_timeout=20)
    assert done.verified and done.succeeded and done.attempt == 1
    assert done.target_ref == f'ch-{worker.pid}'
    assert db.execute('SELECT count(*) FROM provider_charges WHERE reference = %s', [f'{s}/{k}']).fetchone()[0] == 1


def test_heartbeat_extends_by_the_lease_claimed_with(conn, dbname, scope):
    # heartbeat(extend => NULL) extends by the scope's lease (0.3 s here) and never shortens: a
    # claim with lease => 1.5 s beating every third of it (0.5 s) with NULL is never extended and
    # loses the key at 1.5 s
    s, k, seen = scope(lease='0.3 seconds', on_lease_expiry='retry'), new_key(), []

    def call(key):
        time.sleep(2.0)
        with psycopg.connect(dbname=dbname, autocommit=True) as other:
            seen.append(idempo.claim(other, s, k).outcome)
        return {'id': 'ch'}
    done = idempo.call_once(conn, s, k, call, lease='1.5 seconds')
    assert seen == [idempo.Outcome.BUSY]
    assert done.succeeded and done.attempt == 1


class _Stop(BaseException):
    """Not an Exception: as KeyboardInterrupt or a cancelled asyncio task."""


def test_heartbeat_stops_when_the_call_is_interrupted(conn, db, scope):
    s, k = scope(lease='1 second'), new_key()

    def call(key):
        raise _Stop()
    with pytest.raises(_Stop):
        idempo.call_once(conn, s, k, call, heartbeat=0.2)
    time.sleep(1.5)      # a heartbeat left running would keep extending the lease
    assert idempo.claim(db, s, k).outcome is idempo.Outcome.UNKNOWN


def test_async_heartbeat_stops_when_the_task_is_cancelled(dbname, scope):
    s, k = scope(lease='1 second'), new_key()

    async def call(key):
        await asyncio.sleep(60)

    async def main():
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(idempo.aio.call_once(conn, s, k, call, heartbeat=0.2), 0.5)
            await asyncio.sleep(1.5)
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert left == [], left
            return (await idempo.aio.claim(conn, s, k)).outcome
    assert asyncio.run(main()) is idempo.Outcome.UNKNOWN


def test_async_plain_call_does_not_block_the_heartbeat(dbname, scope):
    # a plain (blocking) function given to aio.call_once: run in the event loop, it would stop the
    # heartbeat task and another worker would take the key over under it
    s, k, seen = scope(lease='1 second', on_lease_expiry='retry'), new_key(), []

    async def main():
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            return await idempo.aio.call_once(conn, s, k, _slow_call_probed(dbname, s, k, seen), heartbeat=0.25)
    done = asyncio.run(main())
    assert seen == [idempo.Outcome.BUSY]
    assert done.succeeded and done.attempt == 1


def test_async_cancelled_in_record_leaves_no_transaction_open(dbname, scope):
    s, k = scope(lease='30 seconds'), new_key()

    async def record(conn, value):
        await conn.execute('SELECT 1')
        await asyncio.sleep(60)

    async def main():
        async with await psycopg.AsyncConnection.connect(dbname=dbname, autocommit=True) as conn:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(idempo.aio.call_once(conn, s, k, lambda key: {'id': 'ch'}, record=record), 0.5)
            return conn.info.transaction_status
    assert asyncio.run(main()) == psycopg.pq.TransactionStatus.IDLE
