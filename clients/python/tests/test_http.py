"""The HTTP behaviour table (test/examples/http/README.md) on every framework, over real HTTP
against a real server: FastAPI under uvicorn (idempo.asgi), Flask and Django under werkzeug's
threaded server (idempo.flask, idempo.django).  Each framework gets its own database with
test/examples/http/schema.sql, its server as a child process, and a stand-in payment provider
that honours Idempotency-Key, as real ones do."""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import idempo

psycopg = pytest.importorskip('psycopg')

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, '..', '..', '..', 'test', 'examples', 'http', 'schema.sql')
FRAMEWORKS = ['asgi', 'flask', 'django']
NEEDS = {'asgi': ('fastapi', 'uvicorn'), 'flask': ('flask', 'werkzeug'), 'django': ('django', 'psycopg2', 'werkzeug')}


def wait_for(what, condition, timeout=15):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out waiting for {what}')
        time.sleep(0.02)


class Provider:
    """The outside system of POST /payments.  gate: hold calls; fail_next: answer 503."""

    def __init__(self):
        self.charges, self.calls, self.waiting, self.fail_next = {}, {}, 0, 0
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get('Content-Length') or 0))
                key = self.headers['Idempotency-Key']
                with provider.lock:
                    provider.calls[key] = provider.calls.get(key, 0) + 1
                    provider.waiting += 1
                provider.gate.wait()
                with provider.lock:
                    provider.waiting -= 1
                    failing = provider.fail_next > 0
                    provider.fail_next -= failing
                    charge = None if failing else provider.charges.setdefault(key, {'id': f'ch_{uuid.uuid4()}'})
                body = json.dumps(charge).encode()
                try:
                    self.send_response(503 if failing else 200)
                    self.send_header('Content-Type', 'application/json')
                    self.send_header('Content-Length', str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except ConnectionError:
                    pass

            def log_message(self, format, *args):
                pass

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'


class Service:
    def __init__(self, kind, dbname, provider, env=None):
        self.kind, self.dbname, self.provider, self.env = kind, dbname, provider, env or {}
        self.app_name = f'idempo-shop-{kind}'
        self.start()

    def start(self):
        env = {**os.environ, **self.env, 'PGDATABASE': self.dbname, 'PROVIDER_URL': self.provider.url,
               'APP_NAME': self.app_name,
               # the idempo these tests imported (installed, or the source tree in development)
               'PYTHONPATH': os.pathsep.join([os.path.dirname(os.path.dirname(idempo.__file__)),
                                              os.environ.get('PYTHONPATH', '')])}
        self.process = subprocess.Popen([sys.executable, '-u', os.path.join(HERE, 'shop', 'serve.py'), self.kind],
                                        stdout=subprocess.PIPE, env=env, text=True)
        line = self.process.stdout.readline()
        if not line.startswith('listening on http://127.0.0.1:'):
            self.process.kill()
            raise RuntimeError(f'the {self.kind} service did not start: {line!r}')
        self.port = int(line.rsplit(':', 1)[1])
        wait_for('the service to accept connections', self.accepts)

    def accepts(self):
        try:
            c = http.client.HTTPConnection('127.0.0.1', self.port, timeout=1)
            c.request('GET', '/health')
            c.getresponse().read()
            c.close()
            return True
        except OSError:
            return False

    def kill(self):
        self.process.kill()             # SIGKILL: no cleanup, no goodbye
        self.process.wait(10)

    def post(self, target, body, key=None, content_type='application/json', headers=()):
        """POST over a fresh connection; key may be a list (several headers).  -> (status, headers, body)"""
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=30)
        try:
            conn.putrequest('POST', target)
            conn.putheader('Content-Type', content_type)
            conn.putheader('Content-Length', str(len(data)))
            for k in ([] if key is None else key if isinstance(key, list) else [key]):
                conn.putheader('Idempotency-Key', k)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(data)
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
        finally:
            conn.close()


@pytest.fixture(scope='module', params=FRAMEWORKS)
def shop(request, dbname):
    for module in NEEDS[request.param]:
        pytest.importorskip(module)
    name = f'{dbname}_{request.param}'
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE {name}')
    db = psycopg.connect(dbname=name, autocommit=True)
    db.execute(open(SCHEMA).read())
    if os.environ.get('IDEMPO_TEST_SHIM') == '1':
        db.execute(open(os.path.join(HERE, 'shim.sql')).read())
    provider = Provider()
    service = Service(request.param, name, provider)
    yield service, db, provider
    service.process.terminate()
    service.process.wait(10)
    provider.server.shutdown()
    db.close()
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')


def one(db, sql, args=()):
    row = db.execute(sql, args).fetchone()
    return row[0] if row else None


def new_key():
    return str(uuid.uuid4())


def orders_of(db, customer):
    return one(db, 'SELECT count(*) FROM shop.orders WHERE customer = %s', [customer])


def status_of(db, scope, key):
    return one(db, 'SELECT status::text FROM idempo.lookup(%s, %s)', [scope, key])


def expect(actual, expected):
    assert actual == expected, f'got {actual}, expected {expected}'


def test_first_request_then_replay_of_status_headers_body(shop):
    service, db, _ = shop
    key, who = new_key(), f'ada-{service.kind}'
    order = {'customer': who, 'sku': 'A-7', 'qty': 2}
    status, headers, body = service.post('/orders', order, key)
    assert status == 201, (status, body)
    assert {**json.loads(body), 'id': None} == {**order, 'id': None} and type(json.loads(body)['id']) is int
    assert headers['x-order-handler'] == service.kind and 'idempotent-replayed' not in headers
    # the same request again: reordered, reformatted, 2.0 for 2 -- the same fingerprint
    again = json.dumps({'qty': 2.0, 'sku': 'A-7', 'customer': who}, indent=1)
    status2, headers2, body2 = service.post('/orders', again, key)
    assert (status2, body2) == (201, body)
    assert headers2['idempotent-replayed'] == 'true' and headers2['x-order-handler'] == service.kind
    assert headers2['content-type'] == headers['content-type']
    assert orders_of(db, who) == 1
    # the draft's quoted form names the same key
    status3, headers3, _ = service.post('/orders', order, f'"{key}"')
    assert status3 == 201 and headers3['idempotent-replayed'] == 'true'


def test_conflict_422(shop):
    service, db, _ = shop
    key, who = new_key(), f'cy-{service.kind}'
    order = {'customer': who, 'sku': 'A-7', 'qty': 2}
    expect(service.post('/orders', order, key)[0], 201)
    status, headers, _ = service.post('/orders', {**order, 'qty': 5}, key)
    assert status == 422 and headers['content-type'] == 'application/problem+json'
    assert one(db, "SELECT count(*) FROM idempo.conflicts WHERE scope = 'http.orders' AND key = %s",
               [f'anonymous/{key}']) == 1
    expect(service.post('/orders?coupon=x', order, key)[0], 422)        # another path (a query)
    assert orders_of(db, who) == 1


def test_missing_and_malformed_keys_400(shop):
    service, db, _ = shop
    who = f'nokey-{service.kind}'
    status, _, body = service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 1})
    assert status == 400 and json.loads(body)['type'].endswith('#missing-key'), (status, body)
    # 'a, b': two values of a field that admits one (two headers joined by a proxy); 'a b': not visible ASCII
    for bad in ['k' * 256, '', '""', 'a,b', 'a, b', 'a b', '"a b"', 'kéy'.encode().decode('latin-1'), '"unterminated',
                [new_key(), new_key()]]:
        status, _, body = service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 1}, bad)
        assert status == 400 and json.loads(body)['code'] == 'malformed-key', (bad, status, body)
    assert orders_of(db, who) == 0
    expect(service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 1}, 'k' * 255 + service.kind[:0])[0], 201)


def test_the_view_loses_its_connection_503_and_the_retry_runs(shop):
    # the server ends the connection of the view's transaction (pg_terminate_backend, as a restart
    # does): the framework's 500, or the exception, went out as it is; nothing was committed, so
    # the answer is 503 + Retry-After and the retry with the same key runs
    service, db, _ = shop
    k, who = new_key(), f'lost-{service.kind}'
    order = {'customer': who, 'sku': 'A-7', 'qty': 1}
    status, headers, body = service.post('/orders', order, k)
    assert status == 503 and headers['content-type'] == 'application/problem+json', (status, body)
    assert headers['retry-after'] == '1' and json.loads(body)['code'] == 'database-unavailable', (headers, body)
    assert status_of(db, 'http.orders', f'anonymous/{k}') is None and orders_of(db, who) == 0
    status, _, body = service.post('/orders', order, k)
    assert status == 201, (status, body)
    assert orders_of(db, who) == 1


def test_invalid_bodies_use_no_key(shop):
    service, db, _ = shop
    k, who = new_key(), f'bo-{service.kind}'
    expect(service.post('/orders', '{"customer": "bo",', k)[0], 400)
    expect(service.post('/orders', 'customer=bo', k, content_type='text/plain')[0], 415)
    expect(service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 0}, k)[0], 400)
    expect(service.post('/orders', r'{"customer": "bo\u0000", "sku": "A-7", "qty": 1}', k)[0], 400)
    assert status_of(db, 'http.orders', f'anonymous/{k}') is None
    expect(service.post('/orders', {'customer': who, 'sku': 'A-7', 'qty': 1}, k)[0], 201)


def test_deeply_nested_json_is_refused_400_and_uses_no_key(shop):
    # json.loads raised RecursionError at about 1,000 levels (a 500); the limit is 64 levels of
    # arrays and objects (idempo.http.MAX_JSON_DEPTH), the Node middleware's too
    MAX_JSON_DEPTH = 64
    service, db, _ = shop
    k, who = new_key(), f'deep-{service.kind}'
    order = {'customer': who, 'sku': 'A-7', 'qty': 1}

    def nested(depth):          # the order object is one level: 'x' holds depth - 1 more
        return json.dumps(order)[:-1] + ', "x": ' + '[' * (depth - 1) + ']' * (depth - 1) + '}'
    for depth in (5000, MAX_JSON_DEPTH + 1):
        status, headers, body = service.post('/orders', nested(depth), k)
        assert status == 400 and headers['content-type'] == 'application/problem+json', (depth, status, body)
        assert json.loads(body)['type'].endswith('#json-too-deep'), body
    assert status_of(db, 'http.orders', f'anonymous/{k}') is None
    expect(service.post('/orders', nested(MAX_JSON_DEPTH), k)[0], 201)
    assert orders_of(db, who) == 1
    from idempo.http import MAX_JSON_DEPTH as limit
    assert limit == MAX_JSON_DEPTH


def test_json_depth_counts_arrays_and_objects_not_brackets_in_strings():
    # the same cases as the Node library's keys.test.js
    from idempo.http import MAX_JSON_DEPTH, json_too_deep

    def nest(depth):
        return '[' * depth + ']' * depth
    cases = [(nest(64), False), (nest(65), True), ('{"a":' + nest(63) + '}', False), ('{"a":' + nest(64) + '}', True),
             ('["' + '[' * 100 + '"]', False), ('{"a\\"[[[":' + nest(64) + '}', True),
             ('["\\\\",' + nest(63) + ']', False),
             ('[{"a":[{"b":' + nest(60) + '}]}]', False), ('[{"a":[{"b":' + nest(61) + '}]}]', True)]
    assert MAX_JSON_DEPTH == 64
    for text, deep in cases:
        json.loads(text)                     # valid JSON, every one
        assert json_too_deep(text.encode()) is deep, text


def test_busy_409_while_the_first_is_in_its_transaction(shop):
    service, db, _ = shop
    k, who = new_key(), f'dee-{service.kind}'
    body = {'customer': who, 'sku': 'A-7', 'qty': 1}
    with psycopg.connect(dbname=service.dbname) as locker, ThreadPoolExecutor(1) as pool:
        locker.execute('LOCK TABLE shop.orders IN SHARE MODE')     # the first request's INSERT waits
        first = pool.submit(service.post, '/orders', body, k)
        wait_for('the first request to wait inside its transaction', lambda: one(
            db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO shop.orders%%'", [service.app_name]) == 1)
        status, headers, _ = service.post('/orders', body, k)
        assert status == 409 and headers['retry-after'] == '1', status
        locker.commit()
        expect(first.result()[0], 201)
    status, headers, _ = service.post('/orders', body, k)
    assert status == 201 and headers['idempotent-replayed'] == 'true'
    assert orders_of(db, who) == 1


def _simulated_failure(db, table, condition):
    db.execute("CREATE OR REPLACE FUNCTION shop.simulated_failure() RETURNS trigger LANGUAGE plpgsql "
               "AS $$BEGIN RAISE EXCEPTION 'simulated failure'; END$$")
    db.execute(f'CREATE TRIGGER simulated_failure BEFORE INSERT ON shop.{table} FOR EACH ROW '
               f'WHEN ({condition}) EXECUTE FUNCTION shop.simulated_failure()')


def _end_simulated_failure(db):
    db.execute('DROP FUNCTION shop.simulated_failure() CASCADE')


def test_handler_error_500_is_not_stored(shop):
    service, db, _ = shop
    k, who = new_key(), f'eve-{service.kind}'
    body = {'customer': who, 'sku': 'A-7', 'qty': 1}
    _simulated_failure(db, 'orders', f"NEW.customer = '{who}'")
    try:
        expect(service.post('/orders', body, k)[0], 500)
        assert status_of(db, 'http.orders', f'anonymous/{k}') is None
    finally:
        _end_simulated_failure(db)
    status, headers, _ = service.post('/orders', body, k)
    assert status == 201 and 'idempotent-replayed' not in headers
    assert orders_of(db, who) == 1


def test_a_5xx_reply_is_not_stored_and_its_writes_roll_back(shop):
    service, db, _ = shop
    k, who = new_key(), f'flaky-{service.kind}'
    body = {'customer': who, 'sku': 'A-7', 'qty': 1}
    for _ in range(2):
        status, headers, _ = service.post('/orders', body, k)
        assert status == 503 and 'idempotent-replayed' not in headers, status
    assert status_of(db, 'http.orders', f'anonymous/{k}') is None
    assert orders_of(db, who) == 0


def test_a_4xx_the_handler_decided_is_stored(shop):
    service, db, _ = shop
    k = new_key()
    body = {'customer': 'nobody', 'sku': 'A-7', 'qty': 1}
    status, headers, first = service.post('/orders', body, k)
    assert status == 404 and 'idempotent-replayed' not in headers
    assert status_of(db, 'http.orders', f'anonymous/{k}') == 'succeeded'
    status, headers, again = service.post('/orders', body, k)
    assert (status, again, headers['idempotent-replayed']) == (404, first, 'true')


def test_keys_are_per_client(shop):
    service, db, _ = shop
    k, who = new_key(), f'fay-{service.kind}'
    body = {'customer': who, 'sku': 'A-7', 'qty': 1}
    expect(service.post('/orders', body, k, headers=[('X-Client', 'acme')])[0], 201)
    status, headers, _ = service.post('/orders', body, k, headers=[('X-Client', 'globex')])
    assert status == 201 and 'idempotent-replayed' not in headers         # another client's key
    assert service.post('/orders', body, k, headers=[('X-Client', 'acme')])[1]['idempotent-replayed'] == 'true'
    assert orders_of(db, who) == 2
    assert status_of(db, 'http.orders', f'acme/{k}') == 'succeeded'


def test_key_from_payload_fields(shop):
    service, db, _ = shop
    line = f'{service.kind}-{uuid.uuid4().hex[:6]}'
    status, headers, first = service.post('/reservations', {'order_id': 7, 'line': line})
    assert status == 201 and 'idempotent-replayed' not in headers, (status, first)
    status, headers, again = service.post('/reservations', {'line': line, 'order_id': 7})
    assert (status, again, headers['idempotent-replayed']) == (201, first, 'true')
    assert status_of(db, 'http.orders', f'7/{line}') == 'succeeded'
    expect(service.post('/reservations', {'order_id': 7})[0], 400)
    assert orders_of(db, 'reservation') >= 1
    assert one(db, "SELECT count(*) FROM shop.orders WHERE sku = %s", [f'line-{line}']) == 1


def test_fifty_concurrent_duplicates_run_once(shop):
    service, db, _ = shop
    k, who = new_key(), f'gus-{service.kind}'
    body = {'customer': who, 'sku': 'A-7', 'qty': 3}
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: service.post('/orders', body, k), range(50)))
    statuses = sorted(a[0] for a in answers)
    assert set(statuses) <= {201, 409}, statuses
    fresh = [a for a in answers if a[0] == 201 and 'idempotent-replayed' not in a[1]]
    assert len(fresh) == 1, statuses
    assert all(a[2] == fresh[0][2] for a in answers if a[0] == 201)
    assert orders_of(db, who) == 1


def test_payments_two_transactions(shop):
    service, db, provider = shop
    k = new_key()
    body = {'order_id': 101, 'amount_cents': 1250}
    status, headers, paid = service.post('/payments', body, k)
    assert status == 201, (status, paid)
    status, headers, again = service.post('/payments', body, k)
    assert (status, again, headers['idempotent-replayed']) == (201, paid, 'true')
    assert provider.calls[f'http.payments/anonymous/{k}'] == 1
    assert one(db, 'SELECT count(*) FROM shop.payments WHERE charge_id = %s', [json.loads(paid)['charge_id']]) == 1


def test_busy_during_the_provider_call(shop):
    service, db, provider = shop
    k = new_key()
    body = {'order_id': 102, 'amount_cents': 990}
    provider.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        try:
            first = pool.submit(service.post, '/payments', body, k)
            wait_for('the provider call to be in flight', lambda: provider.waiting == 1)
            assert status_of(db, 'http.payments', f'anonymous/{k}') == 'in_progress'
            expect(service.post('/payments', body, k)[0], 409)
            expect(service.post('/payments', {**body, 'amount_cents': 1}, k)[0], 422)
        finally:
            provider.gate.set()
        expect(first.result()[0], 201)
    assert service.post('/payments', body, k)[1]['idempotent-replayed'] == 'true'


def test_the_lease_is_extended_while_the_provider_call_runs(shop):
    """Over real HTTP on each framework (Django's beat goes to its driver's connection): while the
    calls_out handler waits for the provider, the heartbeat moves the attempt's lease end on
    (every third of the lease, 3 s here: the shop's provider call times out after 10 s); the
    call then completes."""
    service, db, provider = shop
    k = new_key()
    body = {'order_id': 103, 'amount_cents': 995}
    provider.gate.clear()
    db.execute("SELECT idempo.alter_scope('http.payments', lease => '3 seconds')")
    with ThreadPoolExecutor(1) as pool:
        try:
            first = pool.submit(service.post, '/payments', body, k)
            wait_for('the provider call to be in flight', lambda: provider.waiting == 1)
            claimed_end = one(db, 'SELECT lease_expires_at FROM idempo.lookup(%s, %s)', ['http.payments', f'anonymous/{k}'])
            wait_for('a heartbeat to extend the lease', lambda: one(
                db, 'SELECT lease_expires_at > %s FROM idempo.lookup(%s, %s)',
                [claimed_end, 'http.payments', f'anonymous/{k}']), timeout=8)
        finally:
            provider.gate.set()
            db.execute("SELECT idempo.alter_scope('http.payments', lease => '30 seconds')")
        expect(first.result()[0], 201)
    assert status_of(db, 'http.payments', f'anonymous/{k}') == 'succeeded'


def test_provider_fails_502_then_attempt_2(shop):
    service, db, provider = shop
    k = new_key()
    body = {'order_id': 103, 'amount_cents': 500}
    provider.fail_next = 1
    expect(service.post('/payments', body, k)[0], 502)
    assert status_of(db, 'http.payments', f'anonymous/{k}') == 'retryable'
    expect(service.post('/payments', body, k)[0], 201)
    assert one(db, "SELECT attempt FROM idempo.lookup('http.payments', %s)", [f'anonymous/{k}']) == 2


def test_attempts_exhausted_409_review(shop):
    service, db, provider = shop
    k = new_key()
    body = {'order_id': 106, 'amount_cents': 300}
    provider.fail_next = 5
    for attempt in range(1, 6):
        assert service.post('/payments', body, k)[0] == 502, attempt
    status, _, stuck = service.post('/payments', body, k)
    assert status == 409 and json.loads(stuck)['type'].endswith('#key-in-review'), (status, stuck)
    assert status_of(db, 'http.payments', f'anonymous/{k}') == 'in_review'


def test_settled_by_a_person_without_a_reply_409_with_what_is_known(shop):
    # a key a person settled (resolve, or verify with a target_ref) has no stored reply: the
    # replay raised in Reply.from_stored, a 500 on every retry; the Node middleware answered a
    # 409 of its own.  Both: 409 settled-without-reply with the operation's status and target_ref.
    service, db, provider = shop
    for n, resolution, ref in ((0, 'succeeded', f'ch_manual_{service.kind}'), (1, 'failed', None)):
        k = new_key()
        body = {'order_id': 107 + n, 'amount_cents': 300}
        provider.fail_next = 1
        assert service.post('/payments', body, k)[0] == 502            # failed retryable: no result
        db.execute("SELECT idempo.request_review('http.payments', %s)", [f'anonymous/{k}'])
        db.execute("SELECT idempo.resolve('http.payments', %s, %s, 'ops@example.com', %s)",
                   [f'anonymous/{k}', resolution, ref])
        for _ in range(2):
            status, headers, answer = service.post('/payments', body, k)
            assert status == 409 and headers['content-type'] == 'application/problem+json', (status, answer)
            problem = json.loads(answer)
            assert problem['type'].endswith('#settled-without-reply'), problem
            assert (problem['operation_status'], problem['target_ref']) == (resolution, ref), problem


def test_error_after_the_call_500_then_the_same_charge(shop):
    service, db, provider = shop
    k = new_key()
    order_id = 10400 + FRAMEWORKS.index(service.kind)
    body = {'order_id': order_id, 'amount_cents': 4242}
    _simulated_failure(db, 'payments', f'NEW.order_id = {order_id}')
    try:
        expect(service.post('/payments', body, k)[0], 500)
        assert status_of(db, 'http.payments', f'anonymous/{k}') == 'retryable'
    finally:
        _end_simulated_failure(db)
    status, _, retry = service.post('/payments', body, k)
    assert status == 201, (status, retry)
    assert json.loads(retry)['charge_id'] == provider.charges[f'http.payments/anonymous/{k}']['id']
    assert provider.calls[f'http.payments/anonymous/{k}'] == 2


def test_killed_mid_request_the_retry_runs_after_the_lease(shop):
    """kill -9 of the service while the provider call is in flight: 409 until the lease runs
    out, then the retry takes over as attempt 2 and gets the same charge; one payment."""
    service, db, provider = shop
    k = new_key()
    order_id = 10500 + FRAMEWORKS.index(service.kind)
    body = {'order_id': order_id, 'amount_cents': 700}
    db.execute("SELECT idempo.alter_scope('http.payments', lease => '8 seconds')")
    provider.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        try:
            doomed = pool.submit(service.post, '/payments', body, k)
            wait_for('the provider call to be in flight', lambda: provider.waiting == 1)
            service.kill()
            assert isinstance(doomed.exception(10), (ConnectionError, http.client.HTTPException))
            service.start()
        finally:
            provider.gate.set()
            db.execute("SELECT idempo.alter_scope('http.payments', lease => '30 seconds')")
    # the dead attempt's lease still runs: 409 (the restart takes well under its 8 seconds)
    assert one(db, "SELECT lease_expires_at > idempo.now() FROM idempo.lookup('http.payments', %s)",
               [f'anonymous/{k}'])
    status, headers, _ = service.post('/payments', body, k)
    # Retry-After: the seconds left on the dead attempt's lease, rounded up (at most its 8)
    assert status == 409 and 1 <= int(headers['retry-after']) <= 8, (status, headers.get('retry-after'))
    wait_for('the lease to run out', lambda: one(
        db, "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() "
            "FROM idempo.lookup('http.payments', %s)", [f'anonymous/{k}']))
    status, _, retry = service.post('/payments', body, k)
    assert status == 201, (status, retry)
    assert one(db, "SELECT attempt FROM idempo.lookup('http.payments', %s)", [f'anonymous/{k}']) == 2
    assert json.loads(retry)['charge_id'] == provider.charges[f'http.payments/anonymous/{k}']['id']
    assert one(db, 'SELECT count(*) FROM shop.payments WHERE order_id = %s', [order_id]) == 1


# The integrations that know whether the view started: Django (process_view, after
# CsrfViewMiddleware) and Flask (dispatch_request, after before_request).  ASGI cannot tell.
KNOWS_THE_VIEW_STARTED = {'asgi': False, 'flask': True, 'django': True}


def test_refused_before_the_view_started_frees_the_key(shop):
    """POST /transfers (calls_out, on_error='doubt') refused by the check before its view:
    Django's CSRF check (403), Flask's before_request (401).  Nothing was called, so the key is
    freed: the caller, its credentials mended, runs attempt 2 with the same key.  It was left to
    the lease: 409 while it ran, then a key in review.  Under ASGI (a FastAPI dependency's 401)
    the middleware cannot tell, and the key is left to the lease as before."""
    service, db, _ = shop
    k, body = new_key(), {'to': 'acct-7'}
    status, _, answer = service.post('/transfers', body, k)
    assert status == (403 if service.kind == 'django' else 401), (status, answer)
    expect(status_of(db, 'http.payments', k), 'retryable' if KNOWS_THE_VIEW_STARTED[service.kind] else 'in_progress')
    status, _, answer = service.post('/transfers', body, k, headers=common_credentials())
    if KNOWS_THE_VIEW_STARTED[service.kind]:
        assert status_of(db, 'http.payments', k) == 'succeeded'
        assert (status, json.loads(answer)) == (201, {'to': 'acct-7'})
        assert one(db, "SELECT attempt FROM idempo.lookup('http.payments', %s)", [k]) == 2
    else:
        assert (status, json.loads(answer)['code']) == (409, 'key-in-use')
        assert status_of(db, 'http.payments', k) == 'in_progress'


def test_refused_by_the_view_that_started_is_left_in_doubt(shop):
    """The converse: the check let the request through and the view itself answered 403 (not
    stored) or raised (500).  It may have called another system: on_error='doubt' leaves the
    attempt to its lease, on every framework."""
    service, db, _ = shop
    for to, expected in (('blocked', 403), ('crash', 500)):
        k = new_key()
        status, _, answer = service.post('/transfers', {'to': to}, k, headers=common_credentials())
        assert status == expected, (to, status, answer)
        assert status_of(db, 'http.payments', k) == 'in_progress', to
        assert one(db, "SELECT lease_expires_at > idempo.now() FROM idempo.lookup('http.payments', %s)", [k])
        status, _, answer = service.post('/transfers', {'to': to}, k, headers=common_credentials())
        assert (status, json.loads(answer)['code']) == (409, 'key-in-use'), (to, status, answer)


def common_credentials():
    """What the shop's check before /transfers wants (tests/shop/common.py's CREDENTIALS)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('shop_common', os.path.join(HERE, 'shop', 'common.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CREDENTIALS


def test_calls_out_by_default_leaves_a_lost_reply_to_its_lease(dbname, db, scope):
    """Route(calls_out=True) with no on_error, against a provider that does not deduplicate:
    the first call charges and its reply is lost.  The attempt is left to its lease: the key
    answers 409 while the lease runs, then 409 key-in-review once it is unknown; the provider
    is called once.  (With 'retry' the default, the retry charged a second time: a new user's
    trial over HTTP.)  A reply that is not stored (a 502) is left to its lease alike."""
    import io
    from idempo.http import Route
    from idempo.wsgi import ENVIRON_KEY, IdempotencyMiddleware, connect
    s = scope()                                 # on_lease_expiry => 'unknown', the default
    route = Route(s, calls_out=True, lease='1 second')
    assert route.on_error == 'doubt'
    charges, answers = [], []

    def app(environ, start_response):
        charges.append(environ[ENVIRON_KEY].provider_key)           # the provider charged...
        if answers:
            start_response(answers.pop(0), [('content-type', 'text/plain')])
            return [b'the provider said no']
        raise ConnectionResetError('the connection closed before the reply')    # ...the reply is lost
    mw = IdempotencyMiddleware(app, routes={'/pay': route}, connection=connect(dbname=dbname))

    def post(key):
        got = {}
        environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/pay', 'CONTENT_TYPE': 'application/json',
                   'CONTENT_LENGTH': '2', 'wsgi.input': io.BytesIO(b'{}'), 'HTTP_IDEMPOTENCY_KEY': key}
        body = b''.join(mw(environ, lambda status, headers: got.update(status=status, headers=dict(headers))))
        return got['status'][:3], got['headers'], json.loads(body) if body.startswith(b'{') else body

    with pytest.raises(ConnectionResetError):
        post('pay-1')
    assert status_of(db, s, 'pay-1') == 'in_progress'
    status, headers, answer = post('pay-1')                 # the lease runs: busy, no second call
    assert (status, headers.get('retry-after'), answer['code']) == ('409', '1', 'key-in-use')
    assert charges == [f'{s}/pay-1']
    wait_for('the lease to run out', lambda: one(
        # or already swept to unknown (lease_expires_at NULL): the sweeper may come first
        db, "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup(%s, %s)",
        [s, 'pay-1']))
    status, _, answer = post('pay-1')                       # unknown: a person or a verifier decides
    assert (status, answer['code']) == ('409', 'key-in-review') and 'unknown' in answer['detail']
    assert status_of(db, s, 'pay-1') == 'unknown'
    assert charges == [f'{s}/pay-1']

    answers.append('502 Bad Gateway')                       # a reply that is not stored
    assert post('pay-2')[0] == '502'
    assert status_of(db, s, 'pay-2') == 'in_progress'
    assert post('pay-2')[0] == '409' and charges == [f'{s}/pay-1', f'{s}/pay-2']


def _lost_reply_service(dbname, route, charges, **kw):
    """A WSGI service on route (calls_out) whose first call charges and loses its reply, and a
    post(key) -> (status, headers, answer)."""
    import io
    from idempo.wsgi import ENVIRON_KEY, IdempotencyMiddleware, connect

    def app(environ, start_response):
        charges.append(environ[ENVIRON_KEY].provider_key)
        if len(charges) == 1:
            raise ConnectionResetError('the connection closed before the reply')
        start_response('201 Created', [('content-type', 'application/json')])
        return [b'{"charged": %d}' % len(charges)]
    mw = IdempotencyMiddleware(app, routes={'/pay': route}, connection=connect(dbname=dbname))

    def post(key):
        got = {}
        environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/pay', 'CONTENT_TYPE': 'application/json',
                   'CONTENT_LENGTH': '2', 'wsgi.input': io.BytesIO(b'{}'), 'HTTP_IDEMPOTENCY_KEY': key}
        body = b''.join(mw(environ, lambda status, headers: got.update(status=status, headers=dict(headers))))
        return got['status'][:3], got['headers'], json.loads(body) if body.startswith(b'{') else body
    return post


def _until_unknown(db, s, key):
    wait_for('the lease to run out', lambda: one(
        db, "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() FROM idempo.lookup(%s, %s)", [s, key]))


def test_retries_of_an_unknown_key_leave_the_verification_lease_to_the_verifier(dbname, db, scope):
    """A route without a lookup: a retry that meets unknown is answered 409 (a person or a
    verifier decides) and takes no verification lease, however often it comes: the verifier's
    claim right after the retries is answered unknown with the lease (the retries' claims took
    it, and the verifier was told busy while clients kept retrying)."""
    from idempo.http import Route
    s = scope()
    charges = []
    post = _lost_reply_service(dbname, Route(s, calls_out=True, lease='1 second'), charges)
    with pytest.raises(ConnectionResetError):
        post('pay-1')
    _until_unknown(db, s, 'pay-1')
    for _ in range(3):
        status, _, answer = post('pay-1')
        assert (status, answer['code']) == ('409', 'key-in-review') and 'unknown' in answer['detail']
    assert one(db, "SELECT lease_expires_at IS NULL OR lease_expires_at <= idempo.now() "
                   "FROM idempo.lookup(%s, 'pay-1')", [s]), 'a retry took the verification lease'
    outcome, leased = db.execute("SELECT outcome::text, lease_expires_at > idempo.now() "
                                 "FROM idempo.claim(%s, 'pay-1', params => NULL)", [s]).fetchone()
    assert (outcome, leased) == ('unknown', True)
    assert charges == [f'{s}/pay-1']


def test_a_route_lookup_settles_an_unknown_key_on_the_retry(dbname, db, scope):
    """Route(lookup=...): the retry that meets unknown takes the verification lease, looks the
    action up and verifies.  Found (a Reply): stored and answered, and replayed from then on;
    nothing found before verify_settle has passed: 409 key-in-doubt, the lease ended; nothing
    found after it: the request runs as the next attempt."""
    from idempo.http import Reply, Route
    provider = {}

    def lookup(provider_key):
        found = provider.get(provider_key)
        return None if found is None else Reply(200, [('content-type', 'application/json')], found)

    # found
    s = scope()
    charges = []
    post = _lost_reply_service(dbname, Route(s, calls_out=True, lease='1 second', lookup=lookup), charges)
    with pytest.raises(ConnectionResetError):
        post('pay-1')
    provider[f'{s}/pay-1'] = b'{"charged": "as found"}'
    _until_unknown(db, s, 'pay-1')
    status, headers, answer = post('pay-1')
    assert (status, answer) == ('200', {'charged': 'as found'})
    assert status_of(db, s, 'pay-1') == 'succeeded'
    assert post('pay-1')[:3:2] == ('200', {'charged': 'as found'})
    assert charges == [f'{s}/pay-1']

    # not found, too early to believe it
    s = scope(verify_settle='1 hour')
    charges = []
    post = _lost_reply_service(dbname, Route(s, calls_out=True, lease='1 second', lookup=lookup), charges)
    with pytest.raises(ConnectionResetError):
        post('pay-1')
    _until_unknown(db, s, 'pay-1')
    status, _, answer = post('pay-1')
    assert (status, answer['code']) == ('409', 'key-in-doubt') and answer['settles_at'] is not None
    # one format in both middlewares: ISO 8601, UTC, milliseconds, 'Z' (JavaScript's toISOString)
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z', answer['settles_at']), answer['settles_at']
    assert status_of(db, s, 'pay-1') == 'unknown'
    assert one(db, "SELECT lease_expires_at IS NULL FROM idempo.lookup(%s, 'pay-1')", [s])
    assert charges == [f'{s}/pay-1']

    # not found once verify_settle has passed: the retry runs as attempt 2
    s = scope(verify_settle='1 millisecond')
    charges = []
    post = _lost_reply_service(dbname, Route(s, calls_out=True, lease='1 second', lookup=lookup), charges)
    with pytest.raises(ConnectionResetError):
        post('pay-1')
    _until_unknown(db, s, 'pay-1')
    status, _, answer = post('pay-1')
    assert (status, answer) == ('201', {'charged': 2})
    assert one(db, "SELECT attempt FROM idempo.lookup(%s, 'pay-1')", [s]) == 2
    assert charges == [f'{s}/pay-1'] * 2


def test_an_async_route_lookup_settles_an_unknown_key_under_asgi(dbname, db, scope):
    """The same under ASGI, with an async lookup: the retry that meets unknown awaits it and
    answers the reply it found."""
    import asyncio
    from idempo.asgi import IdempotencyMiddleware, connect
    from idempo.http import Reply, Route
    s = scope()
    calls, provider = [], {}

    async def lookup(provider_key):
        found = provider.get(provider_key)
        return None if found is None else Reply(200, [('content-type', 'application/json')], found)

    async def app(asgi_scope, receive, send):
        calls.append(asgi_scope['state']['idempo'].provider_key if 'state' in asgi_scope else None)
        raise ConnectionResetError('the connection closed before the reply')
    mw = IdempotencyMiddleware(app, routes={'/pay': Route(s, calls_out=True, lease='1 second', lookup=lookup)},
                               connection=connect(dbname=dbname))

    def post(key):
        status, _, body = _asgi_post(mw, key)
        return status, body

    with pytest.raises(ConnectionResetError):
        post('pay-1')
    provider[f'{s}/pay-1'] = b'{"charged": "as found"}'
    _until_unknown(db, s, 'pay-1')
    assert post('pay-1') == (200, b'{"charged": "as found"}')
    assert status_of(db, s, 'pay-1') == 'succeeded' and len(calls) == 1


def _asgi_post(mw, key, path='/pay'):
    """POST {} with an Idempotency-Key to an ASGI app in this process -> (status, headers, body)."""
    import asyncio
    sent = []

    async def receive():
        return {'type': 'http.request', 'body': b'{}', 'more_body': False}

    async def send(message):
        sent.append(message)
    asgi_scope = {'type': 'http', 'method': 'POST', 'path': path, 'root_path': '', 'query_string': b'',
                  'headers': [(b'content-type', b'application/json'), (b'idempotency-key', key.encode())]}
    asyncio.run(mw(asgi_scope, receive, send))
    return (sent[0]['status'], {k.decode(): v.decode() for k, v in sent[0]['headers']},
            b''.join(m.get('body', b'') for m in sent[1:]))


def _slow_call_service(kind, dbname, route, calls, outside_call):
    """A calls_out service (in this process, WSGI or ASGI) whose handler records its call, runs
    outside_call() (the other system) and then writes through ctx.begin(); -> post(key) ->
    (status, headers, body bytes)."""
    import asyncio
    import io
    if kind == 'wsgi':
        from idempo.wsgi import ENVIRON_KEY, IdempotencyMiddleware, connect

        def app(environ, start_response):
            ctx = environ[ENVIRON_KEY]
            calls.append(ctx.attempt)
            outside_call()
            ctx.begin()
            ctx.conn.execute('SELECT 1')
            start_response('201 Created', [('content-type', 'application/json')])
            return [b'{"attempt": %d}' % ctx.attempt]
        mw = IdempotencyMiddleware(app, routes={'/pay': route}, connection=connect(dbname=dbname))

        def post(key):
            got = {}
            environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/pay', 'CONTENT_TYPE': 'application/json',
                       'CONTENT_LENGTH': '2', 'wsgi.input': io.BytesIO(b'{}'), 'HTTP_IDEMPOTENCY_KEY': key}
            body = b''.join(mw(environ, lambda status, headers: got.update(status=status, headers=dict(headers))))
            return int(got['status'][:3]), got['headers'], body
        return post
    from idempo.asgi import IdempotencyMiddleware, connect

    async def asgi_app(asgi_scope, receive, send):
        ctx = asgi_scope['state']['idempo']
        calls.append(ctx.attempt)
        await asyncio.to_thread(outside_call)
        await ctx.begin()
        await ctx.conn.execute('SELECT 1')
        await send({'type': 'http.response.start', 'status': 201, 'headers': [(b'content-type', b'application/json')]})
        await send({'type': 'http.response.body', 'body': b'{"attempt": %d}' % ctx.attempt})
    amw = IdempotencyMiddleware(asgi_app, routes={'/pay': route}, connection=connect(dbname=dbname))

    return lambda key: _asgi_post(amw, key)


@pytest.mark.parametrize('kind', ['wsgi', 'asgi'])
def test_a_calls_out_handler_holds_its_lease_while_the_outside_call_runs(kind, dbname, db, scope):
    """A calls_out handler whose outside call outlasts the lease and the scope's verify_settle:
    the heartbeat holds the attempt's lease, so a retry on a route whose lookup finds nothing
    (the first call is still in flight) is answered 409 key-in-use with Retry-After, and the
    other system is called once.  (With no heartbeat the key turned unknown under the call, the
    retry verified not-found and ran attempt 2: a second call.)  The first request then
    completes, and its reply is replayed."""
    from idempo.http import Route
    s = scope(verify_settle='0.5 seconds')
    calls, release = [], threading.Event()

    def outside_call():
        if len(calls) == 1:
            release.wait(30)
    route = Route(s, calls_out=True, lease='1 second', lookup=lambda provider_key: None)
    post = _slow_call_service(kind, dbname, route, calls, outside_call)
    first = {}
    worker = threading.Thread(target=lambda: first.update(answer=post('pay-1')))
    worker.start()
    try:
        wait_for('the first call to be in flight', lambda: len(calls) == 1)
        lease_end = one(db, "SELECT lease_expires_at FROM idempo.lookup(%s, 'pay-1')", [s])
        assert lease_end is not None
        # the lease as claimed, and verify_settle after it, have passed while the call runs
        wait_for('the first lease and verify_settle to pass', lambda: one(
            db, "SELECT idempo.now() > %s::timestamptz + interval '0.6 seconds'", [lease_end]))
        status, headers, body = post('pay-1')
        assert status == 409, f'the retry answered {status} {body!r}: attempts called {calls}'
        assert json.loads(body)['code'] == 'key-in-use' and int(headers['retry-after']) >= 1
        assert calls == [1]
    finally:
        release.set()
        worker.join(30)
    assert first['answer'][0] == 201 and json.loads(first['answer'][2]) == {'attempt': 1}
    status, headers, body = post('pay-1')
    assert (status, headers.get('idempotent-replayed'), json.loads(body)) == (201, 'true', {'attempt': 1})
    assert calls == [1] and status_of(db, s, 'pay-1') == 'succeeded'


def test_a_lookup_that_fails_answers_503_and_holds_the_key_only_for_the_lookup_lease(dbname, db, scope):
    """A route's lookup that raises (the other system down): the request is answered 503
    lookup-failed with Retry-After, nothing decided, and the verification lease it took is the
    route's short lookup_lease, not the scope's hour: the verifier job's claim (and the next
    retry) gets the key once that ran out.  (Before: a bare 500, and the key locked out for the
    scope's lease.)"""
    from idempo.http import Reply, Route
    s = scope(lease='1 hour')
    down, charges = [True], []

    def lookup(provider_key):
        if down[0]:
            raise ConnectionRefusedError('the other system is down')
        return Reply(200, [('content-type', 'application/json')], b'{"charged": "as found"}')
    route = Route(s, calls_out=True, lookup=lookup)
    route.lookup_lease = 1
    post = _lost_reply_service(dbname, route, charges)
    charges.append('the first call, whose service died')          # the service's next call is not the first
    # a service that died mid-call: its claim's lease runs out
    db.execute("SELECT idempo.claim(%s, 'pay-1', params => jsonb_build_object('method', 'POST', 'path', '/pay', "
               "'json', '{}'::jsonb), lease => '0.2 seconds')", [s])
    _until_unknown(db, s, 'pay-1')
    status, headers, answer = post('pay-1')
    assert (status, answer['code'], headers['retry-after']) == ('503', 'lookup-failed', '1')
    assert status_of(db, s, 'pay-1') == 'unknown'
    assert one(db, "SELECT lease_expires_at <= idempo.now() + interval '1 second' "
                   "FROM idempo.lookup(%s, 'pay-1')", [s]), 'the verification lease is not the lookup_lease'
    status, headers, answer = post('pay-1')                 # the lookup lease runs
    assert (status, answer['code']) == ('409', 'key-in-use')
    wait_for('the lookup lease to run out', lambda: one(
        db, "SELECT lease_expires_at IS NULL OR lease_expires_at <= idempo.now() FROM idempo.lookup(%s, 'pay-1')", [s]))
    assert one(db, "SELECT outcome::text FROM idempo.claim(%s, 'pay-1', params => NULL)", [s]) == 'unknown'
    db.execute("SELECT idempo.verify(%s, 'pay-1', 1, found => true, result => %s::jsonb)",
               [s, json.dumps({'status': 200, 'headers': [], 'body': '{"charged": "by the verifier"}'})])
    assert post('pay-1')[:3:2] == ('200', {'charged': 'by the verifier'})
    assert charges == ['the first call, whose service died']


def test_tenant_and_key_cannot_be_shifted_into_each_other():
    # tenant "acme" with key "eu/x" and tenant "acme/eu" with key "x" are two clients' keys: the
    # same idempo key would replay one client's reply to the other
    from idempo.http import Route, key_of, parse_request

    def key(tenant, k=None, body=None, fields=None):
        route = Route('s', tenant=lambda _: tenant, key_header=None if fields else 'Idempotency-Key',
                      key_fields=fields)
        headers = [('content-type', 'application/json')] + ([('idempotency-key', k)] if k else [])
        return key_of(route, parse_request(route, 'POST', '/p', headers, json.dumps(body or {}).encode()))
    assert key('acme', 'eu/x') != key('acme/eu', 'x')
    assert key('acme', '%2Fx') != key('acme/', 'x')
    assert key('acme', 'k-1') == 'acme/k-1'                     # unchanged for the usual tenant
    assert key('t', body={'a': 'x/y', 'b': 'z'}, fields=['a', 'b']) != key('t', body={'a': 'x', 'b': 'y/z'},
                                                                          fields=['a', 'b'])


def test_wsgi_chunked_body_is_read_and_fingerprinted(dbname, db, scope):
    # a chunked request has no Content-Length; the server marks the stream terminated
    import io
    from idempo.wsgi import IdempotencyMiddleware, connect
    from idempo.http import Route
    s = scope()

    def app(environ, start_response):
        start_response('201 Created', [('content-type', 'text/plain')])
        return [b'got %d bytes' % len(environ['wsgi.input'].read())]
    mw = IdempotencyMiddleware(app, routes={'/p': Route(s)}, connection=connect(dbname=dbname))

    def post(body, key='c-1'):
        got = {}
        environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/p', 'CONTENT_TYPE': 'application/json',
                   'HTTP_IDEMPOTENCY_KEY': key, 'wsgi.input': io.BytesIO(body), 'wsgi.input_terminated': True}
        out = b''.join(mw(environ, lambda status, headers: got.update(status=status)))
        return got['status'], out
    assert post(b'{"qty": 1}') == ('201 Created', b'got 10 bytes')
    assert post(b'{"qty": 2}')[0].startswith('422')        # another body under the same key


def test_a_route_with_path_parameters_is_protected(dbname, db, scope):
    # routes={'/orders/{order_id}/refund': ...}, written as the framework writes the endpoint,
    # was compared as an exact path: /orders/7/refund was silently not protected (no key needed,
    # nothing stored)
    import io
    from idempo.http import Route, Routes
    from idempo.wsgi import IdempotencyMiddleware, connect
    s = scope()
    routes = Routes({'/orders/{order_id}/refund': Route(s), '/carts/<int:cart_id>/checkout': Route(s),
                     '/files/{name:path}': Route(s), '/orders': Route(s)})
    assert routes.match('POST', '/orders/7/refund').scope == s
    assert routes.match('POST', '/carts/12/checkout?x=1').scope == s
    assert routes.match('POST', '/files/a/b.txt').scope == s
    assert routes.match('POST', '/orders').scope == s
    assert routes.match('POST', '/files/').scope == s     # as Starlette's {p:path} (Flask's <path:p> not)
    for path in ('/orders/7', '/orders//refund', '/orders/7/refund/x', '/carts/12/checkout/', '/order'):
        assert routes.match('POST', path) is None, path
    assert routes.match('GET', '/orders/7/refund') is None

    def app(environ, start_response):
        start_response('201 Created', [('content-type', 'text/plain')])
        return [environ['PATH_INFO'].encode()]
    mw = IdempotencyMiddleware(app, routes=routes, connection=connect(dbname=dbname))

    def post(path, key):
        got = {}
        environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': path, 'CONTENT_TYPE': 'application/json',
                   'CONTENT_LENGTH': '2', 'wsgi.input': io.BytesIO(b'{}'),
                   **({'HTTP_IDEMPOTENCY_KEY': key} if key else {})}
        b''.join(mw(environ, lambda status, headers: got.update(status=status)))
        return got['status'][:3]
    assert post('/orders/7/refund', None) == '400'
    assert post('/orders/7/refund', 'r-1') == '201'
    assert one(db, 'SELECT status::text FROM idempo.lookup(%s, %s)', [s, 'r-1']) == 'succeeded'
    assert post('/orders/8/refund', 'r-1') == '422'      # the path is in the fingerprint


def test_a_401_or_403_is_not_stored(dbname, db, scope):
    # They answer for the caller, not the operation: a login that had expired, Django's CSRF
    # check (inside the middleware, like any view).  Stored, the same request under the same key
    # got the 403 back for as long as the record was kept, the caller's credentials mended.
    import io
    from idempo.http import store_default
    from idempo.wsgi import IdempotencyMiddleware, connect
    from idempo.http import Route
    assert [store_default(status) for status in (401, 403)] == [False, False]
    assert [store_default(status) for status in (200, 201, 302, 402, 404, 410)] == [True] * 6
    s, answers = scope(), ['403 Forbidden', '401 Unauthorized', '201 Created']

    def app(environ, start_response):
        start_response(answers.pop(0), [('content-type', 'text/plain')])
        return [b'']
    mw = IdempotencyMiddleware(app, routes={'/orders': Route(s)}, connection=connect(dbname=dbname))

    def post():
        got = {}
        environ = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/orders', 'CONTENT_TYPE': 'application/json',
                   'CONTENT_LENGTH': '2', 'wsgi.input': io.BytesIO(b'{}'), 'HTTP_IDEMPOTENCY_KEY': 'login-1'}
        b''.join(mw(environ, lambda status, headers: got.update(status=status)))
        return got['status']
    assert [post(), post(), post(), post()] == ['403 Forbidden', '401 Unauthorized', '201 Created', '201 Created']


def test_per_client_headers_are_not_stored_unless_kept():
    # a replay goes to whoever presents the key: a stored Set-Cookie would hand one client's
    # session to another (review)
    from idempo.http import Reply, Route
    reply = Reply(201, [('content-type', 'application/json'), ('set-cookie', 'sid=1'), ('set-cookie', 'b=2'),
                        ('authentication-info', 'x'), ('location', '/orders/1')], b'{}')
    assert reply.stored()['headers'] == [['content-type', 'application/json'], ['location', '/orders/1']]
    assert Route('s').keep_headers == ()
    kept = reply.stored(('Set-Cookie',))['headers']
    assert kept == [['content-type', 'application/json'], ['set-cookie', 'sid=1'], ['set-cookie', 'b=2'],
                    ['location', '/orders/1']]


def test_key_derivation_matches_the_shared_vectors():
    # clients/key-vectors.json: the Node middleware reads the same list (a service in either
    # language must store the same key for the same request)
    import os
    from idempo.http import Refusal, Route, key_of, parse_request
    path = os.environ.get('IDEMPO_KEY_VECTORS') or os.path.join(os.path.dirname(__file__), '..', '..', 'key-vectors.json')
    with open(path) as f:
        vectors = json.load(f)['vectors']
    assert len(vectors) > 10
    for v in vectors:
        fields = v.get('fields')
        route = Route('s', tenant=(lambda _, t=v['tenant']: t) if 'tenant' in v else None,
                      key_header=None if fields else 'Idempotency-Key', key_fields=fields)
        headers = [('content-type', 'application/json')] + ([('idempotency-key', v['header'])] if 'header' in v else [])
        try:
            got = key_of(route, parse_request(route, 'POST', '/p', headers, json.dumps(v.get('body', {})).encode()))
        except Refusal as refusal:
            assert v['key'] is None and refusal.reply.status == v['status'], v
            assert 'problem' not in v or json.loads(refusal.reply.body)['code'] == v['problem'], (v, refusal.reply.body)
        else:
            assert got == v['key'], v


def test_an_unknown_on_error_is_refused():
    """A misspelt on_error ('retyr') is refused when the route is made, not run as 'doubt'."""
    from idempo.http import Route
    with pytest.raises(ValueError, match="on_error must be 'doubt' or 'retry'"):
        Route('s', calls_out=True, on_error='retyr')
    assert Route('s', calls_out=True, on_error='retry').on_error == 'retry'


def test_routes_match_as_the_framework_routes():
    # The framework routes a request to the first endpoint whose path AND method match; Routes
    # took the first path that matched and gave up when its methods did not, so PUT /orders/bulk
    # (an exact POST route) never reached the PUT template that the framework ran: unprotected.
    # A path written as Django's path() writes it ('orders/<int:id>/refund', no leading '/')
    # matched no request at all; Starlette's {p:path} matches an empty rest too.
    import pytest
    from idempo.http import Route, Routes
    routes = Routes({'/orders/bulk': Route('s.bulk'), '/orders/{order_id}': Route('s.update', methods=('PUT',)),
                     '/items/{a}/{b}': Route('s.get', methods=('DELETE',)),
                     '/items/{a}/<b>': Route('s.put', methods=('PATCH',)), '/files/{p:path}': Route('s.files')})
    assert routes.match('POST', '/orders/bulk').scope == 's.bulk'
    assert routes.match('PUT', '/orders/bulk').scope == 's.update'
    assert routes.match('PUT', '/orders/7').scope == 's.update'
    assert routes.match('PATCH', '/items/1/2').scope == 's.put'
    assert routes.match('POST', '/files/').scope == 's.files'
    assert routes.match('POST', '/files/a/b').scope == 's.files'
    assert Routes({'/dl/<path:p>': Route('s')}).match('POST', '/dl/') is None     # Flask's is not empty
    # an int or uuid converter takes what the framework's takes: /orders/abc is another endpoint's
    typed = Routes({'/o/<int:id>': Route('s.int'), '/o/{id:int}/x': Route('s.int'), '/u/<uuid:u>': Route('s.uuid')})
    assert typed.match('POST', '/o/12').scope == 's.int' and typed.match('POST', '/o/12/x').scope == 's.int'
    assert typed.match('POST', '/o/abc') is None and typed.match('POST', '/o/abc/x') is None
    assert typed.match('POST', '/u/8e03978e-40d5-43e8-bc93-6894a57f9324').scope == 's.uuid'
    assert typed.match('POST', '/u/latest') is None
    # methods as a str (a Sequence[str] to a type checker) or in lower case matched no request
    assert Routes({'/pay': Route('s.pay', methods='POST')}).match('POST', '/pay').scope == 's.pay'
    assert Routes({'/pay/{id}': Route('s.pay', methods=('put',))}).match('PUT', '/pay/1').scope == 's.pay'
    for path in ('orders/<int:order_id>/refund', 'orders', ''):
        with pytest.raises(ValueError, match=r"starts with '/'"):
            Routes({path: Route('s')})


def test_asgi_routes_on_the_path_without_its_root_path():
    # uvicorn >= 0.26 --root-path /api: scope['path'] is '/api/orders' (the ASGI spec), and
    # Starlette routes on it without the root path.  The middleware matched scope['path'] as it
    # is: no route, the request passed through with no key asked for.
    import asyncio
    from idempo.asgi import IdempotencyMiddleware
    from idempo.http import Route
    ran = []

    async def app(scope, receive, send):
        ran.append(scope['path'])
        await send({'type': 'http.response.start', 'status': 201, 'headers': []})
        await send({'type': 'http.response.body', 'body': b''})
    mw = IdempotencyMiddleware(app, routes={'/orders': Route('s')}, connection=None)

    def post(path, root_path):
        sent = []

        async def receive():
            return {'type': 'http.request', 'body': b'{}', 'more_body': False}

        async def send(message):
            sent.append(message)
        scope = {'type': 'http', 'method': 'POST', 'path': path, 'root_path': root_path, 'query_string': b'',
                 'headers': [(b'content-type', b'application/json')]}
        asyncio.run(mw(scope, receive, send))
        return sent[0]['status']
    assert post('/api/orders', '/api') == 400          # matched: no key, refused
    assert post('/orders', '/api') == 400              # a server that strips it (uvicorn < 0.26)
    assert post('/api/ordersx', '/api') == 201 and post('/apix/orders', '/api') == 201
    assert ran == ['/api/ordersx', '/apix/orders']


def test_flask_mounted_app_view_that_ran_is_not_taken_for_a_refusal(dbname, db, scope):
    """idempo.flask marks the view started in *its* app's dispatch_request.  A second Flask app
    mounted under the first (werkzeug's DispatcherMiddleware, applied before Idempotency) serves
    /api/pay: its view runs and calls the provider, which answers 502 (not stored).  The view
    ran, so with on_error='doubt' the attempt must be left to its lease: freed, the retry
    charges a second time."""
    flask = pytest.importorskip('flask')
    from werkzeug.middleware.dispatcher import DispatcherMiddleware
    from idempo.flask import Idempotency
    from idempo.http import Route
    from idempo.wsgi import connect
    s = scope()
    charges = []
    api = flask.Flask('api')

    @api.post('/pay')
    def pay():
        charges.append(1)                               # the provider charged, then failed
        return flask.jsonify({'error': 'the provider timed out'}), 502

    main = flask.Flask('main')
    main.wsgi_app = DispatcherMiddleware(main.wsgi_app, {'/api': api})
    Idempotency(main, routes={'/api/pay': Route(s, calls_out=True)}, connection=connect(dbname=dbname))
    client = main.test_client()
    key = new_key()
    assert client.post('/api/pay', json={}, headers={'Idempotency-Key': key}).status_code == 502
    assert status_of(db, s, key) == 'in_progress'
    assert client.post('/api/pay', json={}, headers={'Idempotency-Key': key}).status_code == 409
    assert charges == [1]
