#!/usr/bin/env python3
"""Tests for server.py (the idempo library's WSGI middleware) over real HTTP on loopback, against a real database (PGHOST, PGPORT,
PGDATABASE, PGUSER; schema.sql loaded).  Starts the service as a child process and a stand-in
payment provider (a small HTTP server that honours Idempotency-Key, as real ones do).
Prints "ok - ..." / "not ok - ..." per case and, last, "N passed, N failed".
"""
import atexit
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

from idempo.http import RequestInfo, params_args, params_sql

HERE = os.path.dirname(os.path.abspath(__file__))
results = {'passed': 0, 'failed': 0}


def check(name, fn):
    try:
        fn()
        results['passed'] += 1
        print(f'ok - {name}')
    except Exception:
        results['failed'] += 1
        print(f'not ok - {name}\n  ' + traceback.format_exc().replace('\n', '\n  '))


def wait_for(what, condition, timeout=10):
    """Polls a condition instead of sleeping and hoping."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out waiting for {what}')
        time.sleep(0.02)


class Provider:
    """The outside system of POST /payments.  close_gate() holds calls; fail_next answers 503."""

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
                    pass                # the caller died meanwhile: its reply is lost

            def log_message(self, format, *args):
                pass

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'


def start_service(provider_url):
    """Starts server.py; returns the process and its port once it prints "listening on ..."."""
    child = subprocess.Popen([sys.executable, '-u', os.path.join(HERE, 'server.py')], stdout=subprocess.PIPE,
                             env={**os.environ, 'PROVIDER_URL': provider_url, 'HTTP_PORT': '0'}, text=True)
    line = child.stdout.readline()           # the service prints this line first, or exits
    if not line.startswith('listening on http://127.0.0.1:'):
        child.kill()
        raise RuntimeError(f'the service did not start: {line!r}')
    return child, int(line.rsplit(':', 1)[1])


def start_broken(env):
    """Starts server.py with env changed; -> (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, '-u', os.path.join(HERE, 'server.py')], capture_output=True, text=True,
                       env={**os.environ, 'HTTP_PORT': '0', **env}, timeout=15)
    return r.returncode, r.stdout, r.stderr


def main():
    def no_database():
        code, out, err = start_broken({'PGHOST': '/nonexistent-socket-dir'})
        assert code == 1 and 'listening' not in out, (code, out)
        assert err.startswith('cannot use the database (host=/nonexistent-socket-dir '), err
    check('start-up with no database at PGHOST: exits 1 at once, saying where it tried', no_database)

    def no_schema():
        code, out, err = start_broken({'PGDATABASE': 'postgres'})
        assert code == 1 and 'listening' not in out, (code, out)
        # PostgreSQL 15 names the missing schema, 17 and later the relation
        assert ('schema "shop" does not exist' in err or 'relation "shop.orders" does not exist' in err) \
            and 'load schema.sql' in err, err
    check('start-up against a database without schema.sql: exits 1, naming what is missing', no_schema)

    db = psycopg.connect(autocommit=True)
    provider = Provider()
    service = {}
    service['process'], service['port'] = start_service(provider.url)
    atexit.register(lambda: service['process'].kill())      # never leave the service behind

    def one(sql, args=()):
        row = db.execute(sql, args).fetchone()
        return row[0] if row else None

    def post(target, body, key=None, content_type='application/json'):
        """POST over a fresh connection; key may be a list (several headers).  -> (status, headers, body)"""
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        conn = http.client.HTTPConnection('127.0.0.1', service['port'], timeout=30)
        try:
            conn.putrequest('POST', target)
            conn.putheader('Content-Type', content_type)
            conn.putheader('Content-Length', str(len(data)))
            for k in ([] if key is None else key if isinstance(key, list) else [key]):
                conn.putheader('Idempotency-Key', k)
            conn.endheaders(data)
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
        finally:
            conn.close()

    def orders_of(customer):
        return one('SELECT count(*) FROM shop.orders WHERE customer = %s', [customer])

    def status_of(scope, key):
        return one('SELECT status::text FROM idempo.lookup(%s, %s)', [scope, key])

    def payments_of(order_id):
        return one('SELECT count(*) FROM shop.payments WHERE order_id = %s', [order_id])

    def new_key():
        return str(uuid.uuid4())

    def simulated_failure(table, condition):
        db.execute("CREATE FUNCTION shop.simulated_failure() RETURNS trigger LANGUAGE plpgsql "
                   "AS $$BEGIN RAISE EXCEPTION 'simulated failure'; END$$")
        db.execute(f'CREATE TRIGGER simulated_failure BEFORE INSERT ON shop.{table} FOR EACH ROW '
                   f'WHEN ({condition}) EXECUTE FUNCTION shop.simulated_failure()')

    def end_simulated_failure():
        db.execute('DROP FUNCTION shop.simulated_failure() CASCADE')

    key = new_key()
    order = {'customer': 'ada', 'sku': 'A-7', 'qty': 2}
    first = {}

    def first_post():
        status, headers, body = post('/orders', order, key)
        first.update(headers=headers, body=body)
        assert status == 201, status
        assert {**json.loads(body), 'id': None} == {**order, 'id': None}, body
        assert type(json.loads(body)['id']) is int, body      # a JSON number, as in the Node service
        assert 'location' not in headers                       # there is no GET /orders/{id}
        assert 'idempotent-replayed' not in headers
    check('first POST /orders: 201 with the order, not marked as replayed', first_post)

    def retry_replays():
        status, headers, body = post('/orders', '{ "qty": 2.0, "sku": "A-7",\n  "customer": "ada" }', key)
        assert (status, body) == (201, first['body']), (status, body)
        assert headers['idempotent-replayed'] == 'true'
        assert orders_of('ada') == 1
    check('retry, same body reordered and reformatted: same status and body, Idempotent-Replayed, one order',
          retry_replays)

    def quoted_key():
        status, headers, _ = post('/orders', order, f'"{key}"')
        assert status == 201 and headers['idempotent-replayed'] == 'true', status
    check('the draft\'s quoted form "key" names the same key as the bare form', quoted_key)

    def conflict():
        status, headers, _ = post('/orders', {**order, 'qty': 5}, key)
        assert status == 422, status
        assert headers['content-type'] == 'application/problem+json'
        assert one("SELECT count(*) FROM idempo.conflicts WHERE scope = 'http.orders' AND key = %s", [key]) == 1
        assert orders_of('ada') == 1
    check('same key, different body: 422, conflict recorded, still one order', conflict)

    check('same key and body on another path (a query string): 422',
          lambda: expect(post('/orders?coupon=x', order, key)[0], 422))

    def missing_key():
        status, _, body = post('/orders', {'customer': 'nokey', 'sku': 'A-7', 'qty': 1})
        assert status == 400 and json.loads(body)['type'].endswith('#missing-key'), (status, body)
        assert orders_of('nokey') == 0
    check('missing key: 400, nothing written', missing_key)

    def malformed_keys():
        body = {'customer': 'badkey', 'sku': 'A-7', 'qty': 1}
        for bad in ['k' * 256, '', '""', 'kéy', '"unterminated', [new_key(), new_key()]]:
            assert post('/orders', body, bad)[0] == 400, bad
        expect(post('/orders', body, 'k' * 255)[0], 201)
    check('malformed keys (too long, empty, non-ASCII, bad quoting, two headers): 400', malformed_keys)

    def invalid_requests():
        k = new_key()
        expect(post('/orders', '{"customer": "bo",', k)[0], 400)
        expect(post('/orders', 'customer=bo', k, content_type='text/plain')[0], 415)
        expect(post('/orders', {'customer': 'bo', 'sku': 'A-7', 'qty': 0}, k)[0], 400)
        expect(post('/orders', r'{"customer": "bo\u0000", "sku": "A-7", "qty": 1}', k)[0], 400)   # jsonb refuses it
        assert status_of('http.orders', k) is None
        expect(post('/orders', {'customer': 'bo', 'sku': 'A-7', 'qty': 1}, k)[0], 201)
    check('invalid requests (bad JSON, \\u0000, text/plain, bad order) are refused before the claim: the key stays unused',
          invalid_requests)

    def busy_in_transaction():
        k = new_key()
        body = {'customer': 'cy', 'sku': 'A-7', 'qty': 1}
        with psycopg.connect() as locker, ThreadPoolExecutor(1) as pool:
            locker.execute('LOCK TABLE shop.orders IN SHARE MODE')     # the first request's INSERT waits
            first_call = pool.submit(post, '/orders', body, k)
            wait_for('the first request to wait inside its transaction', lambda: one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempo-http-python' "
                "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO shop.orders%%'") == 1)
            status, headers, _ = post('/orders', body, k)
            assert status == 409 and headers['retry-after'] == '1', status
            locker.commit()
            expect(first_call.result()[0], 201)
        status, headers, _ = post('/orders', body, k)
        assert status == 201 and headers['idempotent-replayed'] == 'true', status
        assert orders_of('cy') == 1
    check('a retry while the first request is still in its transaction: 409, then the first commits once',
          busy_in_transaction)

    def handler_error_one_transaction():
        k = new_key()
        body = {'customer': 'dee', 'sku': 'A-7', 'qty': 1}
        simulated_failure('orders', "NEW.customer = 'dee'")
        try:
            expect(post('/orders', body, k)[0], 500)
            assert status_of('http.orders', k) is None
        finally:
            end_simulated_failure()
        status, headers, _ = post('/orders', body, k)
        assert status == 201 and 'idempotent-replayed' not in headers, status
        assert orders_of('dee') == 1
    check('a handler error rolls the claim back with the transaction: 500, key free, the retry creates one order',
          handler_error_one_transaction)

    def provider_key(k):
        return f'http.payments/{k}'

    def payment_replays():
        k = new_key()
        body = {'order_id': 101, 'amount_cents': 1250}
        status, headers, paid = post('/payments', body, k)
        assert status == 201, status
        assert {**json.loads(paid), 'id': 0, 'charge_id': ''} == {**body, 'id': 0, 'charge_id': ''}, paid
        assert type(json.loads(paid)['id']) is int and 'location' not in headers, (paid, headers)
        status, headers, again = post('/payments', body, k)
        assert (status, again, headers['idempotent-replayed']) == (201, paid, 'true')
        assert provider.calls[provider_key(k)] == 1
        assert payments_of(101) == 1
    check('two transactions, POST /payments: 201, a retry replays, one charge and one payment', payment_replays)

    def busy_during_call():
        k = new_key()
        body = {'order_id': 102, 'amount_cents': 990}
        provider.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            try:
                first_call = pool.submit(post, '/payments', body, k)
                wait_for('the provider call to be in flight', lambda: provider.waiting == 1)
                assert status_of('http.payments', k) == 'in_progress'
                expect(post('/payments', body, k)[0], 409)
                expect(post('/payments', {**body, 'amount_cents': 1}, k)[0], 422)
            finally:
                provider.gate.set()
            expect(first_call.result()[0], 201)
        assert post('/payments', body, k)[1]['idempotent-replayed'] == 'true'
        assert payments_of(102) == 1
    check('a retry while the provider call is in flight (committed claim, live lease): 409', busy_during_call)

    def provider_fails():
        k = new_key()
        body = {'order_id': 103, 'amount_cents': 500}
        provider.fail_next = 1
        expect(post('/payments', body, k)[0], 502)
        assert status_of('http.payments', k) == 'retryable'
        assert payments_of(103) == 0
        expect(post('/payments', body, k)[0], 201)
        assert one("SELECT attempt FROM idempo.lookup('http.payments', %s)", [k]) == 2
        assert payments_of(103) == 1
    check('the provider fails: 502, fail(retryable) frees the key, the retry succeeds as attempt 2', provider_fails)

    def attempts_exhausted():
        k = new_key()
        body = {'order_id': 106, 'amount_cents': 300}
        provider.fail_next = 5
        for attempt in range(1, 6):
            assert post('/payments', body, k)[0] == 502, attempt
        status, _, stuck = post('/payments', body, k)
        assert status == 409 and json.loads(stuck)['type'].endswith('#key-in-review'), (status, stuck)
        assert status_of('http.payments', k) == 'in_review'
        assert payments_of(106) == 0
    check('the provider fails max_attempts (5) times: the key goes to review, 409 from then on', attempts_exhausted)

    def error_after_call():
        k = new_key()
        body = {'order_id': 104, 'amount_cents': 4242}
        simulated_failure('payments', 'NEW.order_id = 104')
        try:
            expect(post('/payments', body, k)[0], 500)
            assert status_of('http.payments', k) == 'retryable'
        finally:
            end_simulated_failure()
        status, _, retry = post('/payments', body, k)
        assert status == 201, status
        assert json.loads(retry)['charge_id'] == provider.charges[provider_key(k)]['id']
        assert provider.calls[provider_key(k)] == 2
        assert payments_of(104) == 1
    check('an error after the provider call: 500, fail(retryable); the retry gets the same charge, one payment',
          error_after_call)

    def service_dies():
        k = new_key()
        body = {'order_id': 105, 'amount_cents': 700}
        db.execute("SELECT idempo.alter_scope('http.payments', lease => '1 second')")   # for this claim
        provider.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            try:
                doomed = pool.submit(post, '/payments', body, k)
                wait_for('the provider call to be in flight', lambda: provider.waiting == 1)
                service['process'].kill()
                service['process'].wait(10)
                assert isinstance(doomed.exception(10), ConnectionError)    # the client got no answer
                service['process'], service['port'] = start_service(provider.url)
            finally:
                provider.gate.set()                         # the provider charges: the reply is lost
                db.execute("SELECT idempo.alter_scope('http.payments', lease => '30 seconds')")
        # (the background worker may already have taken the expired lease: retryable, no lease)
        wait_for('the lease to run out', lambda: one(
            "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() "
            "FROM idempo.lookup('http.payments', %s)", [k]))
        # A client retries a 409 "in use" after its Retry-After: the background worker may hold the
        # record for a moment while it moves the expired lease on (the claim does not wait).
        for _ in range(10):
            status, headers, retry = post('/payments', body, k)
            if status != 409 or not json.loads(retry)['type'].endswith('#key-in-use'):
                break
            time.sleep(int(headers['retry-after']))
        assert status == 201, (status, retry, one("SELECT row_to_json(o)::text FROM idempo.lookup('http.payments', %s) o", [k]))
        assert one("SELECT attempt FROM idempo.lookup('http.payments', %s)", [k]) == 2
        assert json.loads(retry)['charge_id'] == provider.charges[provider_key(k)]['id']
        assert provider.calls[provider_key(k)] == 2
        assert payments_of(105) == 1
    check('the service dies during the provider call: after the lease the retry takes over as attempt 2, one payment',
          service_dies)

    def fingerprints():
        def fingerprint(body, media_type):
            is_json = media_type == 'application/json'
            request = RequestInfo('POST', '/x', [], body.encode(), media_type, json.loads(body) if is_json else None,
                                  is_json)
            return one(f"SELECT encode(idempo.fingerprint({params_sql(request)}), 'hex')", params_args(request))
        assert fingerprint('{"a":1,"b":[1,2]}', 'application/json') == \
            fingerprint('{ "b": [1, 2.0], "a": 1.00 }', 'application/json')
        assert fingerprint('{"n":0.10000000000000000001}', 'application/json') != \
            fingerprint('{"n":0.10000000000000000002}', 'application/json')
        assert fingerprint('a=1', 'text/plain') != fingerprint('a=2', 'text/plain')
        assert fingerprint('a=1', 'text/plain') != fingerprint('a=1', 'text/csv')
    check('fingerprint: a JSON body by value, any other body by its media type and bytes', fingerprints)

    service['process'].terminate()
    service['process'].wait(10)
    provider.server.shutdown()
    db.close()
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results['failed'] else 0


def expect(actual, expected):
    assert actual == expected, f'got {actual}, expected {expected}'


if __name__ == '__main__':
    try:
        sys.exit(main())
    except Exception:
        print('not ok - the test setup\n  ' + traceback.format_exc().replace('\n', '\n  '))
        print(f"{results['passed']} passed, {results['failed'] + 1} failed")
        sys.exit(1)
