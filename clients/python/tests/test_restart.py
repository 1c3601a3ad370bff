"""PostgreSQL restarted under a service whose connections come from a psycopg_pool pool: every
pooled connection is stale (the server that held it is gone), and the pool (3.1, Debian 12's)
hands them out unchecked.  A request that meets one before anything was claimed is tried once
more on another connection; met again, it is answered 503 + Retry-After, never 500 (which the
service answered for each stale connection), and the next requests work.

The restart is real when IDEMPO_TEST_RESTART names a command that restarts the server
(clients/python/run sets it to pg_ctl restart -m immediate for its own cluster); against a server
of your own without it, the server ends every connection of the service (pg_terminate_backend),
which the service meets the same way: a pooled connection whose server is gone."""
import json
import os
import subprocess
import uuid

import pytest

from test_http import SCHEMA, Provider, Service, wait_for

psycopg = pytest.importorskip('psycopg')
POOL = 4


def restart(app_name):
    command = os.environ.get('IDEMPO_TEST_RESTART')
    if command:
        subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)
        return
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s', [app_name])
        wait_for('the service\'s connections to end', lambda: admin.execute(
            'SELECT count(*) FROM pg_stat_activity WHERE application_name = %s', [app_name]).fetchone()[0] == 0)


@pytest.mark.parametrize('kind', ['asgi', 'flask'])
def test_a_restart_answers_503_then_works_never_500(kind, dbname):
    pytest.importorskip('psycopg_pool')
    name = f'{dbname}_restart_{kind}'
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE {name}')
    with psycopg.connect(dbname=name, autocommit=True) as db:
        db.execute(open(SCHEMA).read())
    provider = Provider()
    service = Service(kind, name, provider, env={'IDEMPO_SHOP_POOL': str(POOL)})
    try:
        def post(key, who):
            return service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 1}, key)
        for i in range(2 * POOL):
            assert post(str(uuid.uuid4()), f'warm-{kind}')[0] == 201
        with psycopg.connect(dbname='postgres', autocommit=True) as admin:
            assert admin.execute('SELECT count(*) FROM pg_stat_activity WHERE application_name = %s',
                                 [service.app_name]).fetchone()[0] == POOL, 'every pooled connection is open'
        restart(service.app_name)

        answers = [(key, *post(key, f'after-{kind}')) for key in (str(uuid.uuid4()) for _ in range(3 * POOL))]
        statuses = [status for _, status, _, _ in answers]
        assert set(statuses) <= {201, 503}, statuses
        first = statuses.index(201)
        assert statuses[first:] == [201] * (len(statuses) - first), statuses       # then it works
        # each request tries two connections: the pool's stale ones are used up two by two
        assert first <= POOL // 2, statuses
        with psycopg.connect(dbname=name, autocommit=True) as db:
            for key, status, headers, body in answers[:first]:
                assert headers['retry-after'] == '1' and headers['content-type'] == 'application/problem+json'
                assert json.loads(body)['code'] == 'database-unavailable', body
                assert db.execute('SELECT status FROM idempo.lookup(%s, %s)',
                                  ['http.orders', f'anonymous/{key}']).fetchone()[0] is None, 'nothing claimed'
                assert post(key, f'after-{kind}')[0] == 201
            assert db.execute("SELECT count(*) FROM shop.orders WHERE customer = %s",
                              [f'after-{kind}']).fetchone()[0] == len(answers)
    finally:
        service.process.terminate()
        service.process.wait(10)
        provider.server.shutdown()
        with psycopg.connect(dbname='postgres', autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')
